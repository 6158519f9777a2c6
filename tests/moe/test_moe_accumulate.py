"""The CPU combine's piecewise float32 accumulation gives the bits of the plain one."""

from __future__ import annotations

import pytest
import torch

from tilecomm.moe import cpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("piece_bytes", [4 * 16 * 3, 4 * 16 * 64, 1 << 20])
def test_accumulate_matches_index_add(monkeypatch, dtype, piece_bytes):
    monkeypatch.setattr(cpu, "_PIECE_BYTES", piece_bytes)      # 3 tokens, 64, all at once
    g = torch.Generator().manual_seed(7)
    t, h = 50, 16
    parts = []
    for keep in (1.0, 0.6, 0.0, 0.3):                         # all, some, none, few tokens
        tok = (torch.rand(t, generator=g) < keep).nonzero(as_tuple=True)[0]
        rows = (torch.randn((tok.numel(), h), generator=g) * 1e3).to(dtype)
        rows[:, 0] = -0.0                                     # signed zeros must come out +0
        parts.append((tok, rows))
    want = torch.zeros((t, h), dtype=torch.float32)
    for tok, rows in parts:
        want.index_add_(0, tok, rows.to(torch.float32))
    got = cpu.accumulate(t, h, dtype, parts)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.view(bits), want.to(dtype).view(bits))
    assert cpu.accumulate(0, h, dtype, []).shape == (0, h)
