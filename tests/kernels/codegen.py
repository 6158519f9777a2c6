"""Code-generation checks of the collective kernels, run in a subprocess without
TRITON_INTERPRET (``python tests/kernels/codegen.py CHECK [ARGS...]`` prints JSON): the kernels
must be JIT functions, and the pytest process must not import them (its forked rank processes
set TRITON_INTERPRET themselves). See test_kernel_codegen.py for what each check proves.

Every check goes through Triton's own launch machinery for ``cuda:sm_90`` with
``tilecomm.device.compile_check.offline_target`` / ``record_launches``: the real launchers
(``kernel[grid](...)`` with a real KernelContext on 256-byte aligned CPU tensors) and Triton's
real argument binder (``specialize_impl``: constants for 1, ``D`` for multiples of 16), so the
cache keys and argument attributes are the ones a GPU launch computes. Nothing is launched.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import offline  # noqa: E402

from tilecomm.device import compile_check as cc  # noqa: E402
from tilecomm.device import lang  # noqa: E402

KERNELS = [("all_reduce", "one_shot"), ("all_reduce", "two_shot"), ("all_gather", "direct"),
           ("all_gather", "ring"), ("reduce_scatter", "direct"), ("reduce_scatter", "ring"),
           ("all_to_all", "pairwise"), ("broadcast", "direct")]
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}

#: element counts per call (all divisible by 4 ranks; for all_to_all every chunk is a
#: multiple of 16 bytes, so the word size and the ALIGNED flag stay the same)
SIZES = [4096, 1000, 112, 1056, 28, 4100]
A2A_SIZES = [4096, 1056, 160, 128, 4 * 8 * 7]
#: epochs of the 20+ calls: 1 (Triton's "== 1" constant) and multiples of 16 included
EPOCHS = list(range(1, 21)) + [32, 48]


def launch_keys(world: int = 4) -> dict:
    """``{kernel[dtype]: sorted distinct cache keys}`` over calls with every epoch of
    EPOCHS, ranks 0..world-1, changing sizes and broadcast roots."""
    from tilecomm.backends.triton.kernels.all_to_all import exchange_counts

    keys: dict = {}
    with cc.record_launches() as seen:
        for dname, dt in DT.items():
            for coll, algo in KERNELS:
                sizes = A2A_SIZES if coll == "all_to_all" else SIZES
                for i, ep in enumerate(EPOCHS):
                    for r in range(world):
                        n = sizes[(i + r) % len(sizes)]
                        c = offline.call(coll, algo, dt, n, world, root=(i + 1) % world)
                        start = len(seen)
                        offline.launch(coll, algo, offline.context(r, world, ep), c)
                        for ln in seen[start:]:
                            keys.setdefault(f"{ln.name}[{dname}]", set()).add(ln.key)
        for i, ep in enumerate(EPOCHS):                       # all_to_all_v's counts kernel
            for r in range(world):
                start = len(seen)
                exchange_counts(offline.context(r, world, ep), [i + r] * world)
                for ln in seen[start:]:
                    keys.setdefault(f"{ln.name}", set()).add(ln.key)
    return {k: sorted(v) for k, v in keys.items()}


def warmup_variants() -> list[int]:
    """Compile one_shot (bf16, 4 ranks) for sm_90 through ``JITFunction.run(warmup=True)``
    20 times with changing epochs, ranks (device handles) and sizes; the number of cached
    variants after each call."""
    from tilecomm.backends.triton.kernels.all_reduce import one_shot_all_reduce_kernel as k

    counts = []
    x = offline.aligned(8192, torch.bfloat16)
    stage = offline.aligned(8192, torch.bfloat16)
    pad = offline.aligned(64, torch.int64)
    handles = [offline.FakeHeap(r, 4).handle for r in range(4)]
    epoch = offline.aligned(1, torch.int64)           # the device epoch (NOTE [device epochs])
    with cc.offline_target():
        for i in range(20):
            ep, r, n = i + 1, i % 4, [8192, 1000, 16, 1, 4097][i % 5]
            epoch.fill_(ep)
            k.warmup(x, x, stage, [4096, 512, 16, 1][i % 4], pad, n, handles[r], epoch, WORLD=4,
                     BLOCK=1024, OP=0, ACC_F32=1, grid=(1,))
            counts.append(len(cc.compiled_variants(k)))
    return counts


def widths(coll: str, algo: str, dname: str, world: int = 8, n: int = 8192) -> dict:
    """Global load/store widths of what ``coll/algo`` compiles for a launch at ``world`` ranks
    (rank 1) with 16-byte aligned tensors, and the 128-bit accesses one full block needs per
    thread (``vectors``)."""
    ctx = offline.context(1, world, 5)
    with cc.record_launches() as seen:
        offline.launch(coll, algo, ctx, offline.call(coll, algo, DT[dname], n, world))
    out = {}
    for ln in seen:
        k = cc.compile_launch(ln)
        ptx = k.asm["ptx"]
        block = ln.constants[(ln.kernel.arg_names.index("BLOCK"),)]
        ptr = ln.signature[ln.kernel.arg_names[0]]                 # "*bf16", "*i64", ...
        bits = {"*fp32": 32, "*bf16": 16, "*fp16": 16, "*i64": 64, "*i32": 32}[ptr]
        threads = 32 * k.metadata.num_warps
        acc = cc.global_accesses(ptx)
        out[ln.name] = {"ld": {str(b): c for (o, b), c in acc.items() if o == "ld"},
                        "st": {str(b): c for (o, b), c in acc.items() if o == "st"},
                        "vectors": block * bits // 128 // threads,
                        "ordering": cc.ordering_problems(ptx)}
    return out


def widths_many(dname: str, *pairs: str) -> dict:
    """:func:`widths` of several ``coll/algo`` pairs in one process (each subprocess pays
    ~3 s of imports): ``{"coll/algo": widths(coll, algo, dname)}``."""
    return {p: widths(*p.split("/"), dname) for p in pairs}


@triton.jit
def one_barrier(pad, heap, epoch, WORLD: tl.constexpr):
    lang.barrier(pad, 0, epoch, heap, WORLD)


def barrier_syncs(world: int = 8) -> dict:
    """Synchronizing instructions of a kernel that calls ``lang.barrier`` once at ``world``
    ranks (compiled for sm_90), and its ordering problems."""
    k = cc.compile_for(one_barrier, {"pad": "*i64", "heap": "*i64", "epoch": "i64"},
                       {"WORLD": world})
    ptx = k.asm["ptx"]
    return {**cc.sync_counts(ptx), "ordering": cc.ordering_problems(ptx)}


def kv_copy() -> dict:
    """What the KV copy kernel and the layer wait compile to (sm_90), launched by the engine's
    own launcher (``tilecomm.kv.kernel.launch_copy``) on tile tables of real pushes: 64 blocks
    of 16 slots x 8 heads x 128 dims (bf16), whole blocks and a head split (4 of 8 heads);
    per case the global access widths of the data and the ordering problems."""
    from tilecomm.kv import HeadSplit, coalesce, transfers
    from tilecomm.kv.kernel import kv_wait_layer_kernel, launch_copy
    from tilecomm.kv.paths import copy_tiles
    from tilecomm.kv.schedule import CacheGeometry

    out = {}
    src = CacheGeometry(2, 128, 16, 8, 128, torch.bfloat16)
    for name, dst, hs in [("whole", src, HeadSplit.whole(8)),
                          ("heads", CacheGeometry(2, 128, 16, 4, 128, torch.bfloat16),
                           HeadSplit(4, 0, 4))]:
        moves = transfers(coalesce(list(range(64)), list(range(64, 128))), range(0, 2))
        ct = copy_tiles(moves, src, dst, hs, 0, [7, 8], name == "whole", src.nbytes)
        words = offline.aligned(src.nbytes // ct.word_bytes, torch.int32)
        flags = offline.aligned(64, torch.int64)
        table = offline.aligned(len(ct.table), torch.int64)
        counts = offline.aligned(ct.nlayers, torch.int32)
        with cc.record_launches() as seen:      # peers 1 and 0, one layer and two
            launch_copy(ct, words, words, flags, table, counts, 3, 1,
                        offline.FakeHeap(0, 2).handle)
            one = copy_tiles(moves[:1], src, dst, hs, 0, [7], name == "whole", src.nbytes)
            launch_copy(one, words, words, flags, table, counts, 1, 0,
                        offline.FakeHeap(1, 2).handle)
        ptx = cc.compile_launch(seen[0]).asm["ptx"]
        acc = cc.global_accesses(ptx)
        out[name] = {"ld": {str(b): c for (o, b), c in acc.items() if o == "ld"},
                     "st": {str(b): c for (o, b), c in acc.items() if o == "st"},
                     "vec": ct.vec, "ordering": cc.ordering_problems(ptx),
                     "release_sys": [x.split()[1] for x in ptx.splitlines()
                                     if "atom." in x and ".sys" in x and
                                     (".release" in x or ".acq_rel" in x)],
                     "keys": len({ln.key for ln in seen})}
    k = cc.compile_for(kv_wait_layer_kernel, {"flags": "*i64", "first": "i64", "stride": "i64",
                                              "nsrc": "i32", "gen": "i64", "srcs": "*i64",
                                              "heap": "*i64"})
    out["wait"] = {**cc.sync_counts(k.asm["ptx"]), "ordering": cc.ordering_problems(
        k.asm["ptx"])}
    return out


def main(argv) -> int:
    why = cc.cuda_backend_available()
    if why is not None:
        print(why, file=sys.stderr)
        return 3
    fn = globals()[argv[0]]
    args = [int(a) if a.isdigit() else a for a in argv[1:]]
    print("RESULT " + json.dumps(fn(*args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
