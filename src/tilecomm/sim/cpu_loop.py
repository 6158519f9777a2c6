"""The local loop: a cost model of tilecomm's own shared-memory runtime, fitted to its benchmarks.

NOTE [what one CPU collective costs]
    The executor (backends/cpu/executor.py, docs/design.md) runs, per rank::

        Python call + plan (cached for calls <= 1 MiB)                 call_us
        handshake: wait for every rank                                 sync_us
        per piece k:  staging copies, local phases, remote phases
            each remote phase: wait for its sources, do the moves      sync_us + ops
            end wait for the readers (skipped on the last piece when
            peers read only scratch: NOTE [skipping the final wait])   sync_us
        each numpy call (copyto / add over a chunk slice)              op_us
        each byte copied / reduced                                     1/rate

    Counts come from the *same* lowered plans the runtime executes (``algorithms/lower.py``:
    :func:`~tilecomm.algorithms.lower.lower`, ``piece_elems``/``piece_len``, the plan's chunk
    lengths; nothing from ``backends/``): number of pieces, which phases wait, which buffers
    are staged (user memory) or read in place (heap memory), the numpy calls of every
    reduction (NOTE [reduction order]). A byte moves at the cache rate with
    rate when the working set fits the cache (``h = 1``) and at the DRAM rate otherwise
    (``h = 0``: a cyclic sweep larger than an LRU cache never hits); the working
    set of an operation that touches only scratch is the ranks' scratch pieces (cache-sized by
    design), that of one touching the caller's buffers is all ranks' buffers plus scratch.

    Time = ``theta . features`` with ``theta = (call_us, sync_us, op_us, 1/copy_cache,
    1/add_cache, 1/copy_dram, 1/add_dram)``: linear for a fixed cache size. :func:`fit` solves the
    non-negative least squares problem on *relative* errors for each cache size of a log grid and
    keeps the best: seven physical parameters plus the cache size, never one per data point.

``python -m tilecomm.sim.cpu_loop benchmarks/results/cpu_all_reduce_2ranks_{user,heap}.json``
fits on the calibration subset (:data:`CALIB_ALGOS` at :data:`CALIB_SIZES`) and prints the
errors of every row, calibrated and held out, per memory mode and regime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tilecomm.algorithms.lower import USER_BUFFERS, PlanOp, piece_elems, piece_len
from tilecomm.algorithms.placement import SCRATCH, SMALL_CALL_BYTES, cpu_plan, place
from tilecomm.topology.spec import ShmCost

# Calibration subset: two algorithms, every other size of the committed sweeps (16 B x4 steps).
# one_shot and ring, not two_shot: the committed sweeps predate two_shot's tmp aliasing
# (commit 2975464), so two_shot's user-memory rows measure a schedule that no longer exists.
CALIB_ALGOS = ("one_shot", "ring")
CALIB_SIZES = None   # None: every other size of the measured grid, starting at the smallest
# Regimes of this machine: below 64 KiB time is overhead; up to 1 MiB data fits in cache.
LAT_MAX, CACHE_MAX = 64 << 10, 1 << 20
#: the rate (GB/s) :func:`fit` gives a term no calibration row was limited by
UNSEEN_GBPS = 1e6
NAMES = ("call_us", "sync_us", "op_us", "copy_cache", "add_cache", "copy_dram", "add_dram")


@dataclass(frozen=True)
class Row:
    """One measurement from ``tilecomm bench --json``."""

    collective: str
    algo: str
    world_size: int
    nbytes: int
    itemsize: int
    mem: str            # "user" (staged through scratch) or "heap" (comm.alloc, read in place)
    time_us: float

    @property
    def regime(self) -> str:
        return "latency" if self.nbytes <= LAT_MAX else (
            "cache" if self.nbytes <= CACHE_MAX else "dram")


ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8,
             "int8": 1, "uint8": 1}


def load_rows(path: str) -> list[Row]:
    data = json.loads(Path(path).read_text())
    return rows_of(data.get("rows", data.get("results", [])) if isinstance(data, dict) else data)


def rows_of(bench_rows: list[dict]) -> list[Row]:
    """:class:`Row` s of ``tilecomm bench`` rows (its JSON, or ``bench.runner.run``'s)."""
    return [Row(r["collective"], r["algo"], int(r["world_size"]), int(r["bytes"]),
                ITEMSIZE.get(r.get("dtype", "float32"), 4), r.get("mem", "user"),
                float(r["time_us"])) for r in bench_rows]


# ---- counting what the runtime does ----------------------------------------------------------

@dataclass(frozen=True)
class Work:
    """What one rank does in one call (averaged over ranks): the model's raw counts."""

    syncs: float
    ops: float
    pieces: int
    cached: bool
    # (kind, bytes, touches_caller_buffers) summed into four bins
    copy_scratch: float
    add_scratch: float
    copy_user: float
    add_user: float
    ws_scratch: float   # bytes all ranks' scratch pieces span
    ws_user: float      # bytes all ranks' buffers and scratch span


def work(collective: str, algo: str, world_size: int, nbytes: int, mem: str = "user",
         itemsize: int = 4, piece_bytes: int = 1 << 20, ranks=None,
         single_copy_min: int = 0) -> Work:
    """Counts of syncs, numpy calls and bytes per rank (mean over ``ranks``, default all), from
    the lowered plans the runtime executes (``algorithms/lower.py``). ``single_copy_min``:
    user tensors of calls this large (all buffers' bytes) that peers only copy are read in
    place (the runtime's single-copy reads); 0: every one is staged."""
    from tilecomm.algorithms.collectives import COLLECTIVES

    spec = COLLECTIVES[collective]
    count = max(1, nbytes // itemsize)
    tot = np.zeros(6)
    pieces = 1
    ws_scr = 0.0
    ranks = list(range(world_size)) if ranks is None else list(ranks)
    buffers = nbytes * (2 if collective not in ("all_reduce", "broadcast", "reduce") else 1)
    single_copy = mem == "user" and bool(single_copy_min) and buffers >= single_copy_min
    for me in ranks:
        plan = cpu_plan(collective, algo, world_size, 0, me)
        piece = piece_elems(plan, itemsize, piece_bytes)
        lens = {b: plan.chunk_lengths(b, count) for b in plan.names}
        # Pieces as the executor's layout cuts them (chunk lengths are the same on every rank
        # for the collectives modelled here, so the longest chunk is this rank's).
        longest = max((x for v in lens.values() for x in v), default=0)
        pieces = 1 if not piece or not longest else max(1, -(-longest // piece))
        # Place of each buffer: the executor's own policy (backends/cpu/placement.py):
        # scratch (staged, or scratch by nature) or the caller's memory (a heap tensor read
        # in place, a buffer no peer reads, or with single-copy reads a tensor peers read in
        # place: the kernel's copy at the same rates, an approximation, docs/model.md). A
        # scratch buffer that is not scratch is an ``alias`` of its ``like`` buffer's storage.
        alias = {}
        in_scratch = {}
        for b in plan.names:
            like = b if b in USER_BUFFERS else plan.sched.buffer(b).like
            where = place(plan, b, in_heap=mem == "heap", single_copy=single_copy,
                          present=like in USER_BUFFERS)
            in_scratch[b] = where == SCRATCH
            if b not in USER_BUFFERS and where != SCRATCH:
                alias[b] = like
        skip_last = all(in_scratch[plan.names[i]] for i in plan.last_read_bufs)
        nph = len(plan.phases)
        syncs = ops = 0
        byt = np.zeros(4)   # copy_scratch, add_scratch, copy_user, add_user
        # Bytes of slices do not depend on the piece (only their split), so sum whole chunks;
        # numpy calls do: count non-empty slices per piece.
        # Every piece but the first and last looks like piece 1: count three, scale the middle.
        last = pieces - 1
        reps = {0: 1} if last == 0 else ({0: 1, last: 1} if last == 1 else
                                          {0: 1, 1: last - 1, last: 1})
        for k, times in reps.items():
            s_k = o_k = 0
            if k == 0:
                s_k += 1                                    # handshake
            for b in plan.names:                            # staging in and out
                if in_scratch[b] and b in USER_BUFFERS:
                    n_io = (b in spec.inputs) + (b in ("buf", "out"))
                    o_k += n_io * sum(1 for n in lens[b] if piece_len(n, k, piece))
            for p in range(nph):
                if p >= plan.lead and plan.phases[p].waits:
                    s_k += 1
                for op in plan.phases[p].ops:
                    if piece_len(lens[op.dst.buf][op.dst.chunk], k, piece) and \
                            not _self_copy(me, op, alias):
                        o_k += _calls(op)
            if plan.end_waits and not (k == last and skip_last):
                s_k += 1
            syncs += times * s_k
            ops += times * o_k
        for b in plan.names:
            if in_scratch[b] and b in USER_BUFFERS:
                nb = sum(lens[b]) * itemsize
                n_io = (b in spec.inputs) + (b in ("buf", "out"))
                byt[2] += n_io * nb                         # user <-> scratch copies
        for p in range(nph):
            for op in plan.phases[p].ops:
                if _self_copy(me, op, alias):
                    continue
                nb = lens[op.dst.buf][op.dst.chunk] * itemsize
                user = not all(in_scratch[x.buf] for x in [op.dst] + [s[1] for s in op.srcs])
                if op.is_copy:
                    byt[2 if user else 0] += nb
                else:
                    byt[3 if user else 1] += nb * _calls(op)
        tot += np.array([syncs, ops, *byt])
        ws_scr += itemsize * sum(min(n, piece) if piece else n
                                 for b in plan.names if in_scratch[b] for n in lens[b])
    tot /= len(ranks)
    ws_scr *= world_size / len(ranks)
    total_io = buffers  # in-place all_reduce: one buffer per rank
    return Work(float(tot[0]), float(tot[1]), pieces, total_io <= SMALL_CALL_BYTES,
                *map(float, tot[2:]), ws_scratch=max(ws_scr, 1.0),
                ws_user=ws_scr + world_size * float(buffers))


def _calls(op: PlanOp) -> int:
    """numpy calls of one op over one slice: a copy is one; a reduction of ``n`` operands
    (``dst`` counted when it ``accumulate``s) is ``n - 1`` binary steps."""
    n = len(op.srcs) + op.accumulate
    return max(1, n - 1)


def _self_copy(me: int, op: PlanOp, alias: dict) -> bool:
    """A copy onto itself once an aliased buffer is folded into its ``like`` (skipped)."""
    if not op.is_copy or op.srcs[0][0] != me:
        return False
    src, dst = op.srcs[0][1], op.dst
    return src.chunk == dst.chunk and alias.get(src.buf, src.buf) == alias.get(dst.buf, dst.buf)


def _hit(cache: float, ws: float) -> float:
    """Hit fraction of a working set swept once per call: an LRU cache keeps all of it or, once
    it is larger (a cyclic sweep evicts each line before its reuse), none of it."""
    return 1.0 if ws <= cache else 0.0


def features(w: Work, cache_bytes: float) -> np.ndarray:
    """Row of the linear model for a given cache size (see NOTE at the top)."""
    h_s = _hit(cache_bytes, w.ws_scratch)
    h_u = _hit(cache_bytes, w.ws_user)
    us_per_byte = 1e-3   # 1 / (GB/s) -> us per byte is 1e-3 / GBps
    return np.array([
        1.0, w.syncs, w.ops,
        us_per_byte * (h_s * w.copy_scratch + h_u * w.copy_user),
        us_per_byte * (h_s * w.add_scratch + h_u * w.add_user),
        us_per_byte * ((1 - h_s) * w.copy_scratch + (1 - h_u) * w.copy_user),
        us_per_byte * ((1 - h_s) * w.add_scratch + (1 - h_u) * w.add_user),
    ])


def _theta(p: ShmCost) -> np.ndarray:
    return np.array([p.call_us, p.sync_us, p.op_us, 1 / p.copy_cache_GBps,
                     1 / p.add_cache_GBps, 1 / p.copy_dram_GBps, 1 / p.add_dram_GBps])


def predict_us(p: ShmCost, collective: str, algo: str, world_size: int, nbytes: int,
               mem: str = "user", itemsize: int = 4, ranks=None) -> float:
    """Predicted time (us) of one call of tilecomm's shared-memory runtime: the slowest of
    ``ranks`` (default: all; pass a few for large worlds, e.g. ``{0, 1, W-1}``)."""
    return max(breakdown(p, collective, algo, world_size, nbytes, mem, itemsize, [r]).sum()
               for r in (range(world_size) if ranks is None else sorted(set(ranks))))


def breakdown(p: ShmCost, collective: str, algo: str, world_size: int, nbytes: int,
              mem: str = "user", itemsize: int = 4, ranks=None) -> np.ndarray:
    """Time (us) per term, in the order of :data:`NAMES` (mean over ``ranks``)."""
    w = work(collective, algo, world_size, nbytes, mem, itemsize, p.piece_bytes, ranks,
             p.single_copy_min_bytes)
    return features(w, p.cache_bytes) * _theta(p)


def predict_row(p: ShmCost, r: Row) -> float:
    return predict_us(p, r.collective, r.algo, r.world_size, r.nbytes, r.mem, r.itemsize)


# ---- fitting ---------------------------------------------------------------------------------

def nnls(A: np.ndarray, b: np.ndarray, iters: int = 100) -> np.ndarray:
    """Non-negative least squares (Lawson-Hanson active set), small dense problems."""
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    for _ in range(iters):
        grad = A.T @ (b - A @ x)
        cand = ~passive & (grad > 1e-12 * max(1.0, np.abs(grad).max()))
        if not cand.any():
            break
        passive[np.argmax(np.where(cand, grad, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x


@dataclass(frozen=True)
class Fit:
    params: ShmCost
    rms_rel: float          # root mean square relative error on the calibration rows
    rows: int


def fit(rows: list[Row], piece_bytes: int = 1 << 20,
        cache_grid: tuple[float, ...] | None = None, single_copy_min: int = 0) -> Fit:
    """Least-squares fit of :class:`ShmCost` to ``rows`` (relative error, non-negative), measured
    with TILECOMM_CMA_MIN_BYTES ``single_copy_min`` (0: TILECOMM_CMA=0, or not allowed).

    Linear in the seven rate/latency parameters for a fixed cache size; the cache size is chosen
    on a log grid (256 KiB .. 256 MiB, 2^(1/4) steps).
    """
    if cache_grid is None:
        cache_grid = tuple(2.0 ** (e / 4) for e in range(18 * 4, 28 * 4 + 1))
    works = [work(r.collective, r.algo, r.world_size, r.nbytes, r.mem, r.itemsize, piece_bytes,
                  single_copy_min=single_copy_min) for r in rows]
    t = np.array([r.time_us for r in rows])
    best = None
    for c in cache_grid:
        A = np.stack([features(w, c) for w in works]) / t[:, None]
        # Scale columns for conditioning, solve, unscale.
        s = np.abs(A).max(0)
        s[s == 0] = 1.0
        th = nnls(A / s, np.ones_like(t)) / s
        rel = A @ th - 1.0
        err = float(np.sqrt(np.mean(rel ** 2)))
        if best is None or err < best[0] - 1e-12:
            best = (err, c, th)
    err, c, th = best
    # a rate whose coefficient fitted to 0 never limited a measured row: "not limiting",
    # as a finite rate so that the parameters stay a valid ShmCost
    inv = [1 / x if x > 0 else UNSEEN_GBPS for x in th[3:]]
    p = ShmCost(float(th[0]), float(th[1]), float(th[2]), *map(float, inv),
                cache_bytes=int(round(c)), piece_bytes=piece_bytes,
                single_copy_min_bytes=single_copy_min)
    return Fit(p, err, len(rows))


def calibration_sizes(rows: list[Row], sizes=CALIB_SIZES) -> tuple[int, ...]:
    return tuple(sorted({r.nbytes for r in rows})[::2]) if sizes is None else tuple(sizes)


def is_calibration(r: Row, algos=CALIB_ALGOS, sizes=()) -> bool:
    return r.algo in algos and r.nbytes in sizes


# ---- the loop and its report -----------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    row: Row
    predicted_us: float
    calibrated: bool

    @property
    def error(self) -> float:
        return (self.predicted_us - self.row.time_us) / self.row.time_us


def loop(rows: list[Row], piece_bytes: int = 1 << 20, algos=CALIB_ALGOS,
         sizes=CALIB_SIZES) -> tuple[Fit, list[Check]]:
    """Fit on the calibration subset of ``rows``, predict every row."""
    sizes = calibration_sizes(rows, sizes)
    cal = [r for r in rows if is_calibration(r, algos, sizes)]
    if not cal:
        raise ValueError("no calibration rows (algorithms "
                         f"{algos} at sizes {sizes}) in the measurements")
    f = fit(cal, piece_bytes)
    return f, [Check(r, predict_row(f.params, r), is_calibration(r, algos, sizes)) for r in rows]


def summary(checks: list[Check]) -> dict:
    """(mem, regime, 'calibrated'|'held-out') -> (points, median |error|); plus totals."""
    out: dict = {}
    for c in checks:
        part = "calibrated" if c.calibrated else "held-out"
        for key in ((c.row.mem, c.row.regime, part), (c.row.mem, "all", part),
                    ("all", "all", part)):
            out.setdefault(key, []).append(abs(c.error))
    return {k: (len(v), float(np.median(v))) for k, v in out.items()}


def held_out_median(checks: list[Check]) -> float:
    return float(np.median([abs(c.error) for c in checks if not c.calibrated]))


def _fmt_params(p: ShmCost) -> str:
    return (f"call {p.call_us:.2f} us, sync {p.sync_us:.2f} us, op {p.op_us:.2f} us, "
            f"copy {p.copy_cache_GBps:.1f} / {p.copy_dram_GBps:.1f} GB/s (cache / DRAM), "
            f"add {p.add_cache_GBps:.1f} / {p.add_dram_GBps:.1f} GB/s, "
            f"cache {p.cache_bytes / 2**20:.2f} MiB, pieces {p.piece_bytes >> 10} KiB")


def loops(rows: list[Row], piece_bytes: int = 1 << 20) -> dict:
    """world size -> :func:`loop` of its rows (fitted once per world size)."""
    return {ws: loop([r for r in rows if r.world_size == ws], piece_bytes)
            for ws in sorted({r.world_size for r in rows})}


def report(paths: list[str], piece_bytes: int = 1 << 20, per_point: bool = True,
           fitted: dict | None = None) -> str:
    """Markdown: fitted parameters, per-point errors and the summary table, per world size
    (``fitted``: :func:`loops` of these rows, if already computed)."""
    rows = [r for path in paths for r in load_rows(path)]
    fitted = loops(rows, piece_bytes) if fitted is None else fitted
    out = []
    for ws, (f, checks) in fitted.items():
        sub = [r for r in rows if r.world_size == ws]
        out.append(f"### {ws} ranks ({', '.join(sorted({r.mem for r in sub}))} memory)\n")
        out.append(f"Fitted on {f.rows} rows ({'/'.join(CALIB_ALGOS)} at "
                   f"{', '.join(_size(s) for s in calibration_sizes(sub))}; rms relative error "
                   f"{f.rms_rel:.1%}): {_fmt_params(f.params)}\n")
        if per_point:
            algos = sorted({r.algo for r in sub})
            out.append("| mem | size | " + " | ".join(algos) + " |")
            out.append("|---|---:|" + "---:|" * len(algos))
            by = {(c.row.mem, c.row.nbytes, c.row.algo): c for c in checks}
            for mem in sorted({r.mem for r in sub}):
                for n in sorted({r.nbytes for r in sub if r.mem == mem}):
                    cells = []
                    for a in algos:
                        c = by.get((mem, n, a))
                        cells.append("" if c is None else
                                     f"{c.row.time_us:.1f} / {c.predicted_us:.1f} "
                                     f"({c.error:+.0%}){'*' if c.calibrated else ''}")
                    out.append(f"| {mem} | {_size(n)} | " + " | ".join(cells) + " |")
            out.append("\nCells: measured us / predicted us (error); * = calibration point.\n")
        s = summary(checks)
        out.append("| mem | regime | calibrated: points | median abs err | held-out: points "
                   "| median abs err |")
        out.append("|---|---|---:|---:|---:|---:|")
        for mem in sorted({r.mem for r in sub}) + ["all"]:
            for reg in (("latency", "cache", "dram", "all") if mem != "all" else ("all",)):
                c = s.get((mem, reg, "calibrated"), (0, float("nan")))
                h = s.get((mem, reg, "held-out"), (0, float("nan")))
                out.append(f"| {mem} | {reg} | {c[0]} | {c[1]:.1%} | {h[0]} | {h[1]:.1%} |")
        out.append("")
    return "\n".join(out)


def other_collectives(params: dict, paths: list[str]) -> str:
    """Markdown: every row of ``paths`` (collectives the fit never saw) against its prediction
    with ``params[world size]``, and the median absolute error per collective and regime."""
    rows = [r for path in paths for r in load_rows(path)]
    out = ["| collective | size | measured us | predicted us | error |",
           "|---|---:|---:|---:|---:|"]
    errs: dict = {}
    for r in rows:
        if r.world_size not in params:
            raise ValueError(f"no fit for {r.world_size} ranks (fitted: "
                             f"{sorted(params)}): add measurements of that world size")
        pred = predict_row(params[r.world_size], r)
        e = (pred - r.time_us) / r.time_us
        errs.setdefault((r.collective, r.regime), []).append(abs(e))
        errs.setdefault((r.collective, "all"), []).append(abs(e))
        out.append(f"| {r.collective} {r.algo} | {_size(r.nbytes)} | {r.time_us:.1f} | "
                   f"{pred:.1f} | {e:+.0%} |")
    out += ["", "| collective | regime | points | median abs err |", "|---|---|---:|---:|"]
    for (coll, reg), v in sorted(errs.items()):
        out.append(f"| {coll} | {reg} | {len(v)} | {float(np.median(v)):.1%} |")
    return "\n".join(out)


def _size(n: int) -> str:
    from ..units import format_size
    return format_size(n)


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tilecomm.sim.cpu_loop",
                                 description="Fit the shared-memory runtime's cost model on part "
                                             "of tilecomm bench --json output, predict the rest.")
    ap.add_argument("files", nargs="+", help="tilecomm bench --json files")
    ap.add_argument("--piece-bytes", default="1M", help="TILECOMM_PIECE_BYTES of the run")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--predict", nargs="+", default=[],
                    help="bench --json files of other collectives: predicted with the fit "
                         "of FILES (held out entirely)")
    ap.add_argument("--single-copy-min", default="0",
                    help="TILECOMM_CMA_MIN_BYTES of the --predict runs (0: TILECOMM_CMA=0)")
    a = ap.parse_args(argv)
    from ..units import parse_size
    pb = parse_size(a.piece_bytes)
    fitted = loops([r for path in a.files for r in load_rows(path)], pb)
    print(report(a.files, pb, per_point=not a.summary_only, fitted=fitted))
    if a.predict:
        sc = parse_size(a.single_copy_min)
        print(other_collectives({ws: replace(f.params, single_copy_min_bytes=sc)
                                 for ws, (f, _) in fitted.items()}, a.predict))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
