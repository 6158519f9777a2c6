#!/usr/bin/env bash
# Every CPU figure in docs/benchmarks.md, one command each, written to benchmarks/results/.
# Run on a quiet machine: bash benchmarks/run_all.sh  (about 35 minutes on 2 cores)
#
# Every timing is `tilecomm bench` (one harness: tilecomm and its baselines interleaved round
# by round in the same ranks; time = the median round of the slowest rank; x B = B's time /
# tilecomm's, above 1: tilecomm is faster; a row marked noisy had rounds more than 1.5x apart).
# The scripts left (compare_mpi.py, torch_backend.py, flight_overhead.py) say in their first
# lines why they are not bench lines; the hosts_*.py scripts need simulated hosts (namespaces)
# and are run by hand (docs/model.md, "Ranks on several hosts").
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
if command -v mpirun > /dev/null; then
  for w in 2 4; do
    python benchmarks/compare_mpi.py -n $w -b 16 -e 256M -f 4 --rounds 5 \
      --json $R/cpu_all_reduce_${w}ranks_vs_mpi_gloo.json > $R/cpu_all_reduce_${w}ranks_vs_mpi_gloo.txt
  done
else
  echo "run_all.sh: no mpirun here (apt-get install openmpi-bin python3-mpi4py): no MPI rows" >&2
fi
for op in all_gather reduce_scatter broadcast reduce all_to_all all_to_all_v send_recv; do
  tilecomm bench $op -n 2 -b 8 -e 64M -f 8 --vs gloo --check --rounds 5 \
    --json $R/cpu_${op}_2ranks_gloo.json > $R/cpu_${op}_2ranks_gloo.txt
done
# what the native runner buys: the executor's Python path as the baseline
tilecomm bench all_reduce -n 2 -b 8 -e 16M -f 8 --vs python --rounds 7 \
  --json $R/cpu_all_reduce_2ranks_native_vs_python.json > $R/cpu_all_reduce_2ranks_native_vs_python.txt
# what single-copy reads buy: every tensor staged through shared memory as the baseline
for op in broadcast all_gather all_to_all all_reduce; do
  tilecomm bench $op -n 2 -b 16K -e 64M -f 4 --vs staged --check --rounds 7 \
    --json $R/cpu_${op}_2ranks_single_copy.json > $R/cpu_${op}_2ranks_single_copy.txt
done
# the fused ops against the collective then the matmul, and the matmul alone
for dt in float32 bfloat16; do
  tilecomm bench ops -n 2 -d $dt --gemm 256x1024x1024,512x2048x2048 --rounds 21 \
    --json $R/cpu_ops_2ranks_${dt}.json > $R/cpu_ops_2ranks_${dt}.txt
done
# MoE dispatch/combine and KV-cache transfer, as docs/benchmarks.md runs them
tilecomm bench moe -n 2 --tokens 4096 --hidden 7168 --topk 8 --experts 64 \
  --json $R/moe_2ranks.json > $R/moe_2ranks.txt
tilecomm bench kv -n 2 --json $R/kv_2ranks.json > $R/kv_2ranks.txt
tilecomm bench kv -n 2 --fragmented --json $R/kv_2ranks_fragmented.json > $R/kv_2ranks_fragmented.txt
python benchmarks/torch_backend.py -n 2 -b 8 -e 64M -f 4 \
  --json $R/torch_backend_2ranks.json > $R/torch_backend_2ranks.txt
python benchmarks/flight_overhead.py --ranks 1 2 --calls 500 --repeats 201 \
  --json $R/flight_overhead.json > $R/flight_overhead.txt
