"""Disaggregated serving of a tiny transformer: prefill ranks push the paged KV cache, layer by
layer, to decode ranks, which generate from it; rank 0 checks the tokens against one process.

    torchrun --standalone --nproc-per-node 2 examples/disagg_serving.py
    torchrun --standalone --nproc-per-node 4 examples/disagg_serving.py --layers 4 --gen 12
    torchrun --standalone --nproc-per-node 2 examples/disagg_serving.py --json out.json
    tilecomm hosts run --hosts 2 --per-host 1 -- examples/disagg_serving.py   # across hosts

Ranks ``0 .. W/2-1`` prefill, ``W/2 .. W-1`` decode (W even). Prompt ``i`` (seeded random
tokens, 5-13 of them) is prefilled by rank ``i * (W/2) // N`` (contiguous shares) and decoded by
rank ``W/2 + i % (W/2)``. Both sides keep K/V in a :class:`tilecomm.kv.KVTransfer` paged cache
``[L, 2, blocks, block_size, kv_heads, head_dim]`` with their own block allocator, which hands
out short runs of ids in shuffled order: the prefill blocks and the decode blocks of a request
differ, and only where both sides happen to be consecutive do blocks move as one transfer.

* decode rank: ``kv.expect`` every request it serves (before any push), then for each one, in
  prompt order: receive the prompt's last logits from its prefill rank (comm.recv), take the
  first token (argmax) and generate ``G - 1`` more greedily, reading each layer of the prompt's
  cache only once ``layer_ready`` says it landed, appending new K/V into blocks it allocates.
* prefill rank: for each of its prompts: one batched forward pass that writes layer ``l``'s K/V
  into its blocks and pushes them (``layers=range(l, l + 1)``) before it computes layer ``l+1``;
  then send the last logits (comm.send), wait for the push handles, free the blocks.

Rank 0 gathers the tokens and logits and recomputes every prompt in one process with the same
code on a plain list of K/V tensors (no paging, no communication): the same float32 ops on
tensors of the same shapes, so the tokens must be EQUAL (and the logits too, bit for bit).
Exit status 1 when they differ.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch

import tilecomm
from tilecomm.kv import KVTransfer

VOCAB, HIDDEN, N_HEADS, KV_HEADS, HEAD_DIM = 50, 48, 4, 2, 12


# ---- the model: random weights, the same on every rank ------------------------------------------
def make_model(layers: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def w(i, o):
        return torch.randn(i, o, generator=g) / math.sqrt(i)
    blocks = [dict(q=w(HIDDEN, N_HEADS * HEAD_DIM), k=w(HIDDEN, KV_HEADS * HEAD_DIM),
                   v=w(HIDDEN, KV_HEADS * HEAD_DIM), o=w(N_HEADS * HEAD_DIM, HIDDEN),
                   up=w(HIDDEN, 4 * HIDDEN), down=w(4 * HIDDEN, HIDDEN)) for _ in range(layers)]
    return dict(emb=torch.randn(VOCAB, HIDDEN, generator=g), layers=blocks,
                head=w(HIDDEN, VOCAB))


def rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def positions(pos0: int, t: int):
    """Sinusoidal position embeddings of positions ``pos0 .. pos0 + t - 1``."""
    p = torch.arange(pos0, pos0 + t, dtype=torch.float32)[:, None]
    f = torch.exp(torch.arange(0, HIDDEN, 2, dtype=torch.float32) * (-math.log(1e4) / HIDDEN))
    return torch.cat([torch.sin(p * f), torch.cos(p * f)], dim=1)


def attend(q, k, v, pos0: int):
    """Causal GQA attention of queries at positions ``pos0..`` (``q [T, Hq, D]``) over keys
    ``k, v [n, Hk, D]`` at positions ``0 .. n-1``; returns ``[T, Hq * D]``."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q.transpose(0, 1) @ k.permute(1, 2, 0) / math.sqrt(q.shape[2])      # [Hq, T, n]
    future = torch.arange(k.shape[0])[None, :] > torch.arange(pos0, pos0 + q.shape[0])[:, None]
    p = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)
    return (p @ v.transpose(0, 1)).transpose(0, 1).reshape(q.shape[0], -1)


