"""KV transfer scenarios, each run by every rank of a communicator: from tilecomm.launch on
one host (tests/kv/test_kv_transfer.py) and under torchrun on simulated hosts
(tests/kv/kv_hosts.py). Data is random bf16 (and integer-valued float32 where noted);
results are compared bit for bit with :func:`tilecomm.kv.reference_transfer`."""

from __future__ import annotations

import random
import time

import torch

from tilecomm import CommMismatch, CommTimeout
from tilecomm.kv import KVTransfer, reference_transfer

GEO = dict(num_layers=3, num_blocks=16, block_size=4, head_dim=8)


def fill(cache: torch.Tensor, seed: int) -> torch.Tensor:
    """Random data every rank can rebuild for any rank (the reference needs the sources)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(cache.shape, generator=g).to(cache.dtype)
    cache.copy_(x)
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(_bits(got), _bits(want)):
        bad = (_bits(got) != _bits(want)).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: cache differs from the reference at {bad}")


def roles(world: int) -> tuple[list[int], list[int]]:
    half = world // 2
    return list(range(half)), list(range(half, world))


def ids_for(seed: int, n: int, blocks: int, fragmented: bool) -> list[int]:
    """``n`` distinct block ids: one run, or shuffled runs of 1-3."""
    rng = random.Random(seed)
    if not fragmented:
        start = rng.randrange(0, blocks - n + 1)
        return list(range(start, start + n))
    ids = rng.sample(range(blocks), n)
    ids[1:3] = sorted(ids[1:3])
    return ids


def many_requests(comm, dtype=torch.bfloat16, path="auto") -> dict:
    """Every prefill rank sends two requests to every decode rank (one contiguous, one
    fragmented), layer by layer in two pushes, in an order that differs from the order the
    receivers expect them and wait for them. ``path``: the pushes' path inside a host (every
    push checks it took it)."""
    pre, dec = roles(comm.world_size)
    kv = KVTransfer(comm, timeout=30)
    cache = kv.paged_cache(kv_heads=2, dtype=dtype, **GEO)
    nb = GEO["num_blocks"]
    reqs = [(p, d, k) for p in pre for d in dec for k in range(2)]
    plan = {}            # rid -> (src ids, dst ids): each request gets its own dst blocks
    used = {d: list(range(nb)) for d in dec}
    random.Random(7).shuffle(used[dec[0]])
    for p, d, k in reqs:
        n = 3 if k == 0 else 4
        src = ids_for(100 * p + 10 * d + k, n, nb, fragmented=k == 1)
        dst = [used[d].pop() for _ in range(n)]
        plan[f"r{p}-{d}-{k}"] = (p, d, src, dst)
    sources = {p: fill(cache, 1000 + p) if comm.rank == p else None for p in pre}
    out = {}
    if comm.rank in dec:
        hs = {rid: kv.expect(rid, src=p, block_ids=dst)
              for rid, (p, d, src, dst) in plan.items() if d == comm.rank}
        order = sorted(hs, reverse=True)
        for rid in order:
            hs[rid].wait()
        want = torch.zeros_like(cache)
        for rid, (p, d, src, dst) in plan.items():
            if d == comm.rank:
                g = torch.zeros_like(cache)
                srcc = fill(g, 1000 + p)
                want = reference_transfer(srcc, want, src, dst)
        assert_same(cache, want, f"rank {comm.rank}")
        out = {rid: h.transfers for rid, h in hs.items()}
    else:
        mine = [(rid, v) for rid, v in plan.items() if v[0] == comm.rank]
        handles = []
        for layers in (range(0, 1), range(1, GEO["num_layers"])):
            for rid, (p, d, src, dst) in reversed(mine):
                handles.append(kv.push(rid, dst=d, block_ids=src, layers=layers, path=path))
                assert handles[-1].path in ("message", "copy_engine" if path == "auto"
                                            else path), handles[-1].path
        for h in handles:
            h.wait()
        out = {h.rid: h.transfers for h in handles}
    del sources
    kv.close()
    return out


def layer_by_layer(comm) -> list:
    """The receiver sees layer i ready as soon as it is pushed, before later layers."""
    pre, dec = roles(comm.world_size)
    kv = KVTransfer(comm, timeout=30)
    cache = kv.paged_cache(kv_heads=2, **GEO)
    seen = []
    p, d = pre[0], dec[0]
    if comm.rank == d:
        h = kv.expect("lbl", src=p, block_ids=[5, 6])
        for i in range(GEO["num_layers"]):
            while not h.layer_ready(i):
                pass
            # the next layer is pushed only after this rank says it saw this one
            seen.append([h.layer_ready(k) for k in range(GEO["num_layers"])])
            comm.send(torch.tensor([i]), p)
        h.wait()
    elif comm.rank == p:
        fill(cache, 5)
        for i in range(GEO["num_layers"]):
            kv.push("lbl", dst=d, block_ids=[0, 1], layers=range(i, i + 1)).wait()
            comm.recv(torch.tensor([0]), d)
    kv.close()
    return seen


def head_split_gather(comm, path="auto") -> None:
    """Prefill with 2 KV heads per rank (ranks 0, 1), decode with 4 (rank 2): each prefill
    rank sends its heads into its slice of the decode rank's heads."""
    heads = 4 if comm.rank == 2 else 2
    kv = KVTransfer(comm, timeout=30)
    cache = kv.paged_cache(kv_heads=heads, **GEO)
    if comm.rank == 2:
        h = kv.expect("g", src=[0, 1], block_ids=[9, 2, 3])
        h.wait()
        want = torch.zeros_like(cache)
        for p in (0, 1):
            srcc = fill(torch.zeros(cache.shape[:4] + (2, cache.shape[5]), dtype=cache.dtype),
                        50 + p)
            want = reference_transfer(srcc, want, [1, 2, 3], [9, 2, 3], head_split=(0, 2 * p, 2))
        assert_same(cache, want, "head gather")
    elif comm.rank in (0, 1):
        fill(cache, 50 + comm.rank)
        kv.push("g", dst=2, block_ids=[1, 2, 3], head_split=(0, 2 * comm.rank, 2),
                path=path).wait()
    kv.close()


