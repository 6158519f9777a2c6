"""Ranks on several hosts of this machine: a cost model of the hierarchical runtime.

NOTE [what one hierarchical call costs]
    A hierarchical call (``hier/backend.py``) walks the steps of its :class:`HierPlan`
    (``hier/plans.py``, the same objects the runtime executes, from :func:`hier_plan`; nothing
    from ``backends/``). Every rank walks them in order and every step but Copy synchronizes
    the ranks it involves, so the model charges each step the time of its slowest rank and
    sums the steps, plus one ``call_us`` for the outer call::

        Copy      per pair: op_us + bytes / copy rate
        Local     cpu_loop.predict_us(shm, sub-collective, the algorithm the local tuner picks
                  for the region's bytes, the host's ranks, the region's bytes, user memory)
        Rail      per part (rail) of this rank:
                    header round     alpha + (H-1) * 4224 / beta   (hier/rails.py ROUND1)
                    payload round    alpha + (H-1) * n / beta  if n > 4096 B (all_gather; a
                                     broadcast receives n once)
                    combine          all_gather: H copies of n; all_reduce, reduce_scatter,
                                     reduce (root): copy m, (H-1) adds of m, copy m (m = the
                                     bytes this rank keeps), at the memory rates, op_us each
        Exchange  per peer: alpha + bytes / beta (torch.distributed point-to-point)

    ``alpha`` and ``beta`` are those of one rail round as the runtime makes it
    (``Rails.pairwise``: Gloo sends to and receives from every other member of the rail group)
    between simulated hosts (loopback TCP), measured *alone* by ``benchmarks/hosts_link.py``
    (link files without a ``primitive`` field, or with ``allgather``, timed Gloo's
    ``allgather``, which the rails used before and which is slower, up to 7x) in two modes: ``both``
    (every rank's rail busy at once, as in hier_rail) and ``one`` (only rail 0, the others
    idle, as in hier_leader); a step whose every rank has a rail part uses ``both``.
    Memory rates, ``op_us`` and ``call_us`` are the single-host fit (``ShmCost``,
    ``topology/presets.py`` CPU_SHM_COST). Copy rate: cache when the step's bytes (read plus
    written) fit ``cache_bytes``, DRAM otherwise.

    Local steps, when calibrated (``--local``, ``benchmarks/hosts_local.py``): ``slow x`` the
    single-host time, plus ``wake_us`` for a step right after a Rail or Exchange step (Copy
    steps in between do not synchronize and are looked through); and,
    when that file has rail rows, ``rail_wake_us`` for a Rail or Exchange step that follows a
    local step (the converse: its partners arrive from their local steps at different times,
    some asleep), over the link's back-to-back round. The
    single-host fit is 2 ranks with a core each; inside a hierarchical call every host runs
    its local step at once (4 processes on 2 cores: the slow-down), and a step after an
    inter-host round starts when that round releases the ranks, at different times, some of
    them asleep in their wait (the wake-up). Both terms are fitted on local collectives timed
    alone in exactly that situation, never on the hierarchical rows predicted. Calibrated on
    the rails' own round, the model is 26-54% low at the median on 2 x 2 sweeps: a rail round
    inside a call costs more than any primitive timed alone shows (docs/model.md).

``python -m tilecomm.sim.hosts fit LINK.json [--local LOCAL.json]`` prints the fits;
``python -m tilecomm.sim.hosts predict LINK.json BENCH.json ... [--local LOCAL.json]``
predicts ``tilecomm bench --hosts`` rows out of sample (fitted on LINK.json and LOCAL.json
only) and prints the errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..hier.layout import HostLayout
from ..hier.plans import Copy, Exchange, HierPlan, Local, Rail, hier_plan
from ..topology.presets import CPU_SHM_COST
from ..topology.spec import ShmCost
from . import cpu_loop

SMALL = 4096                    # payload bytes that ride in the header round (hier/rails.py)
HEADER = 128 + SMALL            # bytes one member contributes to a header round
#: Regimes of the report: per-call overhead, in-cache data, DRAM-sized data (cpu_loop's).
SMALL_MAX, MEDIUM_MAX = cpu_loop.LAT_MAX, cpu_loop.CACHE_MAX


@dataclass(frozen=True)
class Link:
    """One rail round between hosts: ``alpha_us + bytes_received / beta``."""

    alpha_us: float
    beta_GBps: float

    def round_us(self, recv_bytes: float) -> float:
        return self.alpha_us + 1e-3 * recv_bytes / self.beta_GBps


@dataclass(frozen=True)
class LocalSteps:
    """A Local step inside a hierarchical call: ``slow x`` the single-host model's time (every
    host busy at once), plus ``wake_us`` when it follows an inter-host step (which releases
    the ranks at different times). ``rail_wake_us``: the converse, added to an inter-host
    step that follows a local step (or starts the call), over the link's back-to-back time
    (0 when the calibration file has no rail rows)."""

    wake_us: float
    slow: float
    rail_wake_us: float = 0.0

    def step_us(self, single_host_us: float, after_rail: bool = True) -> float:
        return self.slow * single_host_us + (self.wake_us if after_rail else 0.0)


@dataclass(frozen=True)
class HostsCost:
    """The link in its two modes, the single-host runtime's parameters and, when calibrated
    (``benchmarks/hosts_local.py``), the local steps' wake-up and slow-down."""

    both: Link
    one: Link
    shm: ShmCost
    local: LocalSteps | None = None