def forward(model, tokens, pos0: int, cache):
    """``tokens [T]`` at positions ``pos0 ..`` -> logits ``[T, VOCAB]``. Layer ``l`` stores its
    K/V with ``cache.write(l, pos0, k, v)`` and attends over ``cache.read(l, n)``."""
    t = tokens.shape[0]
    x = model["emb"][tokens] + positions(pos0, t)
    for l, w in enumerate(model["layers"]):
        h = rms(x)
        q = (h @ w["q"]).view(t, N_HEADS, HEAD_DIM)
        cache.write(l, pos0, (h @ w["k"]).view(t, KV_HEADS, HEAD_DIM),
                    (h @ w["v"]).view(t, KV_HEADS, HEAD_DIM))
        k, v = cache.read(l, pos0 + t)
        x = x + attend(q, k, v, pos0) @ w["o"]
        x = x + torch.nn.functional.gelu(rms(x) @ w["up"]) @ w["down"]
    return rms(x) @ model["head"]


def generate(model, cache, first_logits, n_prompt: int, gen: int) -> list:
    """Greedy decoding: ``gen`` logits rows (the first given), one token from each."""
    rows = [first_logits]
    for i in range(gen - 1):
        tok = rows[-1].argmax().reshape(1)
        rows.append(forward(model, tok, n_prompt + i, cache)[-1])
    return rows


# ---- K/V storage: a plain list (the reference) and a block table into the paged cache ----------
class DenseKV:
    def __init__(self, layers: int):
        self.k, self.v = [[] for _ in range(layers)], [[] for _ in range(layers)]

    def write(self, l, pos0, k, v):
        self.k[l].append(k.clone())
        self.v[l].append(v.clone())

    def read(self, l, n):
        return torch.cat(self.k[l])[:n], torch.cat(self.v[l])[:n]


class Blocks:
    """A rank's block allocator: short runs of ids (1-3 blocks) in shuffled order, FIFO reuse."""

    def __init__(self, num_blocks: int, seed: int):
        rng, ids, runs = random.Random(seed), list(range(num_blocks)), []
        while ids:
            n = rng.randint(1, 3)
            runs.append(ids[:n])
            ids = ids[n:]
        rng.shuffle(runs)
        self.free = [b for r in runs for b in r]

    def take(self, n: int) -> list:
        if n > len(self.free):
            raise RuntimeError(f"out of cache blocks ({n} wanted, {len(self.free)} free)")
        out, self.free = self.free[:n], self.free[n:]
        return out

    def give(self, ids) -> None:
        self.free += ids