def head_split_scatter(comm, path="auto") -> None:
    """Prefill with 4 KV heads (rank 0), decode with 2 per rank (ranks 1, 2)."""
    heads = 4 if comm.rank == 0 else 2
    kv = KVTransfer(comm, timeout=30)
    cache = kv.paged_cache(kv_heads=heads, **GEO)
    if comm.rank == 0:
        fill(cache, 60)
        for d in (1, 2):
            kv.push(f"s{d}", dst=d, block_ids=[4, 0], head_split=(2 * (d - 1), 0, 2),
                    path=path).wait()
    elif comm.rank in (1, 2):
        kv.expect(f"s{comm.rank}", src=0, block_ids=[7, 8]).wait()
        srcc = fill(torch.zeros(cache.shape[:4] + (4, cache.shape[5]), dtype=cache.dtype), 60)
        want = reference_transfer(srcc, torch.zeros_like(cache), [4, 0], [7, 8],
                                  head_split=(2 * (comm.rank - 1), 0, 2))
        assert_same(cache, want, "head scatter")
    kv.close()


def _raises(exc, fn, *needles):
    try:
        fn()
    except exc as e:
        text = str(e)
        for n in needles:
            assert n in text, f"{n!r} not in {text!r}"
        return text
    raise AssertionError(f"expected {exc.__name__}")


