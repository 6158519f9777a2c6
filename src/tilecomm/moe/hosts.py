"""Hosts engine of dispatch and combine: a token crosses the network once per destination host.

For CPU communicators whose ranks span hosts (``comm.topology.num_hosts > 1``). Inside a host
the ranks read each other's shared memory (``comm.host_comm``'s heap), as in :mod:`.cpu`;
between hosts they use a Gloo group of their own (``comm.process_group("moe")``).

Source rank ``s`` has one *partner* on every other host ``B``: the rank of ``B`` with local
rank ``local_rank(s) mod size(B)`` (its rail partner, :mod:`tilecomm.hier.layout`).

dispatch
    publish the own rows (as :mod:`.cpu`); the world handshake (counts per rank and per host);
    send every other host's partner, in one message, the rows of the tokens that chose an
    expert on that host (row, topk row, weights, scales, token index), and receive, as a
    partner, those of the remote sources into this rank's workspace; a host barrier; then
    gather, source by source in rank order, the rows for this rank from the local sources'
    blocks and from the forwarded blocks the partners on this host hold.
combine
    publish ``y``; the world handshake; as a partner, sum the rows this host's ranks hold for
    each remote source's tokens (float32, rank order) and send that partial to the source;
    sum the own host's rows the same way; then add the host partials in host order
    (:func:`routing.combine_groups`) and round once. One float32 partial per (token, host)
    crosses the network.
"""

from __future__ import annotations

import torch

from ..errors import CommTimeout
from ..ops.workspace import Workspace, round_up
from . import checks
from .cpu import Moved, row_parts, take_rows
from .routing import dest_mask

_TOKEN_BYTES = 8


def _packed(n: int, row_bytes: int, k: int, nb: int) -> tuple[list[int], int]:
    """Field offsets (x, topk_idx, topk_weights, scales, token) of ``n`` forwarded rows."""
    offs, size = row_parts(n, 0, k, row_bytes, nb)
    return offs + [size], size + round_up(n * _TOKEN_BYTES)


