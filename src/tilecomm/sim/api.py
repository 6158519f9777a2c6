"""Python API: ``predict`` / ``best`` / ``why`` for a collective on a system.

Rows name what the runtime accepts as ``algo=`` on ranks placed like the system
(``sim/offered.py``): the registry's algorithms on one node, the hierarchical ones across
nodes (timed from their own plans, ``sim/hierflows.py``). ``what_if=True`` adds what the model
times but the runtime does not run (NCCL's ``nvls`` and ``dbtree``, ``bruck``, the ring-based
``hierarchical``, flat schedules across nodes), each marked ``Prediction.what_if``.

>>> from tilecomm.sim import predict, best
>>> best("all_reduce", 1 << 30, system="dgx-h100").algo
'two_shot'
>>> best("all_reduce", 1 << 30, system="dgx-h100", what_if=True).algo
'nvls'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from tilecomm.algorithms import BUSBW_FACTOR, algorithms
from tilecomm.hier.plans import hier_algorithms
from tilecomm.topology import SystemSpec, Topology, build

from . import builders
from .analytic import alpha_beta, dbtree_time, nvls_time
from .engine import simulate
from .flowsched import FlowSchedule, from_registered
from .hierflows import hier_flows, moves_estimate
from .offered import host_layout, is_what_if, runtime_algorithms, what_if_algorithms

GB = 1e3
# Registered schedules materialize every move (and are lowered per rank); above this many
# we use builders or skip.
MAX_REGISTERED_MOVES = 300_000
#: registered algorithms with a numpy builder of the same traffic (tested): never too large
FAST_PATHS = ("ring", "rhd")


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one algorithm (with its best protocol) at one size."""

    collective: str
    algo: str
    protocol: str
    nbytes: int
    world_size: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    bottleneck: str     # link kind that limited the slowest flows longest ("latency" if alpha)
    method: str         # "events" | "phases" (simulated) or "analytic"
    what_if: bool = False   # modeled, not in the runtime (sim/offered.py)

    def as_dict(self) -> dict:
        return asdict(self)


def _moves_estimate(collective: str, algo: str, w: int) -> int:
    if algo in ("ring", "pairwise"):
        return 2 * w * w
    if algo in ("tree", "recursive_doubling"):
        return w * max(1, w.bit_length())
    return 2 * w * w


def _is_hier(collective: str, algo: str, topo: Topology) -> bool:
    """``algo`` is a hierarchical algorithm timed across ``topo``'s nodes from its plans."""
    return topo.nodes > 1 and algo in hier_algorithms(collective, host_layout(topo))


def flow_schedule(collective: str, algo: str, topo: Topology) -> FlowSchedule | None:
    """The flow schedule of ``algo`` on ``topo`` (None when it is analytic-only or too large)."""
    w = topo.world_size
    if algo == "ring" and collective in ("all_reduce", "all_gather", "reduce_scatter"):
        return builders.ring(collective, w)
    if algo == "rhd" and collective == "all_reduce":
        return builders.rhd(collective, w)      # the registered rhd's traffic, at any scale
    if algo == "hierarchical":
        return builders.hierarchical(collective, topo.nodes, topo.gpus)
    if algo == "bruck":
        return builders.bruck(collective, w)
    if collective == "send_recv":
        return builders.send_recv(w)
    if _is_hier(collective, algo, topo):
        if _too_large(collective, algo, topo):
            return None
        return hier_flows(collective, algo, host_layout(topo))
    if algo in algorithms(collective):
        if _moves_estimate(collective, algo, w) > MAX_REGISTERED_MOVES:
            return None
        return from_registered(collective, algo, w)
    return None


def _modeled(collective: str, topo: Topology, what_if: bool = False) -> list[str]:
    """The algorithms the model has for ``collective`` on ``topo``, whatever their size: the
    runtime's (``sim/offered.py``), plus the what-ifs when asked for."""
    out = runtime_algorithms(collective, topo)
    if what_if:
        out += [a for a in what_if_algorithms(collective, topo) if a not in out]
    return out