def errors(comm) -> dict:
    """Bad input raises a clear error on both sides; nothing waits for the timeout except
    the one case that has to (a request the receiver never expects)."""
    pre, dec = roles(comm.world_size)
    p, d = pre[0], dec[0]
    kv = KVTransfer(comm, timeout=2)
    kv.paged_cache(kv_heads=2, **GEO)
    seen = {}
    if comm.rank == d:
        # 1. block counts differ
        h = kv.expect("count", src=p, block_ids=[0, 1, 2])
        seen["count"] = _raises(CommMismatch, h.wait, "pushes 2 block(s)", "expects 3")
        # 2. the sender's ids are out of range: its notice fails this handle
        h = kv.expect("range", src=p, block_ids=[0, 1])
        seen["range"] = _raises(CommMismatch, h.wait, "block id 99", "out of range")
        # 3. this side's ids are out of range: ValueError here, the sender is told
        seen["mine"] = _raises(ValueError, lambda: kv.expect("mine", src=p, block_ids=[0, -1]),
                               "block id -1")
        # 4. a request never expected: the sender gives up, and this rank hears of it
        comm.barrier()
        seen["unknown"] = _raises(CommMismatch, lambda: _poll_until_error(kv), "'nope'",
                                  "never expected")
        # 5. a sender that never pushes: a bounded wait naming it and the layers
        h = kv.expect("silent", src=p, block_ids=[4])
        seen["silent"] = _raises(CommTimeout, lambda: h.wait(timeout=0.5), "'silent'",
                                 f"rank {p}: layers 0..2")
        # 6. a request given up: a later push of it raises on the sender
        h.cancel("gave up waiting")
        _raises(CommMismatch, h.wait, "cancelled")
        comm.barrier()
        # still usable afterwards
        h = kv.expect("after", src=p, block_ids=[8, 9])
        h.wait()
    elif comm.rank == p:
        seen["count"] = _raises(CommMismatch, lambda: kv.push("count", dst=d, block_ids=[0, 1]),
                                "pushes 2 block(s)", "expects 3")
        seen["range"] = _raises(ValueError, lambda: kv.push("range", dst=d, block_ids=[0, 99]),
                                "block id 99")
        seen["mine"] = _raises(CommMismatch, lambda: kv.push("mine", dst=d, block_ids=[0, 1]),
                               "rejected request 'mine'", "block id -1")
        seen["bad_dst"] = _raises(ValueError, lambda: kv.push("x", dst=p, block_ids=[0]),
                                  "another rank")
        seen["layers"] = _raises(ValueError, lambda: kv.push("x", dst=d, block_ids=[0],
                                                             layers=[0, 2]), "range")
        seen["heads"] = _raises(ValueError, lambda: kv.push("x", dst=d, block_ids=[0],
                                                            head_split=(1, 0, 2)), "head_split")
        # 4. never expected
        comm.barrier()
        seen["unknown"] = _raises(CommTimeout, lambda: kv.push("nope", dst=d, block_ids=[0]),
                                  "'nope'", f"rank {d} did not expect it")
        comm.barrier()
        time.sleep(0.3)          # across hosts the cancel notice is a message on its way
        seen["cancelled"] = _raises(CommMismatch, lambda: kv.push("silent", dst=d,
                                                                  block_ids=[4]),
                                    "gave up request 'silent'", "gave up waiting")
        kv.push("after", dst=d, block_ids=[3, 4]).wait()
    else:
        comm.barrier()
        comm.barrier()
    kv.close()
    return seen


def _poll_until_error(kv) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kv.poll()
        time.sleep(0.01)
    raise AssertionError("no error reported")


def geometry_mismatch(comm) -> dict:
    """Caches that cannot exchange blocks (head_dim differs): both sides refuse at once."""
    pre, dec = roles(comm.world_size)
    p, d = pre[0], dec[0]
    kv = KVTransfer(comm, timeout=5)
    geo = dict(GEO, head_dim=8 if comm.rank != d else 16)
    kv.paged_cache(kv_heads=2, **geo)
    seen = {}
    if comm.rank == d:
        seen["d"] = _raises(ValueError, lambda: kv.expect("geo", src=p, block_ids=[0]),
                            "head_dim")
    elif comm.rank == p:
        seen["p"] = _raises(ValueError, lambda: kv.push("geo", dst=d, block_ids=[0]), "head_dim")
    kv.close()
    return seen


SCENARIOS = [many_requests, layer_by_layer, errors, geometry_mismatch]


def all_pairs(comm) -> int:
    """Every rank is a sender and a receiver at once: one request to every other rank, with
    fragmented blocks (in a host and across hosts alike). Sources come from blocks 0-7 and
    land in blocks 8-15, so no push reads a block another one writes. Returns the transfers
    received."""
    kv = KVTransfer(comm, timeout=30)
    cache = kv.paged_cache(kv_heads=2, **GEO)
    w, me = comm.world_size, comm.rank
    fill(cache, 300 + me)
    srcs = [s for s in range(w) if s != me]

    def dst_of(s, d):
        k = [r for r in range(w) if r != d].index(s)
        return [9 + 2 * k, 8 + 2 * k]

    handles = {s: kv.expect(f"{s}->{me}", src=s, block_ids=dst_of(s, me)) for s in srcs}
    pushes = [kv.push(f"{me}->{d}", dst=d, block_ids=ids_for(me * 31 + d, 2, 8, True))
              for d in srcs]
    for p in pushes:
        p.wait()
    got = 0
    for s, h in handles.items():
        h.wait()
        got += h.transfers
    for s in srcs:
        srcc = torch.zeros_like(cache)
        fill(srcc, 300 + s)
        dst = dst_of(s, me)
        want = reference_transfer(srcc, torch.zeros_like(cache), ids_for(s * 31 + me, 2, 8, True),
                                  dst)
        blocks = torch.tensor(dst)
        assert_same(cache[:, :, blocks], want[:, :, blocks], f"rank {me} from {s}")
    kv.close()
    return got


