#!/bin/bash
# Alternate the revision before per-chunk staging (ec99573) and this one: tilecomm bench on
# ordinary tensors, three rounds. Run from the repository root:
#   git worktree add /tmp/old ec99573 && OLD=/tmp/old benchmarks/results/staging_dec03d/ab_stage.sh
out=${OUT:-/tmp/abst}; mkdir -p "$out"
for round in 1 2 3; do
  for rev in old new; do
    src=$PWD/src; [ $rev = old ] && src=$OLD/src
    for op in reduce_scatter broadcast all_to_all; do
      for n in 2 4; do
        PYTHONPATH=$src python -m tilecomm.cli bench $op -n $n -b 64K -e 16M -f 16 \
          --json "$out/${op}_${n}_${rev}_${round}.json" > /dev/null 2>&1 || echo "failed: $op $n $rev"
      done
    done
  done
done