def _too_large(collective: str, algo: str, topo: Topology) -> bool:
    """Schedules materialized move by move (registered, or hierarchical plans flattened)
    above MAX_REGISTERED_MOVES."""
    if _is_hier(collective, algo, topo):
        return moves_estimate(collective, algo, host_layout(topo)) > MAX_REGISTERED_MOVES
    return (algo in algorithms(collective) and algo not in FAST_PATHS and
            _moves_estimate(collective, algo, topo.world_size) > MAX_REGISTERED_MOVES)


def candidates(collective: str, topo: Topology, what_if: bool = False) -> list[str]:
    """Algorithms the model can time for ``collective`` on ``topo``: names the runtime accepts
    there, plus (``what_if``) those it models but the runtime does not run."""
    return [a for a in _modeled(collective, topo, what_if)
            if not _too_large(collective, a, topo)]


def skipped(collective: str, topo: Topology, what_if: bool = False) -> list[str]:
    """Algorithms the model has but drops on ``topo`` for size (too many moves to simulate)."""
    return [a for a in _modeled(collective, topo, what_if) if _too_large(collective, a, topo)]


def check_algo(collective: str, algo: str, topo: Topology, what_if: bool = False) -> None:
    """ValueError unless ``algo`` can be timed for ``collective`` on ``topo``, saying why."""
    where = f"{collective} on {topo.spec.name} x{topo.nodes}"
    if algo in candidates(collective, topo, what_if):
        return
    if algo == "nvls" and collective == "all_reduce":
        if not topo.spec.nvls:
            raise ValueError(f"nvls needs NVSwitch in-switch reduction (NVLink SHARP); "
                             f"{topo.spec.name} has no NVLS")
        if topo.nodes > 1:
            raise ValueError("nvls is modeled within one NVLink domain only: multi-node NVLS "
                             "(NVLS+tree over the network) is not modeled; use --nodes 1")
    offered = candidates(collective, topo, what_if)
    choose = ", ".join(offered)
    why_not = {
        ("all_reduce", "hierarchical"):
            "hierarchical needs more than one node and more than one GPU per node",
        ("all_to_all", "bruck"): "bruck needs more than one rank",
    }
    if algo in ("hierarchical", "dbtree", "nvls", "bruck") and \
            topo.spec.shm is not None and topo.nodes == 1:
        raise ValueError(f"on one shared-memory host ({topo.spec.name}) only the runtime's "
                         f"algorithms are modeled; choose from {choose}")
    if (collective, algo) in why_not and algo not in _modeled(collective, topo, True):
        raise ValueError(why_not[(collective, algo)])
    if algo in _modeled(collective, topo, True) and _too_large(collective, algo, topo):
        raise ValueError(f"{collective}/{algo} on {topo.world_size} ranks is too large to "
                         f"simulate (over {MAX_REGISTERED_MOVES} moves); choose from {choose}")
    runtime = ", ".join(runtime_algorithms(collective, topo))
    if algo in _modeled(collective, topo, True):      # modeled, but not what the runtime runs
        scope = (f"across {topo.nodes} nodes the runtime runs {runtime}" if topo.nodes > 1
                 else f"the runtime runs {runtime}")
        raise ValueError(f"{algo} is a what-if for {where}: modeled, not in the runtime "
                         f"({scope}); pass what_if=True (tilecomm sim --what-if) to time it")
    if topo.nodes == 1 and algo in hier_algorithms(collective):
        raise ValueError(f"{algo} runs on ranks across hosts; on one node choose from {choose}")
    extra = [a for a in candidates(collective, topo, True) if a not in offered]
    also = f" (with --what-if also {', '.join(extra)})" if extra else ""
    raise ValueError(f"unknown algorithm {algo!r} for {where}; choose from {choose}{also}")


