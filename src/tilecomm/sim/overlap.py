"""Model of compute-communication overlap for tensor parallelism: what the fused
all_gather_matmul / matmul_reduce_scatter (``tilecomm.ops``) buy on a given system.

Inputs: the GEMM (``M`` rows in all, inner ``K``, ``N`` columns in all), the TP degree ``W``
and the dtype. Per rank:

* all_gather_matmul (column parallel): ``A [M, K]`` gathered from ``W`` shards of ``M/W``
  rows, times ``B [K, N/W]``; the collective is an all_gather of ``M*K`` elements.
* matmul_reduce_scatter (row parallel): ``A [M, K/W]`` times ``B [K/W, N]``, the ``[M, N]``
  product reduce-scattered.

GEMM time: the roofline of the GPU, ``max(flops / (peak * gemm_eff), bytes / HBM)`` with the
dense tensor peak of :mod:`tilecomm.topology.gpus` and one stated GEMM efficiency
(:data:`GEMM_EFF`); collective time: the simulator (:func:`tilecomm.sim.api.best`, the fastest
tilecomm algorithm on the system).

Unfused: ``t_comm + t_gemm``. Fused: the chunk pipeline the kernels run, ``W`` chunks of
``M/W`` rows, the collective's time spread evenly over its ``W - 1`` steps
(``s = t_comm / (W-1)``, each chunk's GEMM ``c = t_gemm / W``):

* all-gather: the own chunk needs no data; chunk ``j`` (``j >= 1``) arrives at ``j * s`` and
  is multiplied after chunk ``j - 1``: ``f_0 = c``, ``f_j = max(f_{j-1}, j*s) + c``.
* reduce-scatter: the partial of the ``j``-th destination is computed at ``(j+1) * c`` and
  sent after the previous send; the own rows come last, then a rank-order reduction of ``W``
  partials (read from HBM; in the input dtype, as tilecomm.ops moves them):
  ``max(W*c, last send) + t_reduce``.

It assumes the GEMM runs as fast while the copies run (copies by the copy engine or by few
SMs, and HBM/NVLink traffic that does not slow the GEMM) and that a chunk GEMM of ``M/W`` rows
runs at the full GEMM's efficiency: both optimistic, so the fused time is a lower bound of
what such a kernel reaches. ``hidden`` = the fraction of the collective's time the overlap
removes from the critical path: ``(unfused - fused) / t_comm``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: the fraction of the dense tensor-core peak a large GEMM reaches (stated assumption, one for
#: every GPU: cuBLAS-class bf16 GEMMs of these sizes run at roughly 0.6-0.8 of dense peak)
GEMM_EFF = 0.7
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class OverlapPrediction:
    op: str              # "all_gather_matmul" | "matmul_reduce_scatter"
    system: str
    tp: int
    m: int
    k: int
    n: int
    dtype: str
    gemm_us: float
    comm_us: float
    comm_algo: str
    unfused_us: float
    fused_us: float
    hidden: float        # fraction of comm_us removed from the critical path
    speedup: float       # unfused / fused

    def as_dict(self) -> dict:
        return asdict(self)


def gemm_us(m: int, k: int, n: int, spec, dtype: str = "bf16", gemm_eff: float = GEMM_EFF
            ) -> float:
    """Roofline time (us) of one ``[m, k] x [k, n]`` GEMM on ``spec``'s GPU."""
    from ..topology.gpus import gpu_of

    gpu = gpu_of(spec)
    peak = gpu.peak("bf16" if dtype == "fp32" else dtype)
    if dtype == "fp32":
        peak /= 2       # TF32 tensor cores: half the 16-bit rate (an fp32 GEMM at TF32)
    e = ITEMSIZE[dtype]
    flops = 2.0 * m * k * n
    bytes_ = e * (m * k + k * n + m * n)
    return max(flops / (peak * gemm_eff), bytes_ / (spec.mem_GBps * 1e9)) * 1e6


def pipeline_all_gather(t_comm: float, t_gemm: float, w: int) -> float:
    """Fused all_gather_matmul time (the recurrence of the module docstring)."""
    if w <= 1:
        return t_gemm
    c, s = t_gemm / w, t_comm / (w - 1)
    f = c
    for j in range(1, w):
        f = max(f, j * s) + c
    return f


def pipeline_reduce_scatter(t_comm: float, t_gemm: float, w: int, t_reduce: float = 0.0
                            ) -> float:
    """Fused matmul_reduce_scatter time (the recurrence of the module docstring)."""
    if w <= 1:
        return t_gemm
    c, s = t_gemm / w, t_comm / (w - 1)
    sent = 0.0
    for j in range(w - 1):
        sent = max(sent, (j + 1) * c) + s
    return max(w * c, sent) + t_reduce


def exposed_comm(t_comm: float, t_gemm: float, w: int) -> float:
    """Communication left on the critical path when ``t_comm`` of TP collectives runs fused
    with ``t_gemm`` of GEMMs as the all-gather pipeline does (``fused - t_gemm``); what
    ``tilecomm model --tp-overlap`` charges (tilecomm.workloads.training)."""
    return max(0.0, pipeline_all_gather(t_comm, t_gemm, w) - t_gemm)


