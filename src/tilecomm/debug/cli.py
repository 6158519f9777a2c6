"""``tilecomm trace``: read the flight records and traces the ranks wrote.

    tilecomm trace analyze DIR [--json]     which rank, which call, why (TILECOMM_DEBUG_DIR)
    tilecomm trace merge DIR -o FILE        one Chrome trace of every rank (TILECOMM_TRACE)
"""

from __future__ import annotations

import json


def add_trace_parser(sub) -> None:
    p = sub.add_parser("trace", help="explain a hang from the flight records; merge traces",
                       description="Read what the ranks wrote: flight records "
                                   "(TILECOMM_DEBUG_DIR) and Chrome traces (TILECOMM_TRACE).")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    a = tsub.add_parser("analyze", help="which rank is at fault, at which call, and why",
                        description="Merge DIR/flight-rank*.json, find the first call where "
                                    "the ranks diverge and name the ranks at fault.")
    a.add_argument("dir", help="the TILECOMM_DEBUG_DIR the ranks wrote to")
    a.add_argument("--json", action="store_true",
                   help="print one JSON object (culprits, op, seq, explanation, ...)")
    a.set_defaults(func=run_analyze)
    m = tsub.add_parser("merge", help="merge the ranks' traces into one Chrome trace",
                        description="Merge DIR/trace-rank*.json into one file (one process "
                                    "per rank, clocks aligned at the communicator's creation "
                                    "handshake) for Perfetto or chrome://tracing.")
    m.add_argument("dir", help="the TILECOMM_TRACE directory")
    m.add_argument("-o", "--output", required=True, help="the merged trace file to write")
    m.set_defaults(func=run_merge)


def run_analyze(args) -> int:
    from .analyze import analyze, report

    res = analyze(args.dir)
    print(json.dumps(res, indent=2) if args.json else report(res))
    return 0


def run_merge(args) -> int:
    from .trace import merge

    doc = merge(args.dir, args.output)
    ranks = doc["otherData"]["tilecomm_ranks"]
    n = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
    print(f"wrote {args.output}: {n} events from rank(s) {ranks}")
    unaligned = doc["otherData"]["unaligned"]
    if unaligned:
        print(f"note: rank(s) {unaligned} recorded no creation handshake; their clocks are "
              f"aligned at the start of their trace instead")
    return 0