#: The hierarchical model's parameters where nothing better is known: the link and local-step
#: fits of ``python -m tilecomm.sim.hosts predict benchmarks/results/hosts_link_2x2_dec03e.json
#: ... --local benchmarks/results/hosts_local_2x2_dec03e.json`` (2 simulated hosts x 2 ranks on
#: a 2-vCPU VM; docs/model.md "Ranks on several hosts"), with the shipped shared-memory fit.
#: ``auto`` uses it for layouts ``tilecomm tune --hosts`` has not measured.
DEFAULT_COST = HostsCost(both=Link(167.19, 1.218), one=Link(86.04, 2.141), shm=CPU_SHM_COST,
                         local=LocalSteps(wake_us=479.38, slow=2.019, rail_wake_us=183.86))


# ---- counting what a plan does -----------------------------------------------------------------

@dataclass(frozen=True)
class StepWork:
    """What one rank does in one step. ``rounds``: Gloo rounds (``header_rounds`` of them
    fixed-size headers); ``recv_bytes``: bytes received over the link in all of them;
    ``copy_bytes`` / ``add_bytes``: local memory traffic; ``ops``: torch calls; ``local``:
    ``(collective, algo, ranks, nbytes)`` of a Local step; ``busy``: this rank takes part."""

    kind: str
    rounds: int = 0
    header_rounds: int = 0
    recv_bytes: int = 0
    copy_bytes: int = 0
    add_bytes: int = 0
    ops: int = 0
    local: tuple | None = None
    busy: bool = True
    #: the step follows an inter-host step (Copy steps looked through): a Local step then pays
    #: the local wake-up, a Rail or Exchange step that does not pays the rail wake-up
    after_inter_host: bool = False


