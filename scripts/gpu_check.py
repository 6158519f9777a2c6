#!/usr/bin/env python
"""Check and time every GPU kernel family on this machine in one call.

    python scripts/gpu_check.py                 # a GPU: 2 and 4 ranks sharing cuda:0 (MPS)
    python scripts/gpu_check.py --interpret     # the CPU dry run (Triton interpreter)

The phases, their budgets and the record format: ``tilecomm.bench.gpucheck``. Writes
``gpu_check.json`` and ``gpu_check.txt`` to ``--out`` ($OUT, else ./gpu_check_out).
"""

import sys

from tilecomm.bench.gpucheck import main

if __name__ == "__main__":
    sys.exit(main())