def _shm_one(collective: str, algo: str, topo: Topology, nbytes: int, mem: str) -> Prediction:
    """A registered algorithm on one shared-memory host: the runtime's own cost model."""
    from .cpu_loop import NAMES, breakdown
    w = topo.world_size
    p = topo.spec.shm
    ranks = sorted({0, 1 % w, w - 1})
    t = max(breakdown(p, collective, algo, w, nbytes, mem, 4, [r]).sum() for r in ranks)
    parts = dict(zip(NAMES, breakdown(p, collective, algo, w, nbytes, mem, 4, ranks)))
    fixed = parts["call_us"] + parts["sync_us"] + parts["op_us"]
    moved = {k: v for k, v in parts.items() if k not in ("call_us", "sync_us", "op_us")}
    bott = "latency" if fixed >= sum(moved.values()) else max(moved, key=moved.get)
    factor = BUSBW_FACTOR.get(collective, lambda n: 1.0)(w)
    algbw = nbytes / (t * GB) if t > 0 else float("inf")
    return Prediction(collective, algo, f"shm/{mem}", int(nbytes), w, t, algbw, algbw * factor,
                      bott, "shm-model")


def _one(collective: str, algo: str, topo: Topology, nbytes: int, protocol: str | None,
         engine: str, mem: str = "user") -> Prediction:
    spec = topo.spec
    w = topo.world_size
    if spec.shm is not None and topo.nodes == 1 and algo in algorithms(collective) and \
            (protocol or "shm").lower() == "shm":
        return _shm_one(collective, algo, topo, nbytes, mem)
    protos = [spec.protocol(protocol)] if protocol else list(spec.protocols)
    # Analytic algorithms: latency-bound when the size-independent (alpha) term exceeds the
    # data term, else the link class that sets their bandwidth.
    if algo == "nvls":
        t, proto_name, method = nvls_time(topo, nbytes), "NVLS", "analytic"
        alpha = nvls_time(topo, 0)
        bott = "latency" if alpha >= t - alpha else "nvswitch"
    elif algo == "dbtree":
        t, proto_name = min((dbtree_time(topo, p, nbytes), p.name) for p in protos)
        pr = spec.protocol(proto_name)
        alpha = dbtree_time(topo, pr, 0)
        link = spec.gpu_link_GBps if topo.nodes == 1 else min(
            spec.gpu_link_GBps, topo.nic_GBps * topo.nics / topo.gpus)
        if alpha >= t - alpha:
            bott = "latency"
        elif spec.reduce_GBps < link * pr.eff:
            bott = "reduce"
        else:
            bott = "nic_tx" if topo.nodes > 1 and link < spec.gpu_link_GBps else "gpu_tx"
        method = "analytic"
    else:
        fs = flow_schedule(collective, algo, topo)
        if fs is None:
            raise ValueError(f"{collective}/{algo} on {w} ranks is too large to simulate")
        # Simulate the protocols whose uncontended estimate is within 1.5x of the best.
        est = {p.name: alpha_beta(fs, topo, p, nbytes) for p in protos}
        lo = min(est.values())
        res = [(simulate(fs, topo, p, nbytes, engine), p.name) for p in protos
               if est[p.name] <= 1.5 * lo]
        r, proto_name = min(res, key=lambda x: x[0].time_us)
        t, method = r.time_us, r.engine
        fixed = spec.launch_us + spec.protocol(proto_name).base_us
        moved = sum(r.time_by_kind.values())
        bott = r.bottleneck
        lat = t - fixed - moved  # time not spent moving data: latency-bound
        if lat + fixed > moved:
            bott = "latency"
    factor = BUSBW_FACTOR.get(collective, lambda n: 1.0)(w)
    algbw = nbytes / (t * GB) if t > 0 else float("inf")
    return Prediction(collective, algo, proto_name, int(nbytes), w, t, algbw, algbw * factor,
                      bott, method)


