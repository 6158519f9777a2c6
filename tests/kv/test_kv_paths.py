"""The two copy paths of a push inside a host, and deadlines.

* the copy kernel (``path="kernel"``) in the Triton interpreter on CPU caches, one process
  per rank: bit for bit against the block-by-block reference (bf16 and fp8 e4m3 caches, head
  splits, many requests in flight), and the layer wait on the device;
* its tile table, applied by numpy, against the reference (no interpreter: every shape);
* ``path="auto"``'s cost fit;
* deadlines and blocks held by requests in flight (kv_scenarios.deadlines).
"""

import sys
from pathlib import Path

import numpy as np
import tilecomm
import pytest
import torch

from tilecomm.kv import HeadSplit, PathChooser, coalesce, reference_transfer, transfers
from tilecomm.kv.paths import copy_tiles
from tilecomm.kv.schedule import CacheGeometry

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_scenarios as S  # noqa: E402


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_kernel_path_lands_many_requests_exactly(rank_pool, dtype):
    out = rank_pool(2).run(S.many_requests, dtype, "kernel")
    assert len(out[1]) == 2 and all(t >= 6 for t in out[1].values()), out


@pytest.mark.interpreter
def test_kernel_path_gathers_and_scatters_heads(rank_pool):
    rank_pool(3).run(S.head_split_gather, "kernel")
    rank_pool(3).run(S.head_split_scatter, "kernel")


def _wait_on_device(comm):
    """The receiver waits for each layer in a kernel (the interpreter), then finds it
    there; the sender pushes layer by layer with the copy kernel, the next only after the
    receiver saw the last."""
    from tilecomm.kv import KVTransfer

    kv = KVTransfer(comm, timeout=30)
    cache = kv.paged_cache(kv_heads=2, **S.GEO)
    seen = []
    if comm.rank == 1:
        h = kv.expect("dev", src=0, block_ids=[6, 2, 3])
        want = reference_transfer(S.fill(torch.zeros_like(cache), 40), torch.zeros_like(cache),
                                  [1, 4, 5], [6, 2, 3])
        for i in range(S.GEO["num_layers"]):
            comm.send(torch.tensor([i]), 0)
            h.wait_on_device(i)
            seen.append(torch.equal(S._bits(cache[i]), S._bits(want[i])))
        h.wait()
    else:
        S.fill(cache, 40)
        for i in range(S.GEO["num_layers"]):
            comm.recv(torch.tensor([0]), 1)
            kv.push("dev", dst=1, block_ids=[1, 4, 5], layers=range(i, i + 1), path="kernel")
    kv.close()
    return seen


@pytest.mark.interpreter
def test_a_layer_waited_for_on_the_device_has_landed(rank_pool):
    assert rank_pool(2).run(_wait_on_device)[1] == [True] * S.GEO["num_layers"]


def _apply_tiles(ct, src_raw: np.ndarray, dst_raw: np.ndarray) -> np.ndarray:
    """What the copy kernel does with a tile table, row by row in numpy (flags aside)."""
    out = dst_raw.copy()
    w = {4: np.int32, 2: np.int16, 1: np.int8}[ct.word_bytes]
    s, d = src_raw.view(w), out.view(w)
    tiles = ct.table[:ct.ntiles * 4].reshape(-1, 4)
    for so, do, n, _ in tiles:
        for r in range(n):
            a = so + r * ct.src_stride
            b = do + r * ct.dst_stride
            d[b:b + ct.row_words] = s[a:a + ct.row_words]
    return out


@pytest.mark.parametrize("src_heads,dst_heads,split,dtype", [
    (2, 2, None, torch.bfloat16),
    (4, 2, (2, 0, 2), torch.bfloat16),
    (2, 4, (0, 2, 2), torch.float8_e4m3fn),
    (3, 3, None, torch.float8_e4m3fn),        # rows of 3 x 5 bytes: 1-byte words
    (2, 3, (1, 2, 1), torch.float32),
])
def test_tile_table_moves_what_the_reference_moves(src_heads, dst_heads, split, dtype):
    dim = 5 if src_heads == 3 else 8
    sg = CacheGeometry(3, 12, 4, src_heads, dim, dtype)
    dg = CacheGeometry(3, 10, 4, dst_heads, dim, dtype)
    hs = HeadSplit(*split) if split else HeadSplit.whole(src_heads)
    src_ids, dst_ids = [0, 1, 2, 7, 9, 4], [5, 6, 7, 0, 1, 9]
    moves = transfers(coalesce(src_ids, dst_ids), range(1, 3))
    limit = max(sg.nbytes, dg.nbytes)
    ct = copy_tiles(moves, sg, dg, hs, 1, [100, 101], split is None, limit)
    g = torch.Generator().manual_seed(5)
    src = torch.randint(-128, 128, (limit,), dtype=torch.int8, generator=g).view(torch.uint8)
    dst = torch.randint(-128, 128, (limit,), dtype=torch.int8, generator=g).view(torch.uint8)
    got = _apply_tiles(ct, src.numpy(), dst.numpy())
    sc = src[:sg.nbytes].view(dtype).view(sg.shape)
    dc = dst[:dg.nbytes].view(dtype).view(dg.shape)
    want = reference_transfer(sc, dc, src_ids, dst_ids, layers=range(1, 3),
                              head_split=(hs.src, hs.dst, hs.count))
    assert np.array_equal(got[:dg.nbytes], want.view(torch.uint8).reshape(-1).numpy())
    assert np.array_equal(got[dg.nbytes:], dst.numpy()[dg.nbytes:])     # nothing else
    need = ct.table[ct.ntiles * 4:ct.ntiles * 4 + 2]
    layer_of = ct.table[:ct.ntiles * 4].reshape(-1, 4)[:, 3]
    assert need.tolist() == [int((layer_of == i).sum()) for i in range(2)]
    assert ct.table[-2:].tolist() == [100, 101]
    assert ct.vec == (4 if ct.word_bytes == 4 and ct.row_words % 4 == 0 else 1) or \
        ct.vec == 1


