"""``ExpertParallel``: MoE token dispatch to the ranks that own the chosen experts, and combine.

    ep = ExpertParallel(comm, num_experts=E, hidden=H, dtype=torch.bfloat16)
    d = ep.dispatch(x, topk_idx, topk_weights)      # x [T, H], topk_idx [T, K] int64 (-1: none)
    y = run_local_experts(d)                        # [R, H], weighted and summed per row
    out = ep.combine(y, d)                          # [T, H] on every source rank

The layer validates the call locally, agrees on it with the peers (:mod:`.checks`), lets an
engine move the rows, and builds the result's layout (:mod:`.dispatched`). Engines, chosen by
the tensors' device and where the ranks run (never by a backend's name):

* CPU tensors, one host: :class:`.cpu.CpuEngine` (shared memory, rows read in place);
* CPU tensors, several hosts: :class:`.hosts.HostsEngine` (a token crosses to each destination
  host once and fans out there);
* CUDA tensors, or CPU tensors with ``comm.cpu_kernels == "triton"``: the Triton kernels
  (:mod:`.kernel`; CPU tensors in the interpreter).

Every engine moves the same rows (:mod:`.routing`) and combines in the same float32 order, so
they give the same bits (tests compare them with :mod:`.reference`).
"""

from __future__ import annotations

import itertools

import torch

from ..agree import compare
from . import checks, fp8 as fp8mod, routing
from .dispatched import Dispatched, Grouped, Layout, weighted_rows
from .low_latency import capturing

_IDS = itertools.count(1)


