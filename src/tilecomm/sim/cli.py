"""``tilecomm sim`` and ``tilecomm topo``: argparse subcommands the top-level CLI mounts.

    tilecomm sim all_reduce --system dgx-h100 --nodes 2 -b 1K -e 8G -f 2 --algo all \
        [--what-if] [--json out.json] [--plot out.png] [--measured nccl.log|bench.json]
    tilecomm sim moe --system dgx-h800 [--nodes N] --tokens 4096 --hidden 7168 --topk 8 \
        --experts 256 [--fp8] [--mode normal|low_latency] [--json out.json]
    tilecomm topo [--system dgx-h100 [--nodes N]]
"""

from __future__ import annotations

import argparse
import json
import sys

from tilecomm.algorithms import BUSBW_FACTOR

from ..units import format_size, parse_size, sizes


def add_sim_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sim", help="predict collective time per algorithm and size",
                              description="Predict time, algbw and busbw of each algorithm.")
    p.add_argument("collective", choices=["all_reduce", "all_gather", "reduce_scatter",
                                          "broadcast", "reduce", "all_to_all", "send_recv",
                                          "overlap", "moe"],
                   help="a collective, or 'overlap': fused GEMM + TP collective "
                        "(tilecomm.sim.overlap; --tp --m --k --n --dtype), or 'moe': MoE "
                        "dispatch/combine (tilecomm.sim.moe; --tokens --hidden --topk "
                        "--experts --fp8 --mode)")
    p.add_argument("--system", default="dgx-h100", help="preset name or system .json")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus", type=int, default=None, help="ranks per node (default: all)")
    p.add_argument("-b", "--minbytes", default="1K")
    p.add_argument("-e", "--maxbytes", default="1G")
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("--library", default="tilecomm", choices=["tilecomm", "nccl", "rccl"],
                   help="tilecomm: tilecomm's own algorithms; nccl: what NCCL measures in "
                        "nccl-tests (its tuner's algorithm/protocol choice, out-of-place time); "
                        "rccl: the same for RCCL/rccl-tests on AMD full-mesh nodes (mi300x, "
                        "mi325x, mi355x; tilecomm.sim.rcclsim)")
    p.add_argument("--sharp", action="store_true",
                   help="the fabric offers in-network reduction (SHARP): --library nccl adds "
                        "CollNet all_reduce across nodes")
    p.add_argument("--algo", default="all", help="algorithm name or 'all'")
    p.add_argument("--what-if", action="store_true",
                   help="--library tilecomm: also time what the model has but the runtime does "
                        "not run (NCCL's dbtree/nvls, bruck, the ring-based hierarchical, flat "
                        "schedules across nodes), labelled '(what-if)'")
    p.add_argument("--protocol", default=None, help="force one protocol of the system (e.g. Simple, LL128; any case)")
    p.add_argument("--engine", default="auto", choices=["auto", "events", "phases"])
    p.add_argument("--json", default=None, help="write predictions as JSON rows")
    p.add_argument("--plot", default=None, help="write a PNG (needs matplotlib)")
    p.add_argument("--measured", default=None, help="nccl-tests log or tilecomm bench JSON")
    p.add_argument("--fit", nargs="+", default=None, metavar="LOG",
                   help="nccl-tests logs of this system (e.g. 1-2 nodes, any collective): fit "
                        "its own parameters to them and predict --nodes from that fit "
                        "(--library nccl/rccl; docs/model.md, fit small, predict large)")
    p.add_argument("--mem", default="user", choices=["user", "heap"],
                   help="shared-memory systems: user tensors (staged) or comm.alloc (heap)")
    from .overlap import add_overlap_args
    add_overlap_args(p)
    from .moe import add_moe_args
    add_moe_args(p)
    p.set_defaults(func=run_sim)
    return p


def add_topo_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("topo", help="describe this machine or a preset system")
    p.add_argument("--system", default=None, help="preset name or .json (default: this machine)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--no-measure", action="store_true", help="skip the memory bandwidth test")
    p.set_defaults(func=run_topo)
    return p