def caller_count(collective: str, nbytes: int, world_size: int, itemsize: int = 4) -> int:
    """Elements of the tensor the caller passes, from a bench row's size (nccl-tests sizes:
    the output of all_gather, the input of reduce_scatter, the buffer otherwise)."""
    n = max(1, nbytes // itemsize)
    return max(1, n // world_size) if collective == "all_gather" else n


def unit_elems(plan: HierPlan, count: int) -> int:
    """Elements per chunk of every buffer of ``plan`` (as ``hier/backend.py`` _Run cuts them)."""
    c = plan.collective
    if c in ("all_reduce", "broadcast", "reduce"):
        return -(-count // plan.nchunks("buf"))
    if c == "all_gather":
        return count
    if c == "barrier":
        return 0
    return count // plan.layout.world_size


def plan_work(plan: HierPlan, count: int, itemsize: int = 4,
              local_algo=None) -> list[StepWork]:
    """Rank ``plan.rank``'s :class:`StepWork` per step for a call of ``count`` elements.
    ``local_algo(collective, nbytes, ranks)``: the local tuner (default: ``tuner.choose``)."""
    from .. import tuner

    if local_algo is None:
        def local_algo(coll, nbytes, ranks):
            return tuner.choose(coll, nbytes, ranks, kind="cpu")
    lay = plan.layout
    unit_b = unit_elems(plan, count) * itemsize
    host = lay.hosts[lay.host_of(plan.rank)]
    start = _ends_inter_host(plan)
    out: list[StepWork] = []
    for st in plan.steps:
        after = _after_inter_host(out, start)
        if isinstance(st, Copy):
            nb = sum(d.n for d, _ in st.pairs) * unit_b
            w = StepWork("copy", copy_bytes=nb, ops=len(st.pairs))
        elif isinstance(st, Local):
            nb = st.src.n * unit_b
            # the size the local communicator's tuner sees (communicator.py _algo)
            seen = nb * len(host) if st.collective == "all_gather" else nb
            w = StepWork("local", local=("barrier", "direct", len(host), 0)
                         if st.collective == "barrier" else
                         (st.collective, local_algo(st.collective, seen, len(host)),
                          len(host), nb))
        elif isinstance(st, Rail):
            w = _rail_work(st, plan.rank, unit_b)
        elif isinstance(st, Exchange):
            nb = sum(r.n for _, r in st.recvs) * unit_b
            w = StepWork("exchange", rounds=len([1 for _, r in st.recvs if r.n]),
                         recv_bytes=nb, busy=bool(st.recvs or st.sends))
        else:   # pragma: no cover - plans.py has four step kinds
            raise TypeError(f"unknown step {st!r}")
        out.append(replace(w, after_inter_host=after))
    return out


def _after_inter_host(done: list[StepWork], call_start: bool = False) -> bool:
    """Whether the step after ``done`` follows an inter-host step (Copy steps do not
    synchronize, so they are looked through). ``call_start``: what the call's first step
    follows, the previous call's last step (the bench times back-to-back calls of one plan:
    :func:`_ends_inter_host`)."""
    for w in reversed(done):
        if w.kind != "copy":
            return w.kind in ("rail", "exchange")
    return call_start


def _ends_inter_host(plan: HierPlan) -> bool:
    """Whether the plan's last synchronizing step (Copy steps skipped) is inter-host."""
    for st in reversed(plan.steps):
        if not isinstance(st, Copy):
            return isinstance(st, (Rail, Exchange))
    return False


def _rail_work(st: Rail, rank: int, unit_b: int) -> StepWork:
    rounds = hdr = recv = copy = add = ops = 0
    for part in st.parts:
        h = len(part.members)
        rounds += 1
        hdr += 1
        recv += (h - 1) * HEADER
        ops += 6                      # header build and check (numpy), the allgather call
        if st.kind == "sync":
            continue
        n = (part.stride if part.lengths else part.src.n) * unit_b
        if n <= SMALL:
            copy += n                 # the payload is copied into the header block
            ops += 1
        else:
            rounds += 1
            recv += n if st.kind == "broadcast" else \
                (h - 1) * (n // h if st.kind == "all_to_all" else n)
            ops += 1
        if st.kind == "broadcast":
            continue
        if st.kind == "all_gather":
            copy += h * n
            ops += h
        elif st.kind == "all_to_all":       # member i's part of every message into dst
            copy += n
            ops += h
        elif st.kind in ("all_reduce", "reduce_scatter") or (
                st.kind == "reduce" and rank == part.root):
            m = part.dst.n * unit_b
            copy += 2 * m
            add += (h - 1) * m
            ops += h + 1
    return StepWork("rail", rounds=rounds, header_rounds=hdr, recv_bytes=recv,
                    copy_bytes=copy, add_bytes=add, ops=ops, busy=bool(st.parts))


# ---- time ------------------------------------------------------------------------------------

def step_us(w: StepWork, cost: HostsCost, link: Link, itemsize: int = 4) -> float:
    """Time (us) of one rank's step (see NOTE at the top)."""
    s = cost.shm
    if w.kind == "local":
        coll, algo, ranks, nb = w.local
        if coll == "barrier" or ranks <= 1:
            return s.call_us + s.sync_us if coll == "barrier" else s.call_us
        alone = cpu_loop.predict_us(s, coll, algo, ranks, nb, "user", itemsize)
        return alone if cost.local is None else cost.local.step_us(alone, w.after_inter_host)
    t = w.ops * s.op_us + _mem_us(s, w.copy_bytes, w.add_bytes)
    if w.kind in ("rail", "exchange"):
        t += w.rounds * link.alpha_us + 1e-3 * w.recv_bytes / link.beta_GBps
        if not w.after_inter_host and w.rounds and cost.local is not None:
            t += cost.local.rail_wake_us
    return t


def _mem_us(s: ShmCost, copy_b: float, add_b: float) -> float:
    cache = 2 * (copy_b + add_b) <= s.cache_bytes
    cr, ar = ((s.copy_cache_GBps, s.add_cache_GBps) if cache
              else (s.copy_dram_GBps, s.add_dram_GBps))
    return 1e-3 * (copy_b / cr + add_b / ar)


def breakdown(collective: str, algo: str, layout: HostLayout, nbytes: int, cost: HostsCost,
              itemsize: int = 4, root: int = 0) -> list[tuple[str, float]]:
    """``(step kind, time us)`` per step: the slowest rank's time in each step."""
    w = layout.world_size
    count = caller_count(collective, nbytes, w, itemsize)
    works = [plan_work(hier_plan(collective, algo, layout, root, r), count, itemsize)
             for r in range(w)]
    out = []
    for i in range(len(works[0])):
        ws = [wk[i] for wk in works]
        link = cost.both if all(x.busy for x in ws) else cost.one
        out.append((ws[0].kind, max(step_us(x, cost, link, itemsize) for x in ws)))
    return out


def predict_us(collective: str, algo: str, layout: HostLayout, nbytes: int, cost: HostsCost,
               itemsize: int = 4, root: int = 0) -> float:
    """Predicted time (us) of one hierarchical call of ``nbytes`` (bench sizes)."""
    return cost.shm.call_us + sum(t for _, t in breakdown(collective, algo, layout, nbytes,
                                                          cost, itemsize, root))


# ---- calibration of the link ---------------------------------------------------------------

def fit_link(points: list[tuple[float, float]]) -> Link:
    """Non-negative least squares on relative errors of ``time_us = alpha + recv / beta``
    over ``(recv_bytes, time_us)`` points."""
    b = np.array([t for _, t in points], float)
    A = np.array([[1.0, 1e-3 * n] for n, _ in points]) / b[:, None]
    scale = np.abs(A).max(0)
    scale[scale == 0] = 1.0
    th = cpu_loop.nnls(A / scale, np.ones_like(b)) / scale
    return Link(float(th[0]), float(1 / th[1]) if th[1] > 0 else float("inf"))


def local_alone_us(shm: ShmCost, collective: str, nbytes: int, ranks: int) -> float:
    """The single-host model of a local step (the algorithm the local tuner picks)."""
    from .. import tuner
    seen = nbytes * ranks if collective == "all_gather" else nbytes
    algo = tuner.choose(collective, seen, ranks, kind="cpu")
    return cpu_loop.predict_us(shm, collective, algo, ranks, nbytes, "user", 4)


def fit_local(rows: list[dict], shm: ShmCost, ranks: int, rail_rows: list[dict] = (),
              links: dict | None = None, members: int = 2) -> LocalSteps:
    """Non-negative least squares on relative errors of ``time_us = wake + slow x alone``
    over ``benchmarks/hosts_local.py`` rows; with its ``rail_rows`` and the fitted
    ``links`` (mode -> :class:`Link`), ``rail_wake_us`` = the median excess of a rail round
    after a local step over the link's back-to-back round (not below 0)."""
    b = np.array([r["time_us"] for r in rows], float)
    A = np.array([[1.0, local_alone_us(shm, r["collective"], int(r["bytes"]), ranks)]
                  for r in rows]) / b[:, None]
    scale = np.abs(A).max(0)
    scale[scale == 0] = 1.0
    th = cpu_loop.nnls(A / scale, np.ones_like(b)) / scale
    rail_wake = 0.0
    if rail_rows and links:
        excess = [r["time_us"] - links[r["mode"]].round_us((members - 1) * r["bytes"])
                  for r in rail_rows]
        rail_wake = max(0.0, float(np.median(excess)))
    return LocalSteps(float(th[0]), float(th[1]), rail_wake)


def load_link(path: str, shm: ShmCost | None = None,
              local_path: str | None = None) -> tuple[HostsCost, dict]:
    """Fit both modes on a ``benchmarks/hosts_link.py`` file (2-member rails: each round
    receives one member's bytes) and, given ``local_path`` (``benchmarks/hosts_local.py``),
    the local steps."""
    from ..topology.presets import CPU_SHM_COST

    data = json.loads(Path(path).read_text())
    members = data.get("hosts", 2)
    links = {}
    for mode in ("both", "one"):
        pts = [((members - 1) * r["bytes"], r["time_us"]) for r in data["rows"]
               if r["mode"] == mode]
        if len(pts) < 2:
            raise ValueError(f"{path}: fewer than two {mode!r} rows to fit the link on")
        links[mode] = fit_link(pts)
    shm = shm or CPU_SHM_COST
    local = None
    if local_path is not None:
        ld = json.loads(Path(local_path).read_text())
        local = fit_local(ld["rows"], shm, int(ld.get("per_host", 2)), ld.get("rail_rows", ()),
                          links, members)
        data = {**data, "local": ld}
    return HostsCost(links["both"], links["one"], shm, local), data


def regime(nbytes: int) -> str:
    return "small" if nbytes <= SMALL_MAX else ("medium" if nbytes <= MEDIUM_MAX else "large")


def load_bench(path: str) -> list[dict]:
    """Rows of ``tilecomm bench --hosts ... --json`` (only hierarchical algorithms)."""
    rows = json.loads(Path(path).read_text())
    rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
    return [r for r in rows if str(r.get("algo", "")).startswith("hier_")]


def predict_rows(cost: HostsCost, rows: list[dict], layout: HostLayout) -> list[dict]:
    from .cpu_loop import ITEMSIZE
    out = []
    for r in rows:
        isz = ITEMSIZE.get(r.get("dtype", "float32"), 4)
        p = predict_us(r["collective"], r["algo"], layout, int(r["bytes"]), cost, isz)
        out.append({**r, "predicted_us": p, "error": (p - r["time_us"]) / r["time_us"]})
    return out


def report(link_path: str, bench_paths: list[str], per_host: list[int] | None = None,
           local_path: str | None = None) -> str:
    """Markdown: the link fit (and the local steps' fit), every row measured / predicted,
    errors per regime."""
    cost, data = load_link(link_path, local_path=local_path)
    lines = [f"Link fitted on {link_path} ({data.get('primitive', 'allgather')} rounds; load "
             f"{data.get('loadavg_before', ['?'])[0]} -> {data.get('loadavg_after', ['?'])[0]}):",
             f"both rails busy: alpha {cost.both.alpha_us:.1f} us, beta "
             f"{cost.both.beta_GBps:.2f} GB/s; one rail: alpha {cost.one.alpha_us:.1f} us, "
             f"beta {cost.one.beta_GBps:.2f} GB/s", ""]
    lines += ["| mode | bytes | measured us | fit us | error |", "|---|---:|---:|---:|---:|"]
    for r in data["rows"]:
        lk = cost.both if r["mode"] == "both" else cost.one
        f = lk.round_us((data.get("hosts", 2) - 1) * r["bytes"])
        lines.append(f"| {r['mode']} | {_size(r['bytes'])} | {r['time_us']:.1f} | {f:.1f} | "
                     f"{(f - r['time_us']) / r['time_us']:+.0%} |")
    if cost.local is not None:
        lo = cost.local
        ranks = int(data["local"].get("per_host", 2))
        lines += ["", f"Local steps fitted on {local_path}: wake {lo.wake_us:.1f} us, slow-down "
                      f"x{lo.slow:.2f} on the single-host model", "",
                  "| collective | bytes | measured us | alone us | fit us | error |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in data["local"]["rows"]:
            alone = local_alone_us(cost.shm, r["collective"], int(r["bytes"]), ranks)
            f = lo.step_us(alone)
            lines.append(f"| {r['collective']} | {_size(r['bytes'])} | {r['time_us']:.1f} | "
                         f"{alone:.1f} | {f:.1f} | {(f - r['time_us']) / r['time_us']:+.0%} |")
        rail_rows = data["local"].get("rail_rows", [])
        if rail_rows:
            lines += ["", f"Rail rounds right after a local step: wake {lo.rail_wake_us:.1f} us "
                          f"over the link's back-to-back round (median excess)", "",
                      "| mode | bytes | measured us | back to back us | fit us | error |",
                      "|---|---:|---:|---:|---:|---:|"]
            for r in rail_rows:
                lk = cost.both if r["mode"] == "both" else cost.one
                b2b = lk.round_us((data.get("hosts", 2) - 1) * r["bytes"])
                f = b2b + lo.rail_wake_us
                lines.append(f"| {r['mode']} | {_size(r['bytes'])} | {r['time_us']:.1f} | "
                             f"{b2b:.1f} | {f:.1f} | {(f - r['time_us']) / r['time_us']:+.0%} |")
    checks = []
    for path in bench_paths:
        rows = load_bench(path)
        if not rows:
            continue
        ws = int(rows[0]["world_size"])
        hosts = per_host or [ws // 2, ws - ws // 2]
        checks += predict_rows(cost, rows, HostLayout.sizes(*hosts))
    if not checks:
        return "\n".join(lines)
    lines += ["", "| collective | size | algo | measured us | predicted us | error |",
              "|---|---:|---|---:|---:|---:|"]
    for c in checks:
        lines.append(f"| {c['collective']} | {_size(c['bytes'])} | {c['algo']} | "
                     f"{c['time_us']:.1f} | {c['predicted_us']:.1f} | {c['error']:+.0%} |")
    lines += ["", "| collective | regime | points | median abs err | worst abs err | "
                  "median signed |", "|---|---|---:|---:|---:|---:|"]
    for coll, reg, errs in summary(checks):
        a = np.abs(errs)
        lines.append(f"| {coll} | {reg} | {len(errs)} | {np.median(a):.0%} | {a.max():.0%} | "
                     f"{np.median(errs):+.0%} |")
    return "\n".join(lines)


def summary(checks: list[dict]) -> list[tuple[str, str, list[float]]]:
    """``(collective, regime, errors)`` for every collective and ``all``, per regime and
    ``all``."""
    out = []
    for coll in sorted({c["collective"] for c in checks}) + ["all"]:
        for reg in ("small", "medium", "large", "all"):
            errs = [c["error"] for c in checks
                    if coll in ("all", c["collective"]) and reg in ("all", regime(c["bytes"]))]
            if errs:
                out.append((coll, reg, errs))
    return out


def _size(n: int) -> str:
    from ..units import format_size
    return format_size(n)


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tilecomm.sim.hosts",
                                 description="The inter-host link of this machine and the "
                                             "hierarchical runtime's cost model.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit the link on benchmarks/hosts_link.py output")
    f.add_argument("link")
    p = sub.add_parser("predict", help="predict tilecomm bench --hosts rows (out of sample)")
    p.add_argument("link")
    p.add_argument("bench", nargs="+")
    p.add_argument("--per-host", default=None, help="ranks per host, e.g. 2,2 (default: even)")
    for q in (f, p):
        q.add_argument("--local", default=None,
                       help="benchmarks/hosts_local.py output: fit the local steps on it too")
    a = ap.parse_args(argv)
    if a.cmd == "fit":
        print(report(a.link, [], local_path=a.local))
    else:
        ph = [int(x) for x in a.per_host.split(",")] if a.per_host else None
        print(report(a.link, a.bench, ph, local_path=a.local))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
