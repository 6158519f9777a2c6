"""The collectives' bench: a case table (sizes x algorithms) on a live rank group, with
baselines and checks, run by the one bench loop (:mod:`.harness`, :mod:`.timing`).
``scripts/gpu_check.py`` runs its table through the same rank-side functions
(:func:`make_buffers`, :func:`check_case`, :func:`time_case`).

Per case every rank runs ``warmup`` calls, then ``rounds`` timed rounds of ``iters``
back-to-back calls (each round starts after a barrier), of tilecomm and of each baseline
(``--vs gloo``: the same operation through torch.distributed in the same processes),
interleaved round by round. A round's time is the slowest rank's mean time per call, as
nccl-tests reports; the row gives the median round and the rounds' spread.

In-place sums grow the data by ``world`` per call; the timed loop re-fills the input (untimed)
every :func:`safe_chunk` calls, so magnitudes stay finite (no overflow, no inf arithmetic).

``device="cuda"``: rank ``r`` works on ``cuda:{r % device_count}`` (all ranks share the GPU when
one is visible; ``cuda:N`` puts every rank on GPU N), its tensors are CUDA tensors (``mem=heap``:
``comm.alloc(..., device="cuda")``, zero copy), the collectives run the Triton kernels, and time
is read with CUDA events.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field, replace

import torch

from ..algorithms.registry import algorithms
from ..launch import RankGroup
from ..types import DTYPE_BY_NAME
from . import harness
from .cases import CASES, POISON, BenchCase, Buffers, bench_table, exact_data, round_count
from .harness import PRIMARY, Bench
from .machine import probe, verdict
from .roofline import bound_seconds, measure_device_rates, measure_rates, merge_rates
# gpu_check's ranks reach the timing loop through this module (``rk.runner``)
from .timing import Clock, measure, time_rounds  # noqa: F401


@dataclass
class BenchConfig(Bench):
    op: str
    world_size: int = 2
    sizes: list[int] = field(default_factory=lambda: [8])
    dtype: str = "float32"
    algos: list[str] = field(default_factory=lambda: ["auto"])
    mem: str = "user"               # user: ordinary tensors (staged); heap: comm.alloc tensors
    iters: int | None = None        # None: chosen per size
    warmup: int | None = None
    rounds: int = 5
    check: bool = False
    vs: list[str] = field(default_factory=list)   # baselines: "gloo"
    bound: bool = True              # measure copy/add rates and report the memory bound
    timeout: float = 120.0
    device: str = "cpu"             # cpu | cuda | cuda:N
    redop: str = "sum"
    deterministic: bool = False     # the communicators' deterministic mode (rank-order bits)
    trace: str | None = None        # TILECOMM_TRACE for the ranks; merged into trace.json there
    hosts: list[int] | None = None  # ranks per simulated host (tilecomm.simhosts); None: one host
    max_spread: float = harness.MAX_SPREAD

    kind = "collective"

    @property
    def uses_gloo(self) -> bool:
        return "gloo" in self.vs

    @property
    def rank_case(self):
        return rank_collective

    def layout(self):
        from ..hier.layout import HostLayout
        return HostLayout.sizes(*self.hosts) if self.hosts else None

    def table(self) -> list[BenchCase]:
        return bench_table(self.op, resolve_algos(self), self.sizes, self.dtype, self.mem,
                           self.redop, self.world_size)

    def cases(self) -> list[BenchCase]:
        return self.table()

    def validate(self) -> None:
        validate(self)

    def group(self):
        return _collective_group(self)

    def prepare(self, group) -> dict:
        dev = torch.device(self.device)
        group.run(rank_setup, self.device,
                  device_heap_bytes_for(self.sizes, self.mem) if dev.type == "cuda" else None)
        super().prepare(group)
        # NOTE [the slow launch] (bench/machine.py): whether this launch's timings can count
        machine = verdict(group.run(probe)) if dev.type == "cpu" else None
        return {"rates": self._rates(group), "machine": machine}

    def finish(self, group, ctx: dict) -> dict:
        """The rates again after the cases; the faster of the two counts (``roofline``)."""
        if ctx["rates"] is None:
            return ctx
        return {**ctx, "rates": merge_rates([ctx["rates"], self._rates(group)])}

    def _rates(self, group) -> dict | None:
        if not self.bound or self.op in ("send_recv", "all_to_all_v"):
            return None
        if torch.device(self.device).type == "cpu":
            return merge_rates(group.run(measure_rates))
        return merge_rates(group.run(measure_device_rates, self.device))

    def row(self, case: BenchCase, per_rank: list[dict], ctx: dict) -> dict:
        row = _row(self, case, per_rank, ctx["rates"], DTYPE_BY_NAME[self.dtype].itemsize)
        m = ctx.get("machine")
        if m is not None:
            row.update(machine_ratio=m["ratio"], machine_slow=m["slow"])
        return row


def auto_iters(nbytes: int) -> int:
    return max(3, min(500, (32 << 20) // max(nbytes, 1)))


# ---- rank side ------------------------------------------------------------------------------
def rank_device(comm, device: str = "cpu") -> torch.device:
    """This rank's device: ``cuda`` -> ``cuda:{rank % device_count}`` (made current: the kernel
    backend and ``comm.alloc(device="cuda")`` use the current device); ``cuda:N`` -> GPU N."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch sees no CUDA device here")
        idx = dev.index if dev.index is not None else comm.rank % torch.cuda.device_count()
        dev = torch.device("cuda", idx)
        torch.cuda.set_device(dev)
    return dev