# Algorithms NCCL itself runs (ring, tree, NVLS) under the names the model gives them: an
# nccl-tests row is compared with the model's best of these, as sim/calibrate.py does.
NCCL_ALGOS = ("ring", "dbtree", "nvls")
RING_1CH = "ring (1 channel)"
WHAT_IF = "what-if"


def _row_name(row: dict, ring_1ch: bool) -> str:
    """The algorithm as the table shows it: a what-if says so, so that no row reads as an
    ``algo=`` the runtime accepts when it is not one."""
    name = RING_1CH if ring_1ch and row["algo"] == "ring" else row["algo"]
    if row.get("what_if"):
        name = f"{name[:-1]}, {WHAT_IF})" if name.endswith(")") else f"{name} ({WHAT_IF})"
    return name


def _nccl_pick(preds) -> str:
    """The algorithm an nccl-tests row is compared with: the fastest NCCL also has."""
    have = [p for p in preds if p.algo in NCCL_ALGOS]
    return (have or preds)[0].algo


def _library_rows(args, topo, nbytes: int, prm, library: str) -> list[dict]:
    """``--library nccl|rccl``: every (algorithm, protocol) the library enables, its choice
    first, as the table and ``--json`` show them."""
    algos = None if args.algo == "all" else (args.algo.lower(),)
    if library == "rccl":
        from .rcclsim import PROTOS, arch, rccl_rows as timed_rows   # it checks --algo itself
        hint = f" (RCCL runs {', '.join(PROTOS)} on {arch(topo)})"
    else:
        from .ncclsim import nccl_rows as timed_rows
        hint = ""
        known = ("ring", "tree", "nvls", "nvls_tree", "pat", "collnet")
        if algos and algos[0] not in known:
            raise ValueError(f"--library nccl: --algo must be one of {', '.join(known)} or all")
    rows = timed_rows(args.collective, nbytes, topo, prm, algos)
    if args.protocol is not None:
        rows = [r for r in rows if r.protocol.lower() == args.protocol.lower()]
        if not rows:
            raise ValueError(f"--library {library}: no {args.protocol} protocol for that "
                             f"algorithm{hint}")
    return [{"library": library, "collective": r.collective, "algo": r.algo,
             "protocol": r.protocol, "nbytes": r.nbytes, "world_size": r.world_size,
             "time_us": r.time_us, "algbw_GBps": r.algbw_GBps, "busbw_GBps": r.busbw_GBps,
             "bottleneck": r.bound, "method": f"{library}-model", "tuner_us": r.tuner_us,
             "best": i == 0} for i, r in enumerate(rows)]


def prm_class(topo) -> str:
    from .ncclsim import TRANSPORT_CLASS
    return TRANSPORT_CLASS[topo.spec.fabric.transport]


def _fit_logs(args, spec, library: str, prm, bands):
    """``--fit LOG...``: the system's own parameters from its logs, the bands to use (those of
    fit-small-predict-large when the logs span nodes, else the leave-one-system-out ones), a
    note for the table, and whether the logs span nodes."""
    from .measured import parse_nccl_tests
    from .scalefit import fit_own, rows_of

    if library == "tilecomm":
        raise ValueError("--fit fits the library model: add --library nccl (or rccl)")
    rows = []
    for path in args.fit:
        try:
            with open(path) as f:
                ms = parse_nccl_tests(f.read(), source=path)
        except UnicodeDecodeError:
            raise ValueError(f"--fit {path}: not a text file (an nccl-tests log is text)") \
                from None
        if not ms:
            raise ValueError(f"--fit {path}: no nccl-tests table rows in the file")
        if any(m.collective == "unknown" for m in ms):
            raise ValueError(f"--fit {path}: cannot tell the collective (no '*_perf' line); "
                             "keep nccl-tests' header in the log")
        rows += rows_of(ms, spec, library, gpus_per_node=spec.gpus_per_node)
    own = fit_own(rows, prm)
    changed = [k for k, v in own.as_dict().items() if k != "net" and v != prm.as_dict()[k]]
    nodes = sorted({r.nodes for r in rows})
    note = (f"fitted on {len(rows)} rows of {len(args.fit)} log(s), "
            f"{'/'.join(map(str, nodes))} node(s): "
            + ", ".join(f"{k} {getattr(own, k):.3g}" for k in changed))
    if max(nodes) > 1:
        from tilecomm.topology import build
        topo = build(spec, max(nodes))
        net = own.net_of(topo)
        note += f"; network {prm_class(topo)} eff {net.eff:.3f}, +{net.lat_us:.1f} us/hop"
        from .crossval import load_scale_bands
        return own, load_scale_bands() or bands, note, True
    note += "; one node only: the network keeps its class values"
    return own, bands, note, False