def dead_sender(comm) -> None:
    """Across hosts: the sender's process exits; the receiver's wait raises CommTimeout
    naming it well before the timeout (its Gloo connection closes). Every rank leaves with
    os._exit (the communicator cannot close with a rank gone), printing what it saw."""
    import os

    pre, dec = roles(comm.world_size)
    p, d = pre[0], dec[0]
    kv = KVTransfer(comm, timeout=60)
    kv.paged_cache(kv_heads=2, **GEO)
    comm.barrier()
    if comm.rank == p:
        os._exit(0)
    if comm.rank == d:
        t0 = time.monotonic()
        try:     # the expect too: the link may already have failed when it is made
            h = kv.expect("dead", src=p, block_ids=[1])
            h.wait()
        except CommTimeout as e:
            assert e.missing == (p,), e.missing
            print(f"rank {d}: dead_sender OK after {time.monotonic() - t0:.1f}s: {e}",
                  flush=True)
            os._exit(0)
        raise AssertionError("the wait returned")
    time.sleep(3)            # stay until the receiver has seen the sender go
    os._exit(0)


def _poll_for(kv, seconds: float) -> None:
    """Let control messages from another host arrive (a notice is a message on its way)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        kv.poll()
        time.sleep(0.01)


def retries_and_failures(comm) -> dict:
    """Ranks 0 and 1 prefill, rank 2 decodes. A request id that failed once can be expected
    again; a duplicate expect leaves the request in flight alone; a request that fails on
    the receiver is refused to every one of its senders, not only to the one that caused it;
    expects never wait for a sender that is busy (more of them than the ring holds)."""
    kv = KVTransfer(comm, timeout=10, ring_slots=2)
    cache = kv.paged_cache(kv_heads=2, **GEO)
    seen = {}
    if comm.rank == 2:
        _raises(ValueError, lambda: kv.expect("a", src=0, block_ids=[0, 99]), "block id 99")
        ha = kv.expect("a", src=0, block_ids=[0, 1])            # the retry
        hb = kv.expect("b", src=0, block_ids=[2])
        seen["dup"] = _raises(ValueError, lambda: kv.expect("b", src=0, block_ids=[3]),
                              "already expected")
        hg = kv.expect("g", src=[0, 1], block_ids=[4, 5])
        t0 = time.monotonic()
        many = [kv.expect(f"m{i}", src=1, block_ids=[8 + i]) for i in range(5)]
        seen["expect_s"] = time.monotonic() - t0
        comm.barrier()                                           # 1: expects are out
        ha.wait()
        hb.wait()
        seen["g"] = _raises(CommMismatch, hg.wait, "pushes 1 block(s)", "expects 2")
        comm.barrier()                                           # 2: "g" failed here
        for h in many:
            h.wait()
        comm.barrier()                                           # 3: rank 1 is done
        seen["g_blocks_untouched"] = bool((cache[:, :, 4:6] == 0).all())
        want = reference_transfer(fill(torch.zeros_like(cache), 70), torch.zeros_like(cache),
                                  [0, 1, 0], [0, 1, 2])
        assert_same(cache[:, :, :3], want[:, :, :3], "retried and duplicated requests")
    elif comm.rank == 0:
        fill(cache, 70)
        comm.barrier()                                           # 1
        kv.push("a", dst=2, block_ids=[0, 1]).wait()
        kv.push("b", dst=2, block_ids=[0]).wait()
        seen["g"] = _raises(CommMismatch, lambda: kv.push("g", dst=2, block_ids=[0],
                                                          head_split=(0, 0, 1)), "expects 2")
        comm.barrier()                                           # 2
        comm.barrier()                                           # 3
    else:
        fill(cache, 71)
        time.sleep(0.5)              # busy: rank 2's expects must not wait for this rank
        comm.barrier()                                           # 1
        comm.barrier()                                           # 2
        _poll_for(kv, 1.0)
        seen["g"] = _raises(CommMismatch, lambda: kv.push("g", dst=2, block_ids=[0, 1],
                                                          head_split=(1, 1, 1)), "gave up")
        for i in range(5):
            kv.push(f"m{i}", dst=2, block_ids=[i]).wait()
        comm.barrier()                                           # 3
    kv.close()
    return seen


def heap_after_close(comm) -> int:
    """Twice: an engine, a request, close; then comm.alloc must find the heaps still in step
    on every rank (nothing of the closed engine keeps a view of its cache)."""
    pre, dec = roles(comm.world_size)
    for k in range(2):
        kv = KVTransfer(comm, timeout=30)
        cache = kv.paged_cache(kv_heads=2, **GEO)
        if comm.rank == dec[0]:
            kv.expect(f"r{k}", src=pre[0], block_ids=[1, 2]).wait()
        elif comm.rank == pre[0]:
            kv.push(f"r{k}", dst=dec[0], block_ids=[3, 4]).wait()
        kv.close()
        del cache, kv
        probe = comm.alloc(1024, torch.uint8)       # raises if the heaps diverged
        del probe
    return k


def _until_free(kv, h):
    end = time.monotonic() + 20
    while not h.blocks_free:
        assert time.monotonic() < end, f"the blocks of {h.rid!r} are still held"
        kv.poll()
        time.sleep(0.01)


def deadlines(comm) -> dict:
    """Requests end at their deadline on both sides, and blocks in flight are never handed
    out twice. Rank ``p`` prefills, rank ``d`` decodes:

    1. "slow" (deadline 1.5 s): only layer 0 is pushed; the receiver's handle ends STALLED
       naming the sender and layers 1..2, its blocks are free again at once, and the
       sender's push of the rest raises KVStalled;
    2. "h2" asks for a block "h1" holds: refused on the receiver (naming the block and
       "h1") and on its sender; once "h1" landed the same expect succeeds;
    3. "late" (deadline 0.3 s) is pushed after its deadline: the push raises, and so does
       the receiver's wait.
    """
    from tilecomm.kv import KVStalled

    pre, dec = roles(comm.world_size)
    p, d = pre[0], dec[0]
    kv = KVTransfer(comm, timeout=20)
    cache = kv.paged_cache(kv_heads=2, **GEO)
    seen = {}
    if comm.rank == d:
        # long enough for layer 0 to land first on a loaded machine
        h = kv.expect("slow", src=p, block_ids=[0, 1], deadline=1.5)
        comm.barrier()                                               # A
        while h.state == "pending":
            time.sleep(0.01)
        seen["state"] = h.state
        seen["slow"] = _raises(KVStalled, h.wait, "'slow'", f"rank {p}: layers 1..2",
                               "deadline of 1.5 s", "blocks 0..1")
        # the blocks are free again: at once inside a host; across hosts once the sender
        # has sent the layers it owes as zeros (its next kv call: the push below). An
        # expect before that would be refused, and its sender told so
        _until_free(kv, h)
        again = kv.expect("again", src=p, block_ids=[0, 1])
        comm.barrier()                                               # B
        again.wait()
        # 2. blocks held by a request in flight
        h1 = kv.expect("h1", src=p, block_ids=[4, 5])
        seen["held"] = _raises(ValueError, lambda: kv.expect("h2", src=p, block_ids=[5, 6]),
                               "block(s) [5] by request 'h1'")
        comm.barrier()                                               # C
        h1.wait()
        h2 = kv.expect("h2", src=p, block_ids=[5, 6])
        comm.barrier()                                               # D
        h2.wait()
        # 3. pushed too late
        late = kv.expect("late", src=p, block_ids=[8], deadline=0.3)
        comm.barrier()                                               # E
        seen["late"] = _raises(KVStalled, late.wait, "'late'")
        comm.barrier()                                               # F
        want = reference_transfer(fill(torch.zeros_like(cache), 90), torch.zeros_like(cache),
                                  [2, 3, 10, 11, 12], [0, 1, 4, 5, 6])
        assert_same(cache[:, :, :8], want[:, :, :8], "requests after a stall")
    elif comm.rank == p:
        fill(cache, 90)
        comm.barrier()                                               # A
        kv.push("slow", dst=d, block_ids=[2, 3], layers=range(0, 1)).wait()
        time.sleep(1.7)                                              # past the deadline
        seen["slow"] = _raises(KVStalled, lambda: kv.push("slow", dst=d, block_ids=[2, 3],
                                                          layers=range(1, 3)), "'slow'")
        comm.barrier()                                               # B
        kv.push("again", dst=d, block_ids=[2, 3]).wait()
        comm.barrier()                                               # C
        seen["held"] = _raises(CommMismatch, lambda: kv.push("h2", dst=d, block_ids=[11, 12]),
                               "rejected request 'h2'", "'h1'")
        kv.push("h1", dst=d, block_ids=[10, 11]).wait()
        comm.barrier()                                               # D
        kv.push("h2", dst=d, block_ids=[11, 12]).wait()
        comm.barrier()                                               # E
        time.sleep(0.5)
        seen["late"] = _raises(KVStalled, lambda: kv.push("late", dst=d, block_ids=[0]),
                               "'late'")
        comm.barrier()                                               # F
    else:
        for _ in range(6):
            comm.barrier()
    kv.close()
    return seen