def rank_setup(comm, device: str, device_heap_bytes: int | None) -> str:
    """Before the first collective on the device: the device heap's size, then the device."""
    if device_heap_bytes:       # read when the CUDA backend is made (its first call)
        from ..settings import settings
        os.environ["TILECOMM_DEVICE_HEAP_BYTES"] = str(int(device_heap_bytes))
        settings.cache_clear()
    return str(rank_device(comm, device))


def heap_alloc(comm, count: int, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """A symmetric (zero-copy) tensor for the collectives on ``dev``: ``comm.alloc(...,
    device="cuda")``, else ``comm.alloc`` (whose shared-memory heap the CPU collectives read
    in place, on the executor and on the Triton kernels of TILECOMM_CPU_KERNELS=triton
    alike)."""
    if dev.type == "cuda":
        return comm.alloc((count,), dtype, device="cuda")
    # the CPU kernel backend's heap is the communicator's shared-memory heap
    return comm.alloc((count,), dtype)


def case_counts(case: BenchCase) -> tuple[int, int, int | None]:
    """(elements of the largest buffer, of this rank's input, of its output or None)."""
    c = CASES[case.op]
    n = round_count(case.op, case.nbytes, DTYPE_BY_NAME[case.dtype].itemsize, case.world)
    return n, c.in_count(n, case.world), (c.out_count(n, case.world) if c.out_count else None)


def make_buffers(comm, case: BenchCase, dev: torch.device) -> Buffers:
    dt = DTYPE_BY_NAME[case.dtype].torch
    _, in_n, out_n = case_counts(case)
    if case.mem == "heap":
        make = lambda k: heap_alloc(comm, k, dt, dev)  # noqa: E731
    else:
        make = lambda k: torch.zeros(k, dtype=dt, device=dev)  # noqa: E731
    return Buffers(make(in_n), make(out_n) if out_n is not None else None, redop=case.redop)


def result_of(case: BenchCase, bufs: Buffers) -> torch.Tensor:
    return bufs.out if (bufs.out is not None and not CASES[case.op].in_place) else bufs.inp


def prepare_call(comm, case: BenchCase, bufs: Buffers, seed: int) -> torch.Tensor:
    """Fresh exact data for one checked call (seeded: every rank knows every rank's input),
    outputs poisoned, root and all_to_all_v's split drawn from the seed; returns what this
    rank must hold afterwards."""
    r, w = comm.rank, comm.world_size
    c = CASES[case.op]
    dt = DTYPE_BY_NAME[case.dtype].torch
    n_in = bufs.inp.numel()
    bufs.root = seed % w
    bufs.redop = case.redop
    if case.op == "all_to_all_v":
        bufs.split_seed = seed
    inputs = [exact_data(seed, j, n_in, dt, case.redop) for j in range(w)]
    bufs.inp.copy_(inputs[r])
    if case.op == "broadcast" and r != bufs.root:
        bufs.inp.fill_(POISON)
    if bufs.out is not None:
        bufs.out.fill_(POISON)
    return c.expected(inputs, r, w, bufs).reshape(-1)


def count_wrong(got: torch.Tensor, want: torch.Tensor) -> int:
    """Elements of ``got`` that differ from ``want`` (all of them on a shape mismatch)."""
    got = got.detach().reshape(-1).cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return int(want.numel())
    return int((got != want).sum())


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def check_case(comm, case: BenchCase, bufs: Buffers, dev: torch.device, seed: int = 1,
               calls: int = 2) -> int:
    """``calls`` consecutive checked calls (fresh data, poisoned outputs, each verified);
    returns the number of wrong elements over all of them. Afterwards the buffers are back
    in the timing set-up (root 0, the even all_to_all_v split)."""
    wrong = 0
    c = CASES[case.op]
    for k in range(calls):
        want = prepare_call(comm, case, bufs, seed * 16 + k)
        c.run(comm, bufs, case.algo)
        _sync(dev)
        wrong += count_wrong(result_of(case, bufs), want)
    bufs.root, bufs.split_seed = 0, 0
    return wrong


def safe_chunk(op: str, dtype: torch.dtype, world: int, redop: str = "sum") -> int | None:
    """Calls after which an in-place sum of ones over ``world`` ranks (``world**k``) would
    still be finite (float) or below the integer limit; None when the data does not grow."""
    if world < 2 or redop != "sum" or op not in ("all_reduce", "reduce"):
        return None
    top = torch.finfo(dtype).max if dtype.is_floating_point else torch.iinfo(dtype).max
    return max(1, int(math.log(top) / math.log(world)) - 1)


def _refilled(case: BenchCase, bufs: Buffers, world: int, redop: str | None = None):
    """``(refill, chunk)``: the untimed re-fill of an in-place sum's input and how often."""
    chunk = safe_chunk(case.op, DTYPE_BY_NAME[case.dtype].torch, world, redop or case.redop)
    bufs.inp.fill_(1)
    return ((lambda: bufs.inp.fill_(1)) if chunk else None), chunk


def collective_method(comm, case: BenchCase, bufs: Buffers, warmup: int, iters: int):
    """The timed method of tilecomm's call on ones (re-filled, untimed, before they could
    overflow)."""
    c = CASES[case.op]
    bufs.root, bufs.split_seed, bufs.redop = 0, 0, case.redop
    refill, chunk = _refilled(case, bufs, comm.world_size)
    return lambda t: t.calls("call", lambda: c.run(comm, bufs, case.algo), iters,
                             refill=refill, chunk=chunk, warmup=warmup)


def time_case(comm, case: BenchCase, bufs: Buffers, dev: torch.device, warmup: int,
              iters: int, rounds: int) -> list[float]:
    """Timed rounds of back-to-back calls of tilecomm alone (gpu_check's eager rows)."""
    m = collective_method(comm, case, bufs, warmup, iters)
    return measure(comm.barrier, {"m": m}, rounds, clock=Clock(dev))["m"].get("call", [])


def gloo_method(comm, case: BenchCase, warmup: int, iters: int):
    """The Gloo baseline's timed method on host tensors of the same sizes, or the first line
    of why Gloo cannot run it (tried once here, on every rank alike)."""
    import torch.distributed as dist
    c = CASES[case.op]
    d = DTYPE_BY_NAME[case.dtype].torch
    _, in_n, out_n = case_counts(case)
    gb = Buffers(torch.ones(in_n, dtype=d),
                 torch.zeros(out_n, dtype=d) if out_n is not None else None)
    try:
        c.baseline(dist, gb)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        return str(e).splitlines()[0][:80]
    refill, chunk = _refilled(case, gb, comm.world_size, "sum")    # the baselines sum
    return lambda t: t.calls("call", lambda: c.baseline(dist, gb), iters, refill=refill,
                             chunk=chunk, warmup=warmup)


def _variant(comm, name: str, case: BenchCase, bufs: Buffers, warmup: int, iters: int):
    """tilecomm on another of its paths (``variants``), on the same buffers."""
    from .variants import variant_method
    c = CASES[case.op]
    refill, chunk = _refilled(case, bufs, comm.world_size)
    c.run(comm, bufs, case.algo)            # every rank has published its start-up probe
    return variant_method(comm, name, lambda: c.run(comm, bufs, case.algo), iters, warmup,
                          refill=refill, chunk=chunk)


def rank_collective(comm, cfg: BenchConfig, case: BenchCase) -> dict:
    """On every rank: check (``--check``), time tilecomm and its baselines, check again."""
    dev = rank_device(comm, cfg.device)
    n = case_counts(case)[0]
    bufs = make_buffers(comm, case, dev)
    wrong = check_case(comm, case, bufs, dev) if cfg.check else None
    iters = cfg.iters or auto_iters(case.nbytes)
    warmup = cfg.warmup if cfg.warmup is not None else max(1, iters // 5)
    methods = {PRIMARY: collective_method(comm, case, bufs, warmup, iters)}
    res = {"count": n, "iters": iters, "errors": {}}
    for name in cfg.vs:
        m = gloo_method(comm, case, warmup, iters) if name == "gloo" else \
            _variant(comm, name, case, bufs, warmup, iters)
        if isinstance(m, str):
            res["errors"][name] = m
        else:
            methods[name] = m
    res["times"] = measure(comm.barrier, methods, cfg.rounds, clock=Clock(dev),
                           clocks={"gloo": Clock(torch.device("cpu"))})
    if cfg.check:   # once more after timing: the warm path (cached plans, memo) must be right too
        wrong += check_case(comm, case, bufs, dev, seed=2)
    res["wrong"] = wrong
    if case.algo == "auto" and comm.last_auto is not None:     # what auto ran, and why
        res["auto"] = comm.last_auto.to_json()
    return res


# ---- launcher side --------------------------------------------------------------------------
def heap_bytes_for(cfg: BenchConfig) -> int:
    biggest = max(cfg.sizes)
    return 2 * biggest + (8 << 20)


def device_heap_bytes_for(sizes: list[int], mem: str) -> int:
    """Device heap per rank: the heap tensors (input and output) plus both halves of staging
    scratch for each, and room for signal pads."""
    biggest = max(sizes)
    return max(256 << 20, (6 if mem == "heap" else 4) * biggest + (32 << 20))


def resolve_algos(cfg: BenchConfig) -> list[str]:
    if cfg.op == "send_recv":
        return ["p2p"]
    if cfg.algos == ["all"] and cfg.deterministic and \
            cfg.op in ("all_reduce", "reduce_scatter", "reduce"):
        from ..algorithms.lower import deterministic_algorithms
        return ["auto"] + deterministic_algorithms(cfg.op, cfg.world_size, 0,
                                                   among=candidates(cfg))
    if cfg.algos == ["all"]:        # auto beside every candidate it chooses from
        return ["auto"] + candidates(cfg)
    return cfg.algos


def candidates(cfg: BenchConfig) -> list[str]:
    """What ``auto`` chooses from in this bench's setting (the backend's algorithms)."""
    if cfg.hosts:
        from ..hier.backend import algorithms_across_hosts
        return algorithms_across_hosts(cfg.op, cfg.layout())
    if _kernel_path(cfg):
        if cfg.device == "cpu":     # the kernels run in the interpreter (ranks fork)
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from ..backends.triton import registry
        return registry.supported(cfg.op) or algorithms(cfg.op)
    return algorithms(cfg.op)


def _kernel_path(cfg: BenchConfig) -> bool:
    """The collectives run the Triton kernels (CUDA tensors, or TILECOMM_CPU_KERNELS=triton)."""
    from ..settings import settings
    return cfg.device != "cpu" or settings().cpu_kernels == "triton"


def validate(cfg: BenchConfig) -> None:
    """Arguments that cannot run are a ValueError before any rank starts."""
    if cfg.op not in CASES:
        raise ValueError(f"unknown operation {cfg.op!r}; choose one of {', '.join(CASES)}")
    if cfg.dtype not in DTYPE_BY_NAME:
        raise ValueError(f"unknown dtype {cfg.dtype!r}; choose one of {', '.join(DTYPE_BY_NAME)}")
    if CASES[cfg.op].reduces and not DTYPE_BY_NAME[cfg.dtype].reducible:
        raise ValueError(f"{cfg.op} reduces, and {cfg.dtype} supports data movement only; "
                         f"pick a float or int32/int64 dtype")
    dev = torch.device(cfg.device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {cfg.device!r}: use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: torch sees no CUDA device on this machine")
        if cfg.op == "send_recv":
            raise ValueError("send_recv on CUDA tensors is not implemented (device send/recv); "
                             "use --device cpu")
    algos = resolve_algos(cfg)
    known = algorithms(cfg.op)
    if cfg.hosts:
        if sum(cfg.hosts) != cfg.world_size:
            raise ValueError(f"--hosts: {cfg.hosts} ranks per host make {sum(cfg.hosts)} "
                             f"ranks, but -n is {cfg.world_size}")
        if dev.type != "cpu":
            raise ValueError("--hosts runs CPU ranks on simulated hosts; use --device cpu")
        known = candidates(cfg)
    for a in algos:
        if a not in ("auto", "p2p") and a not in known:
            raise ValueError(f"{cfg.op}: unknown algorithm {a!r}; choose from "
                             f"{', '.join(known)}, auto or all")


def run(cfg: BenchConfig, progress=None) -> list[dict]:
    """Run the benchmark; one row per (size, algorithm). ``progress(done, total, label)``."""
    if cfg.trace:
        validate(cfg)
        return _traced(cfg, progress)
    return harness.run(cfg, progress)


@contextlib.contextmanager
def _collective_group(cfg: BenchConfig):
    """The ranks (local, or on simulated hosts), with the MPS daemon of CUDA ranks that share
    a GPU stopped after them."""
    heap = heap_bytes_for(cfg) if cfg.mem == "heap" else (8 << 20)
    if cfg.hosts:
        from .hosts_group import HostsGroup
        with HostsGroup(cfg.hosts, timeout=cfg.timeout, heap_bytes=heap,
                        deterministic=cfg.deterministic) as group:
            yield group
        return
    from ..settings import settings
    mps = _mps_for(cfg, torch.device(cfg.device))
    try:
        with RankGroup(cfg.world_size, timeout=cfg.timeout, heap_bytes=heap,
                       deterministic=cfg.deterministic, env=mps.rank_env(),
                       leave_grace=settings().device_timeout + 5 if mps.state.active
                       else 0.0) as group:
            yield group
    finally:
        mps.stop()          # after the ranks are stopped


def _mps_for(cfg: BenchConfig, dev: torch.device):
    """The MPS daemon of a run whose CUDA ranks share a GPU (started; TILECOMM_MPS=auto),
    else one that was never started (``rank_env()`` empty). NOTE in tilecomm.mps."""
    from ..mps import MpsDaemon, ranks_per_device
    from ..settings import settings

    share = ranks_per_device(cfg.world_size, torch.cuda.device_count(), cfg.device) \
        if dev.type == "cuda" else 1
    daemon = MpsDaemon(share)
    if dev.type == "cuda" and settings().mps != "off" and (share > 1 or settings().mps == "on"):
        daemon.start()
    return daemon


def _traced(cfg: BenchConfig, progress) -> list[dict]:
    """``run`` with every rank tracing into ``cfg.trace`` (the ranks read TILECOMM_TRACE when
    their communicator is made), then the ranks' traces merged into ``cfg.trace/trace.json``."""
    from ..debug.trace import merge
    from ..settings import settings

    old = os.environ.get("TILECOMM_TRACE")
    os.environ["TILECOMM_TRACE"] = os.path.abspath(cfg.trace)
    settings.cache_clear()           # forked ranks inherit the cache: let them read it anew
    try:
        rows = run(replace(cfg, trace=None), progress)
    finally:
        if old is None:
            os.environ.pop("TILECOMM_TRACE", None)
        else:
            os.environ["TILECOMM_TRACE"] = old
        settings.cache_clear()
    merge(cfg.trace, os.path.join(cfg.trace, "trace.json"))
    return rows


def _row(cfg, case: BenchCase, res, rates, itemsize) -> dict:
    w = cfg.world_size
    c = CASES[cfg.op]
    count = res[0]["count"]
    size = count * itemsize
    algo = case.algo
    choice = res[0].get("auto")
    used = choice["algo"] if choice else ("p2p" if cfg.op == "send_recv" else algo)
    timing = harness.case_row(cfg.kind, case.id, res, list(cfg.vs), cfg.max_spread)
    t = timing["time_us"] / 1e6
    algbw = size / t / 1e9
    row = {"case": case.id, "bench": cfg.kind, "collective": cfg.op, "algo": used,
           "requested": algo, "world_size": w, "bytes": size, "count": count,
           "dtype": cfg.dtype, "mem": cfg.mem, "device": cfg.device, "redop": cfg.redop,
           "deterministic": cfg.deterministic, **timing, "algbw_gbs": algbw,
           **({"auto_ranked": choice["ranked"][:2], "auto_source": choice["source"]}
              if choice else {}),
           "busbw_gbs": algbw * c.factor(w), "iters": res[0]["iters"], "rounds": cfg.rounds}
    if cfg.check:
        row["wrong"] = sum(r["wrong"] for r in res)
    for name in cfg.vs:
        if f"{name}_time_us" in row:
            row[f"{name}_busbw_gbs"] = size / row[f"{name}_time_us"] / 1e3 * c.factor(w)
        else:
            row[f"{name}_error"] = res[0]["errors"].get(name, "unsupported")
    if rates is not None and cfg.op not in ("send_recv", "all_to_all_v"):
        row.update(bound_fields(cfg, used, count, itemsize, rates, t))
    return row


def working_set(op: str, count: int, itemsize: int, world: int, staged: bool) -> int:
    """Bytes of every rank's buffers of one call together: each rank's input and output,
    twice over when they are staged through scratch (``mem=user``)."""
    c = CASES[op]
    per_rank = c.in_count(count, world) + (c.out_count(count, world) if c.out_count else 0)
    return world * per_rank * itemsize * (2 if staged else 1)


def bound_fields(cfg, algo: str, count: int, itemsize: int, rates: dict, t: float) -> dict:
    """The memory bound of a row at the level its working set is held to (``roofline``),
    and ``memcpy``: one copy of the largest buffer at that level's rate of one rank alone,
    the floor of any staged collective."""
    w, staged = cfg.world_size, cfg.mem != "heap"
    try:
        b, level = bound_seconds(cfg.op, algo, w, CASES[cfg.op].in_count(count, w), itemsize,
                                 staged, rates, working_set(cfg.op, count, itemsize, w, staged))
    except (KeyError, ValueError):
        return {}
    lv = rates[level]
    memcpy = count * itemsize / lv["copy"]
    return {"bound_us": b * 1e6, "frac_of_bound": b / t, "bound_level": level,
            "copy_gbs": lv["copy"] / 1e9, "add_gbs": lv["add"] / 1e9,
            "copy_all_gbs": lv["copy_all"] / 1e9, "add_all_gbs": lv["add_all"] / 1e9,
            "memcpy_time_us": memcpy * 1e6, "x_memcpy": memcpy / t}


def table(rows: list[dict], title: str = ""):
    """The collectives' table: nccl-tests' columns, then Gloo and the memory bound."""
    from .report import fmt, size_col, table as render

    lead = [size_col(), ("count", lambda r: str(r["count"])), ("type", lambda r: r["dtype"]),
            ("algo", lambda r: f"auto: {r['algo']}" if r.get("requested") == "auto"
             else r["algo"])]
    mid = [("algbw GB/s", lambda r: f"{r['algbw_gbs']:.3f}"),
           ("busbw GB/s", lambda r: f"{r['busbw_gbs']:.3f}")]
    if any("wrong" in r for r in rows):
        mid.append(("#wrong", lambda r: str(r.get("wrong", ""))))
    tail = []
    if any("frac_of_bound" in r for r in rows):
        tail = [("mem bound (us)", lambda r: fmt(r.get("bound_us"), ".1f")),
                ("bound at", lambda r: r.get("bound_level", "")),
                ("% of bound", lambda r: fmt(100 * r["frac_of_bound"], ".0f") + "%"
                 if "frac_of_bound" in r else "")]
    from .variants import VARIANTS
    names = {b for r in rows for b in ("gloo", *VARIANTS) if f"x_{b}" in r or f"{b}_error" in r}
    return render(rows, title, lead=lead, mid=mid, tail=tail, unit="us",
                  errors={b: f"{b}_error" for b in names},
                  notes=[f"{b}: {VARIANTS[b]}" for b in VARIANTS if b in names])