def predict_overlap(op: str, m: int, k: int, n: int, tp: int, system="dgx-h100",
                    dtype: str = "bf16", gemm_eff: float = GEMM_EFF, partials: str = "input"
                    ) -> OverlapPrediction:
    """Unfused and fused time of one TP GEMM (see the module docstring for the shapes).
    ``partials``: what matmul_reduce_scatter moves, ``input`` (partials rounded to the input
    dtype before the transfer: tilecomm.ops, PyTorch's async-TP, NCCL's reduce_scatter) or
    ``fp32`` (a what-if: float32 partials, twice the bytes of 16-bit data)."""
    from ..topology import build
    from .api import best

    if op not in ("all_gather_matmul", "matmul_reduce_scatter"):
        raise ValueError(f"op must be all_gather_matmul or matmul_reduce_scatter, got {op!r}")
    if dtype not in ITEMSIZE:
        raise ValueError(f"dtype must be one of {', '.join(ITEMSIZE)}, got {dtype!r}")
    for name, v in (("m", m), ("k", k), ("n", n), ("tp", tp)):
        if v <= 0:
            raise ValueError(f"--{name} must be positive, got {v}")
    for name, v in (("m", m), ("n" if op == "all_gather_matmul" else "k",
                                n if op == "all_gather_matmul" else k)):
        if v % tp:
            raise ValueError(f"--{name} ({v}) must be a multiple of --tp ({tp})")
    topo = build(system, 1, tp)
    spec = topo.spec
    e = ITEMSIZE[dtype]
    if op == "all_gather_matmul":
        t_gemm = gemm_us(m, k, n // tp, spec, dtype, gemm_eff)
        coll = best("all_gather", m * k * e, system=spec, gpus=tp)
        fused = pipeline_all_gather(coll.time_us, t_gemm, tp)
    else:
        t_gemm = gemm_us(m, k // tp, n, spec, dtype, gemm_eff)
        # the fused op reduce-scatters partials in the input dtype (tilecomm.ops) or, as a
        # what-if, float32 ones; the rank-order sum reads the W partials of its rows
        coll = best("reduce_scatter", m * n * e, system=spec, gpus=tp)
        pe = 4 if partials == "fp32" else e
        t_red = tp * (m // tp) * n * pe / (spec.mem_GBps * 1e9) * 1e6
        moved = pe / e
        fused = pipeline_reduce_scatter(coll.time_us * moved, t_gemm, tp, t_red)
    unfused = coll.time_us + t_gemm
    hidden = (unfused - fused) / coll.time_us if coll.time_us > 0 else 0.0
    return OverlapPrediction(op, spec.name, tp, m, k, n, dtype, t_gemm, coll.time_us,
                             coll.algo, unfused, fused, hidden, unfused / fused)


def add_overlap_args(p) -> None:
    """The options of ``tilecomm sim overlap`` (sim/cli.py registers them)."""
    p.add_argument("--tp", type=int, default=8, help="overlap: tensor-parallel degree")
    p.add_argument("--m", type=int, default=8192, help="overlap: rows (tokens) in all")
    p.add_argument("--k", type=int, default=8192, help="overlap: inner dimension in all")
    p.add_argument("--n", type=int, default=28672, help="overlap: columns in all")
    p.add_argument("--dtype", default="bf16", choices=sorted(ITEMSIZE), help="overlap: dtype")
    p.add_argument("--op", default="both", choices=["both", "all_gather_matmul",
                                                    "matmul_reduce_scatter"])
    p.add_argument("--partials", default="input", choices=["input", "fp32"],
                   help="overlap: matmul_reduce_scatter moves partials in the input dtype "
                        "(tilecomm.ops) or, as a what-if, float32 partials")
    p.add_argument("--gemm-eff", type=float, default=GEMM_EFF,
                   help=f"overlap: fraction of dense peak a GEMM reaches ({GEMM_EFF})")


def run_overlap(args) -> int:
    """``tilecomm sim overlap``: a table (or JSON with ``--json F``) of both ops."""
    import json

    ops = ["all_gather_matmul", "matmul_reduce_scatter"] if args.op == "both" else [args.op]
    preds = [predict_overlap(op, args.m, args.k, args.n, args.tp, args.system, args.dtype,
                             args.gemm_eff, args.partials) for op in ops]
    print(f"{preds[0].system}, TP {args.tp}, M={args.m} K={args.k} N={args.n} {args.dtype} "
          f"(GEMM at {args.gemm_eff:.2f} of dense peak)")
    print(f"{'op':24} {'gemm us':>9} {'comm us':>9} {'algo':>10} {'unfused us':>11} "
          f"{'fused us':>9} {'hidden':>7} {'speedup':>8}")
    for p in preds:
        print(f"{p.op:24} {p.gemm_us:9.1f} {p.comm_us:9.1f} {p.comm_algo:>10} "
              f"{p.unfused_us:11.1f} {p.fused_us:9.1f} {p.hidden:7.0%} {p.speedup:7.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([p.as_dict() for p in preds], f, indent=1)
    return 0