def test_auto_fits_each_path_and_takes_the_cheaper():
    truth = {"kernel": (8e-6, 0.0, 200e9), "copy_engine": (2e-6, 3e-6, 250e9)}
    shapes = [(1, 1 << 20), (1, 16 << 20), (256, 1 << 20), (256, 16 << 20)]
    rng = np.random.default_rng(0)
    samples = {p: [(t, b, (c[0] + t * c[1] + b / c[2]) * (1 + rng.normal(0, 0.01)))
                   for t, b in shapes] for p, c in truth.items()}
    ch = PathChooser.fit(samples)
    for p, (launch, per, bw) in truth.items():
        assert ch.costs[p][2] == pytest.approx(bw, rel=0.1)
        assert ch.costs[p][1] == pytest.approx(per, abs=2e-7)
    assert ch.choose(2, 64 << 20) == "copy_engine"       # few large copies
    assert ch.choose(4096, 128 << 20) == "kernel"       # a fragmented request: one launch
    assert PathChooser().choose(4096, 1 << 20) == "copy_engine"   # CPU caches


def test_requests_end_at_their_deadline_on_both_sides(rank_pool):
    p, d = rank_pool(2).run(S.deadlines)
    assert d["state"] == "stalled"
    assert "stalled" in d["slow"] and "'slow'" in p["slow"]
    assert "held by requests still in flight" in d["held"] and "'h2'" in p["held"]
    assert "'late'" in d["late"] and "deadline" in p["late"]


@pytest.mark.parametrize("path", ["kernel", "copy_engine"])
@pytest.mark.parametrize("pieces,nbytes", [(4, 1 << 16), (2, 1 << 14), (1, 1 << 15)])
def test_what_auto_times_copies_every_byte(path, pieces, nbytes):
    # paths.measure_cuda fits its costs on copy_pieces: it must move what a push would
    from tilecomm.device.handle import make_handle
    from tilecomm.kv.kernel import copy_pieces

    g = torch.Generator().manual_seed(pieces)
    a = torch.randint(0, 256, (nbytes + 64,), dtype=torch.uint8, generator=g)
    b = torch.zeros(nbytes + 64, dtype=torch.uint8)
    flag = torch.zeros(1, dtype=torch.int64)
    copy_pieces(path, a, b, flag, pieces, nbytes, 0, make_handle(0, [0], 10**9))
    assert torch.equal(a[:nbytes], b[:nbytes]) and not b[nbytes:].any()
    assert int(flag) == 1


def _sender_dies(comm):
    """Rank 0 pushes layer 0 of a request and dies (SIGKILL); rank 1's request ends at its
    deadline, naming rank 0 and the layers that never came, and its blocks are free."""
    import os
    import signal
    import time

    from tilecomm.kv import KVStalled, KVTransfer

    kv = KVTransfer(comm, timeout=20)
    cache = kv.paged_cache(kv_heads=2, **S.GEO)
    if comm.rank == 0:
        S.fill(cache, 3)
        kv.push("doomed", dst=1, block_ids=[0, 1], layers=range(0, 1))
        comm.barrier()
        os.kill(os.getpid(), signal.SIGKILL)
    h = kv.expect("doomed", src=0, block_ids=[4, 5], deadline=1.0)
    comm.barrier()
    t0 = time.monotonic()
    try:
        h.wait()
    except KVStalled as e:
        took = time.monotonic() - t0
        reused = kv.expect("next", src=0, block_ids=[4, 5]).state    # the blocks are free
        return str(e), h.state, took, reused
    raise AssertionError("the wait returned")


def test_a_sender_that_dies_ends_its_requests_at_their_deadline():
    out = tilecomm.launch(_sender_dies, 2, timeout=10, keep_going=True)
    assert isinstance(out[0], tilecomm.RankError)
    text, state, took, reused = out[1]
    assert state == "stalled" and reused == "pending"
    assert "'doomed'" in text and "rank 0: layers 1..2" in text, text
    assert took < 5, took            # the deadline (1 s), not the engine's timeout (20 s)


def test_a_post_refused_by_a_closed_link_is_reported_like_a_failed_wait():
    """Gloo refuses to post on a pair whose peer has gone (a RuntimeError at the post, not at
    the wait): the mailbox reports it as its waiting thread reports a failed wait, so the
    engine names the peer either way instead of letting Gloo's error escape."""
    import threading

    import torch

    from tilecomm.kv.mailbox import Codec, GlooMailbox, Message

    gone = threading.Event()

    class Idle:          # a control receive that never completes until the test ends
        def wait(self):
            gone.wait(5)
            raise RuntimeError("test over")

    class Closed:
        def recv(self, *a):
            raise RuntimeError("Connection closed by peer [127.0.0.1]:1")

        send = recv

    class Control(Closed):
        def recv(self, *a):
            return Idle()

    box = GlooMailbox(Codec(4), Control(), Closed(), peers=[3])
    try:
        box.post_recv(3, torch.empty(8, dtype=torch.uint8), 7, ("data of request 'r'", None))
        box.post_send(3, torch.empty(8, dtype=torch.uint8), 7, ("push of request 'r'", None))
        box.send(3, Message(1, "r", ()))
        got = box.poll(block=1.0) + box.poll()
        assert [(kind, peer) for kind, peer, _ in got] == [("error", 3)] * 3
        assert "data of request 'r': Connection closed by peer" in got[0][2]
        assert got[2][2].startswith("control: ")
    finally:
        gone.set()
        box.stop(timeout=1.0)