class HostsEngine:
    """One communicator's Gloo group and host workspace (CPU tensors, several hosts)."""

    def __init__(self, comm):
        self.comm = comm
        self.host = comm.host_comm
        layout = comm.layout
        self.host_of = [layout.host_of(r) for r in range(comm.world_size)]
        self.local_rank = [layout.local_rank(r) for r in range(comm.world_size)]
        self.members: dict[int, list[int]] = {}
        for r, h in enumerate(self.host_of):
            self.members.setdefault(h, []).append(r)
        self.hosts = sorted(self.members)
        self.my_host = self.host_of[comm.rank]
        self.pg = comm.process_group("moe")
        self.ws = Workspace()
        self.tag = 0

    def partner(self, s: int, host: int) -> int:
        """The rank of ``host`` that receives (and combines) source ``s``'s rows."""
        m = self.members[host]
        return m[self.local_rank[s] % len(m)]

    def _forwarded(self, q: int, hrows, own_bytes: int, geo) -> dict[int, tuple[int, int]]:
        """Remote sources whose partner is rank ``q`` (of this host): ``s -> (offset, rows)``
        of their blocks in ``q``'s workspace, after ``q``'s own block, in rank order."""
        out, at = {}, own_bytes
        hi = self.hosts.index(self.host_of[q])
        for s in range(self.comm.world_size):
            if self.host_of[s] != self.host_of[q] and self.partner(s, self.host_of[q]) == q:
                n = hrows[s][hi]
                out[s] = (at, n)
                at += _packed(n, *geo)[1]
        return out

    def _wait(self, works, op: str, call: int) -> None:
        for peer, work in works:
            try:
                work.wait()
            except RuntimeError as e:       # Gloo: timeout, or the peer's connection closed
                raise CommTimeout(f"moe {op} #{call}: the rows exchanged with rank {peer} on "
                                  f"another host did not arrive: {e}", collective=f"moe_{op}",
                                  seq=call, missing=[peer]) from e

    # ---- dispatch -----------------------------------------------------------------------------
    def dispatch(self, ep, mine, detail, x, scales, idx, wts) -> Moved:
        comm, ws, host = self.comm, self.ws, self.host
        me, w = comm.rank, comm.world_size
        ok = mine[checks.F_PROBLEM] == 0
        k, h = mine[checks.F_K], ep.hidden
        nb = scales.shape[1] if scales is not None else 0
        row_bytes = h * (1 if scales is not None else ep.itemsize)
        geo = (row_bytes, k, nb)
        t = x.shape[0] if ok else 0
        hmask = None
        if ok:
            mask = dest_mask(idx, ep.el, w)
            hmask = torch.stack([mask[:, self.members[hb]].any(1) for hb in self.hosts], 1)
        mine = mine + (hmask.sum(0).tolist() if ok else [0] * len(self.hosts))
        parity = ws.next_parity()
        self.tag += 1
        own = lambda tt: row_parts(tt, h, k, row_bytes, nb)     # noqa: E731
        if ok and ws.fits(own(t)[1]):
            self._publish(parity, own(t)[0], x, scales, idx, wts)
            mine[checks.F_READY] = 1
        call = checks.agree(comm, "dispatch", mine, detail)
        counts = [d[checks.NFIELDS:checks.NFIELDS + w] for d in call.descs]
        hrows = [d[checks.NFIELDS + w:] for d in call.descs]
        tokens = call.tokens()
        local = self.members[self.my_host]
        fwd = {q: self._forwarded(q, hrows, own(tokens[q])[1], geo) for q in local}
        need = max(max([own(tokens[q])[1]] + [o + _packed(n, *geo)[1] for o, n in
                                               fwd[q].values()]) for q in local)
        if need > ws.half or not all(call.descs[q][checks.F_READY] for q in local):
            if need > ws.half:
                ws.grow(host, need)
            self._publish(parity, own(t)[0], x, scales, idx, wts)
        works = []
        for s, (off, n) in fwd[me].items():
            if n:
                buf = ws.region(parity, off, (_packed(n, *geo)[1],), torch.uint8)
                works.append((s, self.pg.recv([buf], s, self.tag)))
        for hi, hb in enumerate(self.hosts):
            if hb != self.my_host and hrows[me][hi]:
                tok = hmask[:, hi].nonzero(as_tuple=True)[0]
                packed = self._pack(tok, x, scales, idx, wts, geo)
                works.append((self.partner(me, hb), self.pg.send([packed], self.partner(me, hb),
                                                                 self.tag)))
        self._wait(works, "dispatch", mine[checks.F_CALL])
        host.barrier()
        return self._gather(ep, call, counts, tokens, fwd, parity, x, scales, idx, wts, geo)

    def _publish(self, parity, offs, x, scales, idx, wts) -> None:
        ws = self.ws
        if x is None or x.shape[0] == 0:
            return
        ws.region(parity, offs[0], x.shape, x.dtype).copy_(x)
        ws.region(parity, offs[1], idx.shape, torch.int64).copy_(idx)
        ws.region(parity, offs[2], wts.shape, torch.float32).copy_(wts)
        if scales is not None:
            ws.region(parity, offs[3], scales.shape, torch.float32).copy_(scales)

    @staticmethod
    def _pack(tok, x, scales, idx, wts, geo) -> torch.Tensor:
        """One uint8 message of the rows ``tok`` (fields at :func:`_packed`'s offsets)."""
        n = tok.numel()
        offs, size = _packed(n, *geo)
        buf = torch.empty(size, dtype=torch.uint8)
        parts = [x, idx, wts, scales, tok.unsqueeze(1)]
        for off, src in zip(offs, parts):
            if src is None:
                continue
            rows = src if src is parts[4] else src[tok]
            nbytes = rows.numel() * rows.element_size()
            buf[off:off + nbytes].copy_(rows.contiguous().view(torch.uint8).reshape(-1))
        return buf

    def _fields(self, q, parity, off, n, geo, xdt):
        """Views ``(x, idx, weights, scales, token)`` of a forwarded block in ``q``'s memory."""
        row_bytes, k, nb = geo
        offs, _ = _packed(n, *geo)
        lq = self.local_rank[q] if q != self.comm.rank else None
        reg = lambda o, shape, dt: self.ws.region(parity, off + o, shape, dt, rank=lq,  # noqa
                                                  comm=self.host)
        h = row_bytes // torch.empty((), dtype=xdt).element_size()
        return (reg(offs[0], (n, h), xdt), reg(offs[1], (n, k), torch.int64),
                reg(offs[2], (n, k), torch.float32),
                reg(offs[3], (n, nb), torch.float32) if nb else None,
                reg(offs[4], (n,), torch.int64))

    def _gather(self, ep, call, counts, tokens, fwd, parity, x, scales, idx, wts, geo) -> Moved:
        me, w = self.comm.rank, self.comm.world_size
        row_bytes, k, nb = geo
        h = ep.hidden
        xdt = x.dtype
        rows = sum(counts[s][me] for s in range(w))
        out_x = torch.empty((rows, h), dtype=xdt)
        out_s = torch.empty((rows, nb), dtype=torch.float32) if nb else None
        out_i = torch.empty((rows, k), dtype=torch.int64)
        out_w = torch.empty((rows, k), dtype=torch.float32)
        src_rank = torch.empty(rows, dtype=torch.int64)
        src_tok = torch.empty(rows, dtype=torch.int64)
        partner_of = {}                # remote source -> [(local dst, positions)] (combine)
        at = 0
        for s in range(w):
            n = counts[s][me]
            if self.host_of[s] == self.my_host:
                if s == me:
                    sx, ss, si, sw = x, scales, idx, wts
                else:
                    offs, _ = row_parts(tokens[s], h, k, row_bytes, nb)
                    reg = lambda o, shape, dt: self.ws.region(  # noqa: E731
                        parity, o, shape, dt, rank=self.local_rank[s], comm=self.host)
                    ts = tokens[s]
                    sx, si = reg(offs[0], (ts, h), xdt), reg(offs[1], (ts, k), torch.int64)
                    sw = reg(offs[2], (ts, k), torch.float32)
                    ss = reg(offs[3], (ts, nb), torch.float32) if nb else None
                tok = dest_mask(si, ep.el, w)[:, me].nonzero(as_tuple=True)[0] if n else None
                stok = tok
            else:
                q = self.partner(s, self.my_host)
                off, nf = fwd[q][s]
                if q == me:
                    fidx = self._fields(q, parity, off, nf, geo, xdt)[1]
                    m = dest_mask(fidx, ep.el, w)
                    partner_of[s] = (nf, [(r, m[:, r].nonzero(as_tuple=True)[0])
                                          for r in self.members[self.my_host]])
                if n == 0:
                    continue
                sx, si, sw, ss, ftok = self._fields(q, parity, off, nf, geo, xdt)
                tok = dest_mask(si, ep.el, w)[:, me].nonzero(as_tuple=True)[0]
                stok = ftok[tok]
            if n == 0:
                continue
            take_rows((out_x, out_i, out_w, out_s), slice(at, at + n), tok, (sx, si, sw, ss),
                      s, me)
            src_rank[at:at + n] = s
            src_tok[at:at + n] = stok
            at += n
        return Moved(out_x, out_s, out_i, out_w, src_rank, src_tok, call, counts,
                     extra={"partner_of": partner_of})

    # ---- combine ------------------------------------------------------------------------------
    def combine(self, h: int, dtype: torch.dtype, mine, detail, rows, layout) -> torch.Tensor:
        """``rows [layout.rows, h]`` ``dtype`` -> ``[T, h]`` ``dtype`` (see the module doc)."""
        comm, ws, host = self.comm, self.ws, self.host
        me, w = comm.rank, comm.world_size
        isz = torch.empty((), dtype=dtype).element_size()
        ok = mine[checks.F_PROBLEM] == 0
        parity = ws.next_parity()
        self.tag += 1
        if ok and ws.fits(round_up(rows.numel() * isz)):
            ws.region(parity, 0, rows.shape, dtype).copy_(rows)
            mine[checks.F_READY] = 1
        call = checks.agree(comm, "combine", mine, detail)
        local = self.members[self.my_host]
        need = max(round_up(layout.rows_of(q) * h * isz) for q in local)
        if need > ws.half or not all(call.descs[q][checks.F_READY] for q in local):
            if need > ws.half:
                ws.grow(host, need)
            ws.region(parity, 0, rows.shape, dtype).copy_(rows)
            host.barrier()

        def rows_of(r: int, s: int) -> torch.Tensor:
            """Rank ``r``'s (this host) rows for source ``s``."""
            lo, n = layout.offsets_at(r)[s], layout.counts[s][r]
            if r == me:
                return rows[lo:lo + n]
            return ws.region(parity, lo * h * isz, (n, h), dtype, rank=self.local_rank[r],
                             comm=host)

        works, keep = [], []
        for s, (nf, per_dst) in layout.extra["partner_of"].items():
            if nf == 0:
                continue
            part = torch.zeros((nf, h), dtype=torch.float32)
            for r, pos in per_dst:                      # this host's ranks, in rank order
                if pos.numel():
                    part.index_add_(0, pos, rows_of(r, s).to(torch.float32))
            keep.append(part)
            works.append((s, self.pg.send([part], s, self.tag)))
        t = layout.tokens[me]
        mask = torch.zeros((t, w), dtype=torch.bool)
        for r in range(w):
            mask[layout.send_tokens[r], r] = True
        remote = {}
        for hb in self.hosts:
            if hb == self.my_host:
                continue
            tok = mask[:, self.members[hb]].any(1).nonzero(as_tuple=True)[0]
            if tok.numel():
                buf = torch.empty((tok.numel(), h), dtype=torch.float32)
                remote[hb] = (tok, buf)
                works.append((self.partner(me, hb), self.pg.recv([buf], self.partner(me, hb),
                                                                 self.tag)))
        own = torch.zeros((t, h), dtype=torch.float32)
        for r in local:
            if layout.counts[me][r]:
                own.index_add_(0, layout.send_tokens[r], rows_of(r, me).to(torch.float32))
        self._wait(works, "combine", mine[checks.F_CALL])
        out = torch.zeros((t, h), dtype=torch.float32)
        for group in layout.groups:                     # hosts in order of their lowest rank
            hb = self.host_of[group[0]]
            if hb == self.my_host:
                out += own
            elif hb in remote:
                tok, part = remote[hb]
                out.index_add_(0, tok, part)
        return out.to(dtype)