def run_sim(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from tilecomm.topology import build

    from .api import predict, skipped
    from .measured import load_measurements
    from .offered import runtime_algorithms

    if args.collective == "overlap":
        from .overlap import run_overlap
        return run_overlap(args)
    if args.collective == "moe":
        from .moe import run_moe
        return run_moe(args)
    topo = build(args.system, args.nodes, args.gpus)   # validates --nodes / --gpus
    if getattr(args, "sharp", False):
        from dataclasses import replace
        spec = topo.spec.with_(fabric=replace(topo.spec.fabric, sharp=True))
        topo = build(spec, args.nodes, args.gpus)
    spec = topo.spec
    if args.protocol is not None and not (spec.shm is not None
                                          and args.protocol.lower() == "shm"):
        args.protocol = spec.protocol(args.protocol).name   # case-insensitive; lists valid ones
    grid = sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    rows = []
    nccl_pick = {}
    from .crossval import band_of, load_fit
    prm, bands = load_fit()
    library = getattr(args, "library", "tilecomm")
    fit_note, fit_multi = None, False
    if getattr(args, "fit", None):
        prm, bands, fit_note, fit_multi = _fit_logs(args, spec, library, prm, bands)
    # a fit on several nodes has measured the network; one on one node has not
    unseen_net = (library != "tilecomm" and topo.nodes > 1 and not fit_multi
                  and (not prm.net_fitted(prm_class(topo)) or not spec.fabric.transport))
    what_if = getattr(args, "what_if", False)
    if what_if and library != "tilecomm":
        raise ValueError("--what-if applies to --library tilecomm (--library nccl rows are "
                         "NCCL's own algorithms)")
    for n in grid:
        if library in ("nccl", "rccl"):
            nrows = _library_rows(args, topo, n, prm, library)
            nccl_pick[n] = nrows[0]["algo"]
            rows += nrows
            continue
        preds = predict(args.collective, n, system=spec, nodes=args.nodes,
                        gpus=topo.gpus, algo=args.algo, protocol=args.protocol,
                        engine=args.engine, mem=args.mem, what_if=what_if)
        if not preds:       # every algorithm too large to simulate: the footer says which
            continue
        nccl_pick[n] = _nccl_pick(preds)
        for i, p in enumerate(preds):
            rows.append({"library": "tilecomm", **p.as_dict(), "best": i == 0})
    for r in rows:
        lo, hi = band_of(r["time_us"], r["nbytes"], bands, unseen_net)
        r["low_us"], r["high_us"] = lo, hi
        r["band_source"] = (("fit-small-predict-large errors on published multi-scale sweeps"
                             if fit_multi else "leave-one-system-out residuals of the nccl "
                             "model" + ((", widened: no published system of this network class"
                                         if spec.fabric.transport else ", widened: the system "
                                         "description does not say its fabric.transport")
                                        if unseen_net else ""))
                            + ", sim/data/nccl_fit.json" if bands else "none (no fit file)")
    w = topo.world_size
    con = Console(width=max(Console().width, 130))  # never truncate algorithm names
    warnings = []
    measured = []
    if args.measured:
        factor = BUSBW_FACTOR.get(args.collective, lambda n: 1.0)
        for m in load_measurements(args.measured, args.collective):
            if m.busbw_GBps is not None:      # the log's own busbw column
                bw = m.busbw_GBps
            else:
                ws = m.world_size or w
                bw = m.nbytes / (m.time_us * 1e3) * factor(ws) if m.time_us > 0 else 0.0
            measured.append({"source": m.source, "algo": m.algo, "nbytes": m.nbytes,
                             "time_us": m.time_us, "busbw_GBps": bw,
                             "world_size": m.world_size})
        sizes_ws = {m["world_size"] for m in measured if m["world_size"]}
        if sizes_ws and sizes_ws != {w}:
            warnings.append(f"warning: {args.measured} ran on {', '.join(map(str, sorted(sizes_ws)))}"
                            f" ranks, the model on {w}: times are not comparable")
    # A measured row is compared with the prediction of its algorithm when the model has it
    # (tilecomm bench), else (nccl-tests: NCCL chose) with the model's best of NCCL's algorithms.
    predicted_algos = {r["algo"] for r in rows}
    by_key = {}
    for m in measured:
        by_key[(m["nbytes"], m["algo"] if m["algo"] in predicted_algos else None)] = m
    ring_1ch = topo.nodes > 1 and "ring" in predicted_algos and library == "tilecomm"
    t = Table(title=f"{args.collective} on {spec.name} x{args.nodes} ({w} ranks): predicted, "
                    f"library {library}")
    for col in ("size", "algo", "proto", "time (us)", "band", "algbw GB/s", "busbw GB/s",
                "bottleneck"):
        t.add_column(col, justify="right")
    if measured:
        t.add_column("measured us", justify="right")
        t.add_column("err", justify="right")
    for r in rows:
        name = _row_name(r, ring_1ch)
        band = (f"-{1 - r['low_us'] / r['time_us']:.0%}/+{r['high_us'] / r['time_us'] - 1:.0%}"
                if r["time_us"] > 0 else "")
        cells = [format_size(r["nbytes"]), ("* " if r["best"] else "") + name, r["protocol"],
                 f"{r['time_us']:.2f}", band, f"{r['algbw_GBps']:.2f}",
                 f"{r['busbw_GBps']:.2f}", r["bottleneck"]]
        if measured:
            if library in ("nccl", "rccl"):
                m = by_key.get((r["nbytes"], None)) if r["best"] else None
            else:
                m = by_key.get((r["nbytes"], r["algo"])) or (
                    by_key.get((r["nbytes"], None)) if r["algo"] == nccl_pick[r["nbytes"]]
                    else None)
            ok = m is not None
            cells += [f"{m['time_us']:.2f}" if ok else "",
                      f"{(r['time_us'] - m['time_us']) / m['time_us']:+.0%}" if ok else ""]
        t.add_row(*cells, style="bold" if r["best"] else None)
    con.print(t)
    con.print({"nccl": "* = NCCL's choice (its tuner's cheapest algorithm/protocol)",
               "rccl": "* = RCCL's choice (MSCCL where it takes the call, else its tuner's "
                       "cheapest)"}.get(library, "* = model's fastest"))
    if fit_note:
        con.print(fit_note)
    if bands:
        con.print("band: range of the measured time given the prediction, from the "
                  + ("errors of fitting one node count and predicting larger ones"
                     if fit_multi else "leave-one-system-out errors")
                  + " of its size regime (docs/model.md)"
                  + (("; widened: the model has no published system of this network class "
                      f"({spec.fabric.transport})" if spec.fabric.transport else
                      "; widened: the system description does not say its fabric.transport")
                     if unseen_net else ""))
    if ring_1ch:
        con.print(f"{RING_1CH}: one ring through every rank, NIC-bound by a single channel; "
                  "NCCL runs one ring per NIC, so this is pessimistic (docs/model.md, Known gaps)")
    if library == "tilecomm" and any(m["algo"] not in predicted_algos for m in measured):
        con.print(f"measured rows without an algorithm (nccl-tests) are compared with the "
                  f"model's fastest of {', '.join(a for a in NCCL_ALGOS)} where it has one")
    if any(r.get("what_if") for r in rows):
        con.print(f"{WHAT_IF}: modeled, not in the runtime (comm.{args.collective}(algo=...) "
                  f"accepts {', '.join(runtime_algorithms(args.collective, topo))} on "
                  f"{args.nodes} node{'s' if args.nodes > 1 else ''})")
    if args.algo == "all":
        gone = skipped(args.collective, topo, what_if)
        if gone:
            con.print(f"skipped: {', '.join(gone)} (too many moves at {w} ranks)")
        if not rows and not what_if:
            con.print("no algorithm of the runtime is small enough to simulate here; "
                      "--what-if adds the model's others")
    for line in warnings:
        con.print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"system": spec.name, "nodes": args.nodes, "library": library,
                       "nccl_params": prm.as_dict() if library in ("nccl", "rccl") else None,
                       "predictions": rows,
                       "measured": measured}, f, indent=1)
    if args.plot:
        from .plot import plot_sweep
        nodes = f"{args.nodes} node{'s' if args.nodes > 1 else ''}"
        plot_sweep(rows, args.plot, f"{args.collective} on {spec.name}, {nodes}, {w} ranks"
                   + (f" ({args.mem} memory)" if "shm" in {r['protocol'][:3] for r in rows}
                      else ""), measured)
    return 0