class PagedKV:
    """One request's K/V in this rank's paged cache ``[L, 2, B, S, Hk, D]``: ``blocks`` in token
    order, extended from ``alloc`` as tokens are appended. ``on_write(l)`` runs after layer
    ``l`` is written (the prefill side pushes there); ``ready(l)`` (the decode side: the expect
    handle's layer_ready) is waited for before layer ``l`` is first touched -- before a write
    too, or a push still landing could overwrite the appended slots of the last prompt block."""

    def __init__(self, cache, alloc: Blocks, blocks: list, on_write=None, ready=None):
        self.cache, self.alloc, self.blocks = cache, alloc, blocks
        self.on_write, self.ready, self.seen = on_write, ready, set()
        self.size = cache.shape[3]

    def _landed(self, l):
        if self.ready is None or l in self.seen:
            return
        deadline = time.monotonic() + 60
        while not self.ready(l):
            if time.monotonic() > deadline:
                raise TimeoutError(f"layer {l} of the prompt's cache never landed")
        self.seen.add(l)

    def write(self, l, pos0, k, v):
        self._landed(l)
        pos = torch.arange(pos0, pos0 + k.shape[0])
        need = -(-(pos0 + k.shape[0]) // self.size)
        if need > len(self.blocks):
            self.blocks += self.alloc.take(need - len(self.blocks))
        b, s = torch.tensor(self.blocks)[pos // self.size], pos % self.size
        self.cache[l, 0, b, s] = k
        self.cache[l, 1, b, s] = v
        if self.on_write is not None:
            self.on_write(l)

    def read(self, l, n):
        self._landed(l)
        kv = self.cache[l, :, self.blocks[:-(-n // self.size)]]       # [2, nb, S, Hk, D] copy
        return kv[0].reshape(-1, KV_HEADS, HEAD_DIM)[:n], kv[1].reshape(-1, KV_HEADS, HEAD_DIM)[:n]


# ---- serving -----------------------------------------------------------------------------------
def serve(comm, a, model, prompts, prefill_of, decode_of) -> tuple:
    """This rank's part; returns (logits [N, G, VOCAB] of the prompts it decoded, zeros
    elsewhere; transfers its expect handles reported; transfers its pushes reported)."""
    kv = KVTransfer(comm)
    cache = kv.paged_cache(num_layers=a.layers, num_blocks=a.blocks, block_size=a.block_size,
                           kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype=torch.float32)
    alloc = Blocks(a.blocks, seed=1000 + comm.rank)
    out = torch.zeros(len(prompts), a.gen, VOCAB)
    got = sent = 0
    mine = [i for i in range(len(prompts)) if comm.rank in (prefill_of[i], decode_of[i])]
    # decode side: announce every request before any push can wait for it
    expected = {}
    for i in mine:
        if decode_of[i] == comm.rank:
            ids = alloc.take(-(-len(prompts[i]) // a.block_size))
            expected[i] = ids, kv.expect(f"prompt-{i}", src=prefill_of[i], block_ids=ids)
    for i in mine:                 # prompt order on both sides: sends meet their receives
        t = len(prompts[i])        # all the decode side uses of the prompt (a scheduler's)
        if prefill_of[i] == comm.rank:
            ids, pushes = alloc.take(-(-t // a.block_size)), []

            def push(l, i=i, ids=ids, pushes=pushes):
                pushes.append(kv.push(f"prompt-{i}", dst=decode_of[i], block_ids=ids,
                                      layers=range(l, l + 1)))
            last = forward(model, prompts[i], 0, PagedKV(cache, alloc, list(ids), push))[-1]
            comm.send(last.contiguous(), decode_of[i], tag=i)
            for ph in pushes:
                ph.wait()          # across hosts the data may still be leaving the blocks
            sent += sum(ph.transfers for ph in pushes)
            alloc.give(ids)
        else:
            ids, h = expected[i]
            first = comm.recv(torch.empty(VOCAB), prefill_of[i], tag=i)
            paged = PagedKV(cache, alloc, list(ids), ready=h.layer_ready)
            out[i] = torch.stack(generate(model, paged, first, t, a.gen))
            h.wait()
            got += h.transfers
            alloc.give(paged.blocks)
    kv.close()
    del cache
    return out, got, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--gen", type=int, default=8, help="tokens generated per prompt")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--block-size", type=int, default=4, help="tokens per cache block")
    ap.add_argument("--blocks", type=int, default=64, help="cache blocks per rank")
    ap.add_argument("--json", help="rank 0 writes {tokens, reference, equal, transfers} here")
    a = ap.parse_args()
    torch.set_num_threads(1)       # the same GEMM kernels on every rank and in the reference
    comm = tilecomm.init(timeout=60)
    w = comm.world_size
    if w < 2 or w % 2:
        comm.close()
        raise SystemExit(f"disagg_serving: needs an even number of ranks >= 2, got {w}")
    half = w // 2
    model = make_model(a.layers)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(5, 14, (1,), generator=g)),),
                             generator=g) for _ in range(a.prompts)]
    prefill_of = [i * half // a.prompts for i in range(a.prompts)]
    decode_of = [half + i % half for i in range(a.prompts)]
    t0 = time.perf_counter()
    logits, got, sent = serve(comm, a, model, prompts, prefill_of, decode_of)
    seconds = time.perf_counter() - t0
    rows = comm.all_gather(logits.reshape(1, -1)).view(w, *logits.shape)
    counts = comm.exchange([got, sent])
    hosts = comm.layout.num_hosts
    comm.close()
    if comm.rank != 0:
        return
    served = torch.stack([rows[decode_of[i], i] for i in range(a.prompts)])
    tokens = served.argmax(-1).tolist()
    ref_rows = []
    for p in prompts:              # one process: the same model and math, a plain K/V list
        dense = DenseKV(a.layers)
        ref_rows.append(torch.stack(generate(model, dense, forward(model, p, 0, dense)[-1],
                                             len(p), a.gen)))
    ref = torch.stack(ref_rows)
    reference = ref.argmax(-1).tolist()
    equal = tokens == reference
    diff = float((served - ref).abs().max())
    got_all, sent_all = sum(c[0] for c in counts), sum(c[1] for c in counts)
    print(f"{w} ranks on {hosts} host(s): prefill 0..{half - 1}, decode {half}..{w - 1}; "
          f"{a.layers} layers, {a.gen} tokens per prompt, {seconds * 1e3:.0f} ms")
    for i, p in enumerate(prompts):
        label = f"prompt {i} ({len(p):2d} tokens, rank {prefill_of[i]} -> {decode_of[i]})"
        print(f"{label}: {tokens[i]}\n{'reference':>{len(label)}}: {reference[i]}")
    moves = sum(-(-len(p) // a.block_size) for p in prompts) * a.layers * 2
    print(f"transfers: {got_all} received, {sent_all} pushed, for {moves} (layer, K/V, block) "
          f"moves; largest logit difference {diff:g}")
    print("EQUAL" if equal else "DIFFERENT")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"tokens": tokens, "reference": reference, "equal": equal,
                       "transfers": got_all, "push_transfers": sent_all, "block_moves": moves,
                       "max_logit_diff": diff, "world": w, "hosts": hosts}, fh)
    if not equal:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
