"""``tilecomm tune``: fit ``auto``'s costs to this machine and layout, or show its choices."""

from __future__ import annotations

import json
import time

from ..units import format_size as fmt_size
from .costs import curve_key

SHOW_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                    "all_to_all")
#: --show's sizes: 8 B .. 128 MiB by 4x
SHOW_SIZES = tuple(8 << (2 * k) for k in range(13))


def add_tune_parser(sub) -> None:
    from ..helpfmt import HelpFormatter
    p = sub.add_parser(
        "tune", help="fit algo='auto' to this machine (a short sweep), or --show its choices",
        formatter_class=HelpFormatter,
        description="Measure what auto's cost model needs on this machine and layout and store "
                    "it (TILECOMM_TUNE_DIR, one file per machine fingerprint); later runs use it "
                    "without asking. One host: the shared-memory model's parameters from an "
                    "all_reduce sweep (under 60 s on 2 cores). --hosts H: every inter-host "
                    "candidate measured on H simulated hosts (under 2 min for 2 x 2).",
        epilog="examples:\n  tilecomm tune -n 2\n  tilecomm tune -n 4 --hosts 2\n"
               "  tilecomm tune --show -n 4 --hosts 2")
    p.add_argument("-n", "--nranks", type=int, default=2, help="ranks (all hosts together)")
    p.add_argument("--hosts", type=int, default=0,
                   help="simulated hosts the ranks are spread over (0: one host)")
    p.add_argument("--show", action="store_true",
                   help="print which candidate auto picks for which sizes, per collective, with "
                        "the predicted and (where the sweep measured it) measured time")
    p.add_argument("--collective", default=None, help="--show only this collective")
    p.add_argument("--ship", default=None, metavar="PY",
                   help="also write the measured curves as a module of shipped defaults "
                        "(src/tilecomm/tuning/shipped.py)")
    p.set_defaults(func=run_tune)


def _per_host(args) -> list[int] | None:
    if not args.hosts:
        return None
    if args.hosts < 2 or args.nranks % args.hosts:
        raise ValueError(f"--hosts {args.hosts}: need at least 2 hosts and -n a multiple of it "
                         f"(got -n {args.nranks})")
    return [args.nranks // args.hosts] * args.hosts


def run_tune(args) -> int:
    from rich.console import Console
    con = Console(width=160)
    per_host = _per_host(args)
    if args.nranks < 2:
        raise ValueError(f"-n {args.nranks}: tuning needs at least 2 ranks")
    if args.show:
        con.print(show(args.nranks, per_host, args.collective))
        return 0
    from . import store, sweep
    t0 = time.monotonic()
    cmd = f"tilecomm tune -n {args.nranks}" + (f" --hosts {args.hosts}" if per_host else "")
    ranks = per_host[0] if per_host else args.nranks
    try:
        entries, rep = sweep.one_host(ranks)
        more = sweep.hosts(per_host)[0] if per_host else None
    except sweep.SlowLaunch as e:
        con.print(f"tilecomm tune: not fitted: {e}")
        return 1
    con.print(f"shared memory, {ranks} ranks: held out (two_shot, {rep['held_out_rows']} "
              f"rows): median |error| {100 * rep['held_out_median']:.1f}%; the fit's own "
              f"{rep['fit_rows']} rows: rms {100 * rep['fit_rms']:.1f}%")
    if more:
        entries.update(more)
        con.print(f"{len(more['curves'])} inter-host curves measured on "
                  f"{'+'.join(map(str, per_host))}")
    p = store.save(entries, cmd)
    con.print(f"wrote {p} in {time.monotonic() - t0:.0f} s")
    if args.ship:
        _ship(args.ship, entries.get("curves", {}), cmd)
        con.print(f"wrote the shipped curves to {args.ship}")
    con.print(show(args.nranks, per_host, args.collective))
    return 0


def show(world: int, per_host: list[int] | None, only: str | None = None):
    """The decision table: per collective, the size ranges of each choice."""
    from rich.table import Table

    from .. import tuner
    from ..bench import BenchConfig
    from ..bench.runner import candidates
    from ..hier.layout import HostLayout
    from .store import current
    model = current()
    lay = HostLayout.sizes(*per_host) if per_host else None
    kind = "hier" if per_host else "cpu"
    where = f"{'+'.join(map(str, per_host))} simulated hosts" if per_host else "one host"
    t = Table(title=f"auto on {world} ranks, {where} ({model.source})")
    for col in ("collective", "sizes", "auto picks", "predicted us", "measured us",
                "runner-up (predicted us)"):
        t.add_column(col, justify="left" if col in ("collective", "auto picks",
                                                     "runner-up (predicted us)") else "right")
    for coll in (only,) if only else SHOW_COLLECTIVES:
        cands = candidates(BenchConfig(op=coll, world_size=world, hosts=per_host))
        runs = []
        for n in SHOW_SIZES:
            ch = tuner.decide(coll, n, world, kind=kind, available=cands, layout=lay,
                              model=model)
            if runs and runs[-1][0] == ch.algo:
                runs[-1][2].append((n, ch))
            else:
                runs.append((ch.algo, n, [(n, ch)]))
        for algo, first, pts in runs:
            last = pts[-1][0]
            pred = [c.ranked[0][1] for _, c in pts]
            curve = model.curves.get(curve_key(lay, coll, algo)) if lay is not None else None
            have = dict(curve.points) if curve is not None else {}
            vals = [have[n] for n, _ in pts if n in have]
            measured = _span(vals) if vals else ""
            second = next((x for x in pts[-1][1].ranked if x[0] != algo), None)
            t.add_row(coll, f"{fmt_size(first)} - {fmt_size(last)}", algo, _span(pred),
                      measured, f"{second[0]} ({second[1]:.1f})" if second else "")
    return t


def _span(vals) -> str:
    lo, hi = min(vals), max(vals)
    return f"{lo:.1f}" if abs(hi - lo) < 0.05 else f"{lo:.1f} - {hi:.1f}"


def _ship(path: str, curves: dict, cmd: str) -> None:
    body = json.dumps(curves, indent=1, sort_keys=True)
    from pathlib import Path
    Path(path).write_text(
        '"""The inter-host curves ``auto`` uses where this machine has no tune file of its own.\n\n'
        f"Written by ``{cmd} --ship`` (simulated hosts on the machine of docs/benchmarks.md);\n"
        'layouts not listed here are predicted by the hierarchical model.\n"""\n\n'
        'SOURCE = "shipped defaults"\n'
        f"CURVES: dict[str, list[list[float]]] = {body}\n")