def run_topo(args) -> int:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if args.system is None:
        from tilecomm.topology.detect import detect
        info = detect(measure=not args.no_measure)
        t = Table(title="this machine")
        t.add_column("property")
        t.add_column("value")
        for k, v in info.items():
            if k != "topo":
                t.add_row(k, "\n".join(v) if isinstance(v, list) else str(v))
        con.print(t)
        if info.get("topo"):
            con.print(info["topo"])
        return 0
    from tilecomm.topology import build
    topo = build(args.system, args.nodes)
    s = topo.spec
    t = Table(title=f"{s.name}: {args.nodes} node(s) x {topo.gpus} {s.gpu} = "
                    f"{topo.world_size} ranks")
    t.add_column("parameter")
    t.add_column("value", justify="right")
    for k in ("intra", "gpu_link_GBps", "mem_GBps", "reduce_GBps", "nics_per_node", "nic_GBps",
              "nvls", "nvls_alg_GBps", "nvls_us", "launch_us"):
        t.add_row(k, str(getattr(s, k)))
    f = s.fabric
    t.add_row("fabric", f"{'rail-optimized' if f.rail_optimized else 'single-leaf'} fat tree, "
              f"{f.levels} levels, {f.nodes_per_leaf} nodes/leaf, {f.oversubscription}:1")
    t.add_row("links", str(len(topo.capacity)))
    if s.shm is not None:
        t.add_row("shm cost model", str(s.shm))
    con.print(t)
    p = Table(title="protocols (NCCL tuning model)")
    for col in ("name", "eff", "step intra us", "step net us", "base us"):
        p.add_column(col, justify="right")
    for pr in s.protocols:
        p.add_row(pr.name, f"{pr.eff:.3f}", str(pr.step_intra_us), str(pr.step_net_us),
                  str(pr.base_us))
    con.print(p)
    if topo.world_size > 1:
        last = topo.world_size - 1
        con.print(f"path 0 -> 1: {topo.path(0, 1)}")
        con.print(f"path 0 -> {last}: {topo.path(0, last)}")
    for k, v in s.sources.items():
        con.print(f"  source {k}: {v}")
    return 0


def main(argv=None) -> int:
    """Standalone entry (``python -m tilecomm.sim.cli sim ...``) for tests and debugging."""
    parser = argparse.ArgumentParser(prog="python -m tilecomm.sim.cli",
                                     description="tilecomm's sim and topo subcommands, "
                                                 "standalone (the same as `tilecomm sim|topo`)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_sim_parser(sub)
    add_topo_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        parser.exit(2, f"{parser.prog} {args.cmd}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