def predict(collective: str, nbytes: int, system: str | SystemSpec = "dgx-h100",
            nodes: int = 1, gpus: int | None = None, algo: str = "all",
            protocol: str | None = None, engine: str = "auto",
            mem: str = "user", what_if: bool = False) -> list[Prediction]:
    """Predicted time of ``collective`` on ``nbytes`` for each algorithm (or ``algo``).

    ``system``: preset name, .json path or :class:`SystemSpec`; ``gpus``: ranks per node
    (default: all GPUs of the node). ``mem`` (shared-memory systems): ``user`` tensors are
    staged through scratch, ``heap`` tensors (``comm.alloc``) are read in place.
    ``what_if``: also algorithms the runtime does not run (``Prediction.what_if`` marks them);
    without it every row names an ``algo=`` the runtime accepts on that placement. Sorted
    fastest first.
    """
    topo = build(system, nodes, gpus)
    if algo == "all":
        names = candidates(collective, topo, what_if)
    else:
        check_algo(collective, algo, topo, what_if)
        names = [algo]
    preds = [replace(_one(collective, a, topo, nbytes, protocol, engine, mem),
                     what_if=is_what_if(collective, a, topo)) for a in names]
    return sorted(preds, key=lambda p: p.time_us)


def best(collective: str, nbytes: int, what_if: bool = False, **kw) -> Prediction:
    """The fastest algorithm: the choice a tuner with this model would make (among the
    runtime's algorithms; ``what_if`` adds the model-only ones)."""
    return _fastest(predict(collective, nbytes, what_if=what_if, **kw), collective)


def _fastest(preds: list[Prediction], collective: str) -> Prediction:
    if not preds:       # every algorithm dropped for size (``skipped``)
        raise ValueError(f"no algorithm of {collective} is small enough to simulate here "
                         f"(over {MAX_REGISTERED_MOVES} moves); what_if=True adds the model's "
                         f"others")
    return preds[0]


def why(collective: str, nbytes: int, **kw) -> str:
    """One paragraph: which algorithm wins, by how much, and which link limits it."""
    preds = predict(collective, nbytes, **kw)
    b = _fastest(preds, collective)
    lines = [f"{collective} of {nbytes} B on {b.world_size} ranks: best is {b.algo}/{b.protocol} "
             f"at {b.time_us:.1f} us (busbw {b.busbw_GBps:.1f} GB/s, {b.method})."]
    if b.bottleneck == "latency":
        lines.append("It is latency-bound: per-step and launch latency exceed transfer time.")
    else:
        lines.append(f"Its bottleneck is the {b.bottleneck} links.")
    for p in preds[1:]:
        lines.append(f"  {p.algo:>18}: {p.time_us:10.1f} us ({p.time_us / b.time_us:.2f}x), "
                     f"bottleneck {p.bottleneck}")
    return "\n".join(lines)


def predict_nccl(collective: str, nbytes: int, system: str | SystemSpec = "dgx-h100",
                 nodes: int = 1, gpus: int | None = None, algos=None):
    """``--library nccl``: what nccl-tests would report, NCCL's choice first (sim/ncclsim.py).

    Rows are :class:`~tilecomm.sim.ncclsim.NcclRow`; the class parameters are those fitted on
    every published system (sim/data/nccl_fit.json). Pair with :func:`band` for the range.
    """
    from .crossval import load_fit
    from .ncclsim import nccl_rows
    prm, _ = load_fit()
    return nccl_rows(collective, nbytes, build(system, nodes, gpus), prm, algos)


def band(time_us: float, nbytes: int) -> tuple[float, float]:
    """(low, high) range of the measured time for a prediction of ``time_us`` at ``nbytes``,
    from the leave-one-system-out residuals of its size regime (sim/data/nccl_fit.json)."""
    from .crossval import band_of, load_fit
    return band_of(time_us, nbytes, load_fit()[1])
