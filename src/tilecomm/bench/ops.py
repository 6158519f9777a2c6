"""``tilecomm bench ops``: the fused ops against the collective-then-matmul users write.

Cases: each of ``all_gather_matmul`` and ``matmul_reduce_scatter`` (``--fused``) at each
``--gemm MxKxN`` (``m`` rows per rank). Methods, timed in the same ranks, interleaved round by
round (:mod:`.harness`; a round is ``iters`` back-to-back calls after a barrier):

* **tilecomm**: the fused op (:mod:`tilecomm.ops`);
* **unfused**: ``torch.matmul(comm.all_gather(a), b)``, or
  ``comm.reduce_scatter(torch.matmul(a, b))``: the collective and the GEMM one after the other;
* **matmul**: the GEMM alone on data already in place (``[W*m, K] x [K, N]``), no
  communication: the floor a fused op can approach by hiding its communication.

``x unfused`` above 1: the fused op is faster; ``x matmul`` is at most 1 (1: all of the
communication hidden). ``wrong`` counts output elements that differ from the references of
:mod:`tilecomm.ops.reference` (the CPU engine's bits), checked before and after the timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import harness
from .harness import PRIMARY, Bench

FUSED = ("all_gather_matmul", "matmul_reduce_scatter")
BASELINES = ("unfused", "matmul")


@dataclass(frozen=True)
class OpsCase:
    op: str
    m: int
    k: int
    n: int
    dtype: str
    world: int

    @property
    def id(self) -> str:
        """``ops/<op>/<dtype>/<m>x<K>x<N>/w<W>`` (``m`` rows per rank)."""
        return f"ops/{self.op}/{self.dtype}/{self.m}x{self.k}x{self.n}/w{self.world}"


def parse_gemm(text: str) -> list[tuple[int, int, int]]:
    """``"256x1024x1024,64x512x512"`` -> ``[(256, 1024, 1024), (64, 512, 512)]``."""
    out = []
    for part in text.split(","):
        dims = part.lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"--gemm {part!r}: write MxKxN (m rows per rank), e.g. 256x1024x1024")
        out.append(tuple(int(d) for d in dims))
    return out


@dataclass
class OpsBenchConfig(Bench):
    world_size: int = 2
    ops: list[str] = field(default_factory=lambda: list(FUSED))
    shapes: list[tuple[int, int, int]] = field(default_factory=lambda: [(256, 1024, 1024)])
    dtype: str = "float32"
    iters: int = 1
    rounds: int = 5
    timeout: float = 300.0
    hosts: list[int] | None = None
    max_spread: float = harness.MAX_SPREAD

    kind = "ops"
    uses_gloo = False

    @property
    def rank_case(self):
        return rank_ops

    @property
    def heap_bytes(self) -> int:
        item = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        big = max(self.world_size * m * max(k, n) for m, k, n in self.shapes) * item
        return 4 * big + (64 << 20)

    def validate(self) -> None:
        for op in self.ops:
            if op not in FUSED:
                raise ValueError(f"bench ops: unknown fused op {op!r}; choose from "
                                 f"{', '.join(FUSED)}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"bench ops: -d {self.dtype}: the fused ops take float32, "
                             f"bfloat16 or float16")
        if self.hosts:
            raise ValueError("bench ops runs on one host (no --hosts)")

    def cases(self) -> list[OpsCase]:
        return [OpsCase(op, m, k, n, self.dtype, self.world_size)
                for m, k, n in self.shapes for op in self.ops]

    def row(self, case: OpsCase, per_rank: list[dict], ctx: dict) -> dict:
        row = harness.case_row(self.kind, case.id, per_rank, list(BASELINES), self.max_spread)
        w = case.world
        # 2 W m K N flops per rank's share of the product (the whole [W*m, N] output for
        # all_gather_matmul; a [W*m, N] partial for matmul_reduce_scatter)
        flops = 2 * w * case.m * case.k * case.n
        row.update(op=case.op, m=case.m, k=case.k, n=case.n, dtype=case.dtype, world_size=w,
                   iters=self.iters, rounds=self.rounds,
                   tflops=flops / row["time_us"] / 1e6,
                   wrong=sum(r["wrong"] for r in per_rank))
        return row


def _inputs(case: OpsCase, rank: int):
    """Rank ``rank``'s ``(a, b)`` (seeded: every rank can rebuild every rank's inputs)."""
    g = torch.Generator().manual_seed(1000 * rank + 7)
    dt = getattr(torch, case.dtype)
    rows = case.m if case.op == "all_gather_matmul" else case.world * case.m
    return (torch.randn(rows, case.k, generator=g).to(dt),
            torch.randn(case.k, case.n, generator=g if case.op != "all_gather_matmul"
                        else torch.Generator().manual_seed(7)).to(dt))


def _expected(case: OpsCase, rank: int) -> torch.Tensor:
    from ..ops import all_gather_matmul_reference, matmul_reduce_scatter_reference
    ins = [_inputs(case, r) for r in range(case.world)]
    if case.op == "all_gather_matmul":
        return all_gather_matmul_reference([a for a, _ in ins], ins[0][1])[0]
    return matmul_reduce_scatter_reference([a for a, _ in ins], [b for _, b in ins])[rank]


def _calls(fn, iters: int):
    """The method of ``iters`` back-to-back calls of ``fn`` per round."""
    return lambda t: t.calls("call", fn, iters)


def rank_ops(comm, cfg: OpsBenchConfig, case: OpsCase) -> dict:
    """On every rank: check, time the fused op, the unfused pair and the GEMM alone, check."""
    from ..ops import all_gather_matmul, matmul_reduce_scatter
    from .timing import measure

    a, b = _inputs(case, comm.rank)
    want = _expected(case, comm.rank)
    if case.op == "all_gather_matmul":
        fused = lambda: all_gather_matmul(a, b, comm)                  # noqa: E731
        unfused = lambda: torch.matmul(comm.all_gather(a), b)          # noqa: E731
        whole = torch.cat([a] * case.world)
        alone = lambda: torch.matmul(whole, b)                         # noqa: E731
    else:
        fused = lambda: matmul_reduce_scatter(a, b, comm)              # noqa: E731
        unfused = lambda: comm.reduce_scatter(torch.matmul(a, b))      # noqa: E731
        alone = lambda: torch.matmul(a, b)                             # noqa: E731

    def wrong() -> int:
        got = fused()
        return int(want.numel()) if got.shape != want.shape else int((got != want).sum())

    bad = wrong()
    methods = {name: _calls(f, cfg.iters)
               for name, f in ((PRIMARY, fused), ("unfused", unfused), ("matmul", alone))}
    with torch.no_grad():
        times = measure(comm.barrier, methods, cfg.rounds)
    return {"times": times, "wrong": bad + wrong()}


def table(rows: list[dict], title: str = ""):
    """The rich table ``tilecomm bench ops`` prints."""
    from .report import num, table as render

    lead = [("op", lambda r: r["op"]), ("m x K x N", lambda r: f"{r['m']}x{r['k']}x{r['n']}"),
            ("type", lambda r: r["dtype"])]
    mid = [("TFLOP/s", lambda r: num(r["tflops"])), ("#wrong", lambda r: str(r["wrong"]))]
    return render(rows, title, lead=lead, mid=mid, unit="ms")
