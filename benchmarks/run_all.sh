#!/usr/bin/env bash
# Every CPU figure in docs/benchmarks.md, one command each, written to benchmarks/results/.
# Run on a quiet machine: bash benchmarks/run_all.sh  (about 25 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
mkdir -p "$R"
for w in 2 4; do
  for mem in user heap; do
    tilecomm bench all_reduce -n $w -b 16 -e 256M -f 4 --algo all --mem $mem --rounds 5 \
      --json $R/cpu_all_reduce_${w}ranks_${mem}.json > $R/cpu_all_reduce_${w}ranks_${mem}.txt
  done
done
tilecomm bench all_reduce -n 2 -b 8 -e 8 --algo all --rounds 9 --iters 2000 \
  --json $R/cpu_all_reduce_2ranks_8B.json > $R/cpu_all_reduce_2ranks_8B.txt
for w in 2 4; do
  python benchmarks/compare_mpi.py -n $w -b 16 -e 256M -f 4 --rounds 5 \
    --json $R/cpu_all_reduce_${w}ranks_vs_mpi_gloo.json > $R/cpu_all_reduce_${w}ranks_vs_mpi_gloo.txt
done
for op in all_gather reduce_scatter broadcast reduce all_to_all all_to_all_v send_recv; do
  tilecomm bench $op -n 2 -b 8 -e 64M -f 8 --vs gloo --check --rounds 5 \
    --json $R/cpu_${op}_2ranks_gloo.json > $R/cpu_${op}_2ranks_gloo.txt
done
python benchmarks/torch_backend.py -n 2 -b 8 -e 64M -f 4 \
  --json $R/torch_backend_2ranks.json > $R/torch_backend_2ranks.txt