class ExpertParallel:
    """Expert-parallel dispatch/combine over ``comm``: rank ``r`` owns experts
    ``[r*E/W, (r+1)*E/W)``. Collective: every rank constructs it with the same ``num_experts``,
    ``hidden`` and ``dtype`` (else :class:`~tilecomm.CommMismatch` on every rank)."""

    def __init__(self, comm, num_experts: int, hidden: int, dtype: torch.dtype = torch.bfloat16):
        self.comm = comm
        w = comm.world_size
        problem = ""
        if not isinstance(num_experts, int) or num_experts <= 0 or num_experts % w:
            problem = (f"num_experts ({num_experts!r}) must be a positive multiple of the world "
                       f"size ({w})")
        elif not isinstance(hidden, int) or hidden <= 0:
            problem = f"hidden must be a positive int, got {hidden!r}"
        elif dtype not in checks.DTYPES:
            problem = f"dtype must be float32, bfloat16 or float16, got {dtype}"
        dt = checks.DTYPES.index(dtype) if dtype in checks.DTYPES else -1
        mine = [int(bool(problem)), num_experts if isinstance(num_experts, int) else -1,
                hidden if isinstance(hidden, int) else -1, dt]
        descs = comm.exchange(mine)
        if problem:
            raise ValueError(f"ExpertParallel: {problem}")
        bad = [r for r, d in enumerate(descs) if d[0]]
        if bad:
            raise ValueError(f"ExpertParallel: rank {bad[0]} rejected its arguments")
        compare("ExpertParallel", descs,
                [(1, "num_experts", str), (2, "hidden", str),
                 (3, "dtype", lambda v: str(checks.DTYPES[v]).removeprefix("torch."))])
        self.num_experts, self.hidden, self.dtype = num_experts, hidden, dtype
        self.world = w
        self.el = num_experts // w
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.groups = routing.combine_groups([comm.layout.host_of(r) for r in range(w)])
        self._id = next(_IDS)
        self._calls = 0
        self._engines: dict[str, object] = {}
        self._ll: dict[tuple, list] = {}
        #: M of this layer's low-latency calls on the device (fixed by its first one, which
        #: the kernel engine agrees on with the peers)
        self.ll_max_tokens: int | None = None

    @property
    def experts_per_rank(self) -> int:
        return self.el

    def next_call(self) -> int:
        """The number of this layer's next call (dispatch or combine, the same on every rank;
        the backward passes of the autograd functions count as calls)."""
        self._calls += 1
        return self._calls

    # ---- engines ------------------------------------------------------------------------------
    def engine_for(self, device: torch.device):
        """The engine that moves this layer's rows for tensors on ``device`` (made on first
        use, collectively); for the layer's own steps and its autograd functions."""
        if device.type == "cuda" or self.comm.cpu_kernels == "triton":
            key = "kernel"
        elif self.comm.topology.num_hosts > 1:
            key = "hosts"
        else:
            key = "cpu"
        eng = self._engines.get(key)
        if eng is None:
            if key == "cpu":
                from .cpu import CpuEngine
                eng = CpuEngine(self.comm)
            elif key == "hosts":
                from .hosts import HostsEngine
                eng = HostsEngine(self.comm)
            else:
                from .kernel import KernelEngine
                eng = KernelEngine(self.comm, device)
            self._engines[key] = eng
        return eng

    # ---- dispatch -----------------------------------------------------------------------------
    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, *,
                 mode: str = "normal", max_tokens_per_rank: int | None = None,
                 fp8: bool = False) -> Dispatched:
        """Send every token row to the ranks owning one of its experts (collective).

        ``x [T, H]`` in the layer's dtype (T may differ per rank, may be 0), ``topk_idx [T, K]``
        int64 (experts in ``[0, E)`` or -1, none repeated in a row), ``topk_weights [T, K]``
        float32. ``mode="low_latency"`` needs ``max_tokens_per_rank=M >= T`` and returns the
        ``[E/W, W*M, H]`` layout (:class:`~.dispatched.Dispatched`). ``fp8=True``: rows
        travel as float8 e4m3 with a float32 scale per 128 channels (``d.scales``)."""
        call_id = self.next_call()
        grad = torch.is_grad_enabled() and any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in (x, topk_weights))
        problem, token, detail = self._check_dispatch(x, topk_idx, topk_weights, mode,
                                                      max_tokens_per_rank, fp8, grad)
        if (mode == "low_latency" and isinstance(x, torch.Tensor)
                and x.device.type in ("cpu", "cuda")
                and hasattr(self.engine_for(x.device), "ll_dispatch")):
            # the engine does it on the device: no handshake, no count read by the host
            return self._dispatch_ll_device(problem, detail, x, topk_idx, topk_weights,
                                            max_tokens_per_rank, fp8)
        ok = problem == 0
        w = self.world
        t = x.shape[0] if ok else 0
        k = topk_idx.shape[1] if ok else -1
        mask = routing.dest_mask(topk_idx, self.el, w) if ok else None
        mine = checks.describe("dispatch", mode, problem, token, e=self.num_experts,
                               h=self.hidden, k=k, dtype=self.dtype, fp8=fp8,
                               m=max_tokens_per_rank or 0, t=t, ready=False, call=call_id,
                               per_rank=routing.send_counts(mask) if ok else [0] * w,
                               grad=grad)
        if grad:                       # normal mode, not fp8 (checked): see .autograd
            from .autograd import dispatch_recorded
            return dispatch_recorded(self, mine, detail, x, topk_idx, topk_weights, mask)
        d = self.move_dispatch(mine, detail, x, topk_idx, topk_weights, mask, fp8)
        if mode == "low_latency":
            d = self._to_low_latency(d, max_tokens_per_rank)
        return d

    def move_dispatch(self, mine, detail, x, topk_idx, topk_weights, mask, fp8) -> Dispatched:
        """Move the rows (the engine) and build the normal-mode result; ``mine`` is this
        rank's descriptor (bad arguments: the engine's handshake raises on every rank)."""
        ok = mine[checks.F_PROBLEM] == 0
        w = self.world
        device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
        if ok:
            xs, scales = fp8mod.quantize(x) if fp8 else (x.contiguous(), None)
            idx, wts = topk_idx.contiguous(), topk_weights.contiguous()
        else:
            xs = scales = idx = wts = None
        mv = self.engine_for(device).dispatch(self, mine, detail, xs, scales, idx, wts)
        me = self.comm.rank
        layout = Layout(rank=me, world=w, el=self.el, hidden=self.hidden, dtype=self.dtype,
                        counts=mv.counts, tokens=mv.call.tokens(),
                        send_tokens=[mask[:, r].nonzero(as_tuple=True)[0] for r in range(w)],
                        call=mine[checks.F_CALL], groups=self.groups,
                        extra=dict(mv.extra, ep=self._id), sent_idx=idx, sent_weights=wts)
        lidx, lw = routing.local_topk(mv.idx, mv.weights, me, self.el)
        return Dispatched(x=mv.x, src_rank=mv.src_rank, src_token=mv.src_token, topk_idx=lidx,
                          topk_weights=lw,
                          tokens_per_expert=routing.tokens_per_expert(lidx, self.el),
                          layout=layout, scales=mv.scales)

    def _dispatch_ll_device(self, problem, detail, x, topk_idx, topk_weights, m,
                            fp8) -> Dispatched:
        """Low-latency mode on an engine that does it on the device (the kernel engine; NOTE
        [low latency on the device] in low_latency.py): no handshake per call. A bad
        topk_idx or too many tokens raise here and void the call on every rank (the rank
        takes part without rows); a bad type or shape raises here only, and the peers'
        bounded waits time out naming this rank."""
        eng = self.engine_for(x.device)
        if not problem and self.ll_max_tokens is not None and m != self.ll_max_tokens:
            problem, detail = 15, (f"this layer's low-latency calls have max_tokens_per_rank "
                                   f"{self.ll_max_tokens} (fixed by its first one), got {m}")
        if problem:
            exc, text = checks.PROBLEMS[problem]
            # _check_dispatch tests types and shapes before token counts and topk contents
            # (6, 7; 15 only once it found nothing), and gradients (14) before all of them
            sound = problem in (6, 7, 15) or (problem == 14 and self._check_dispatch(
                x, topk_idx, topk_weights, "low_latency", m, fp8, False)[0] in (0, 6, 7))
            if sound:       # take part with no rows: the peers' call fails too, at once
                empty = x[:0]
                k = topk_idx.shape[1]
                eng.ll_dispatch(self, *(fp8mod.quantize(empty) if fp8 else (empty, None)),
                                topk_idx[:0], torch.zeros((0, k), device=x.device), m,
                                refuse=True)
            raise exc(f"moe dispatch: {text}: {detail}")
        xs, scales = fp8mod.quantize(x) if fp8 else (x.contiguous(), None)
        out_x, out_s, src_rank, src_token, count, handle = eng.ll_dispatch(
            self, xs, scales, topk_idx.contiguous(), topk_weights.contiguous(), m)
        layout = Layout(rank=self.comm.rank, world=self.world, el=self.el, hidden=self.hidden,
                        dtype=self.dtype, counts=None, tokens=None, send_tokens=None, call=-1,
                        groups=self.groups, extra=dict(ep=self._id, low_latency=handle))
        return Dispatched(x=out_x, src_rank=src_rank, src_token=src_token, topk_idx=None,
                          topk_weights=None, tokens_per_expert=count, layout=layout,
                          mode="low_latency", scales=out_s, count=count, slot=None,
                          max_tokens_per_rank=m)

    def _check_dispatch(self, x, idx, wts, mode, m, fp8, grad) -> tuple[int, int, str]:
        """This rank's first problem: ``(id, token or -1, detail)`` (ids: checks.PROBLEMS)."""
        if mode not in ("normal", "low_latency"):
            return 13, -1, f"mode must be 'normal' or 'low_latency', got {mode!r}"
        if grad and mode == "low_latency":
            return 14, -1, ("low-latency mode is for inference (its buffers are reused between "
                            "calls); dispatch under torch.no_grad() or use mode='normal'")
        if grad and fp8:
            return 14, -1, ("fp8 rows carry no gradient; dispatch under torch.no_grad() or "
                            "without fp8")
        if not all(isinstance(v, torch.Tensor) for v in (x, idx, wts)):
            return 1, -1, "got " + ", ".join(type(v).__name__ for v in (x, idx, wts))
        if x.dim() != 2 or x.shape[1] != self.hidden:
            return 2, -1, f"x is {tuple(x.shape)}, hidden is {self.hidden}"
        if x.dtype != self.dtype:
            return 3, -1, f"x is {x.dtype}, the layer's dtype is {self.dtype}"
        if idx.dim() != 2 or idx.dtype != torch.int64 or idx.shape[0] != x.shape[0] \
                or idx.shape[1] < 1:
            return 4, -1, f"topk_idx is {tuple(idx.shape)} {idx.dtype}, x has {x.shape[0]} rows"
        if wts.dtype != torch.float32 or tuple(wts.shape) != tuple(idx.shape):
            return 5, -1, f"topk_weights is {tuple(wts.shape)} {wts.dtype}"
        if not (x.device == idx.device == wts.device):
            return 11, -1, f"x on {x.device}, topk_idx on {idx.device}, weights on {wts.device}"
        if x.device.type not in ("cpu", "cuda"):
            return 11, -1, f"tensors on {x.device} (use cpu or cuda)"
        if fp8:
            try:
                fp8mod.scale_blocks(self.hidden)
            except ValueError as e:
                return 2, -1, str(e)
        if mode == "low_latency":
            if not isinstance(m, int) or isinstance(m, bool) or m <= 0:
                return 12, -1, f"got {m!r}"
            if x.shape[0] > m:
                return 7, -1, f"{x.shape[0]} tokens, max_tokens_per_rank is {m}"
        if mode == "low_latency" and capturing(x.device):
            return 0, -1, ""    # reading idx would synchronize; the kernel skips bad entries
        bad = routing.check_topk(idx, self.num_experts)
        if bad is not None:
            return 6, bad[0], bad[1]
        return 0, -1, ""

    def _to_low_latency(self, d: Dispatched, m: int) -> Dispatched:
        """Scatter the rows into the ``[El, W*M, H]`` slots of a buffer this layer keeps per
        (M, fp8) and alternates between calls (a result stays valid until the second
        low-latency dispatch after it)."""
        w, el, h = self.world, self.el, self.hidden
        key = (m, d.scales is not None)
        bufs = self._ll.get(key)
        if bufs is None:
            dt = d.x.dtype
            nb = d.scales.shape[1] if d.scales is not None else 0
            dev = d.x.device
            slots = [[torch.empty((el, w * m, h), dtype=dt, device=dev),
                      torch.empty((el, w * m, nb), dtype=torch.float32, device=dev),
                      torch.empty((el, w * m), dtype=torch.int64, device=dev),
                      torch.empty((el, w * m), dtype=torch.int64, device=dev)]
                     for _ in range(2)]
            bufs = self._ll[key] = [slots, [0]]
        slots, turn = bufs
        x_ll, s_ll, rank_ll, tok_ll = slots[turn[0] % 2]
        turn[0] += 1
        rows, ks = (d.topk_idx >= 0).nonzero(as_tuple=True)      # row-major: (s, t), then k
        experts = d.topk_idx[rows, ks]
        src = d.src_rank[rows]
        key_es = experts * w + src
        order = torch.sort(key_es, stable=True).indices         # keeps token order per (e, s)
        sorted_keys = key_es[order]
        first = torch.searchsorted(sorted_keys, sorted_keys, right=False)
        pos = torch.empty_like(order)
        pos[order] = torch.arange(order.numel(), device=order.device) - first
        flat = experts * (w * m) + src * m + pos
        slot = torch.full(d.topk_idx.shape, -1, dtype=torch.int64, device=d.x.device)
        slot[rows, ks] = flat
        x_ll.view(-1, h)[flat] = d.x[rows]
        if d.scales is not None:
            s_ll.view(-1, s_ll.shape[-1])[flat] = d.scales[rows]
        rank_ll.fill_(-1)
        tok_ll.fill_(-1)
        rank_ll.view(-1)[flat] = src
        tok_ll.view(-1)[flat] = d.src_token[rows]
        count = torch.bincount(experts, minlength=el).to(torch.int64)
        return Dispatched(x=x_ll, src_rank=rank_ll, src_token=tok_ll, topk_idx=d.topk_idx,
                          topk_weights=d.topk_weights, tokens_per_expert=count,
                          layout=d.layout, mode="low_latency",
                          scales=s_ll if d.scales is not None else None, count=count,
                          slot=slot, max_tokens_per_rank=m)

    # ---- combine ------------------------------------------------------------------------------
    def combine(self, y: torch.Tensor, d) -> torch.Tensor:
        """Sum the destinations' outputs back into the source tokens (collective).

        ``d`` is this rank's result of the same dispatch on every rank, or its ``grouped()``.
        ``y``: normal mode ``[R, H]`` (one output per received row, already weighted and
        summed over the row's local experts); grouped ``[N, H]`` (unweighted, per (row, k)
        pair, in the grouped order); low-latency ``[E/W, W*M, H]`` (unweighted, per slot).
        Returns ``[T, H]`` in the layer's dtype: per token the float32 sum over the ranks it
        was sent to (:func:`routing.combine_groups` order), rounded once; 0 for a token that
        chose no expert."""
        if isinstance(d, Dispatched) and d.layout.extra.get("low_latency") is not None:
            return self._combine_ll_device(y, d)
        grouped = isinstance(d, Grouped)
        disp = d.dispatched if grouped else d
        problem, detail = self._check_combine(y, d, disp, grouped)
        rows = None
        if problem == 0:
            rows = self._rows(y, d, disp, grouped)
        lay = disp.layout if isinstance(disp, Dispatched) else None
        grad = torch.is_grad_enabled() and rows is not None and rows.requires_grad
        mine = checks.describe("combine", disp.mode if lay else "normal", problem, -1,
                               e=self.num_experts, h=self.hidden,
                               k=disp.topk_idx.shape[1] if lay else -1, dtype=self.dtype,
                               fp8=False, m=disp.max_tokens_per_rank if lay else 0,
                               t=lay.tokens[lay.rank] if lay else 0, ready=False,
                               call=lay.call if lay else -1, per_rank=[], grad=grad)
        if grad:
            from .autograd import combine_recorded
            return combine_recorded(self, mine, detail, rows, lay)
        device = y.device if isinstance(y, torch.Tensor) else torch.device("cpu")
        return self.move_combine(self.hidden, self.dtype, mine, detail, rows, lay, device)

    def _combine_ll_device(self, y, d: Dispatched) -> torch.Tensor:
        """combine of a device low-latency dispatch (checked here only: no handshake)."""
        problem, detail = self._check_combine(y, d, d, False)
        if problem:
            exc, text = checks.PROBLEMS[problem]
            raise exc(f"moe combine: {text}: {detail}")
        if torch.is_grad_enabled() and y.requires_grad:
            raise ValueError("moe combine: low-latency mode is for inference; combine under "
                             "torch.no_grad()")
        return self.engine_for(y.device).ll_combine(self, y, d.layout.extra["low_latency"])

    def move_combine(self, h, dtype, mine, detail, rows, layout, device) -> torch.Tensor:
        """Move ``rows [layout.rows, h]`` back to their tokens: ``[T, h]`` ``dtype``."""
        return self.engine_for(device).combine(h, dtype, mine, detail, rows, layout)

    def _check_combine(self, y, d, disp, grouped) -> tuple[int, str]:
        if not isinstance(disp, Dispatched) or disp.layout.extra.get("ep") != self._id:
            return 10, "pass the Dispatched (or its grouped()) this layer's dispatch returned"
        if not isinstance(y, torch.Tensor):
            return 1, f"y is {type(y).__name__}"
        if grouped:
            want = (d.x.shape[0], self.hidden)
        elif disp.mode == "low_latency":
            want = tuple(disp.x.shape)
        else:
            want = (disp.layout.rows, self.hidden)
        if tuple(y.shape) != want:
            return 8, f"y is {tuple(y.shape)}, expected {want}"
        if y.dtype != self.dtype or y.device != disp.x.device:
            return 9, (f"y is {y.dtype} on {y.device}, expected {self.dtype} on "
                       f"{disp.x.device}")
        return 0, ""

    def _rows(self, y, d, disp: Dispatched, grouped: bool) -> torch.Tensor:
        """One output row per received row (normal mode's ``y``)."""
        k = disp.topk_idx.shape[1]
        if grouped:
            return weighted_rows(disp.layout.rows, d.k, d.row, d.weights, y, k, self.dtype)
        if disp.mode == "low_latency":
            rows, ks = (disp.slot >= 0).nonzero(as_tuple=True)
            pairs = y.reshape(-1, self.hidden)[disp.slot[rows, ks]]
            return weighted_rows(disp.layout.rows, ks, rows, disp.topk_weights[rows, ks],
                                 pairs, k, self.dtype)
        return y.contiguous()
