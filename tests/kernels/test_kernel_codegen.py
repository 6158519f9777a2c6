"""What the collective kernels compile to on a GPU, checked without one (no TRITON_INTERPRET):
recompiles from Triton's argument specialization, vector widths of peer accesses, the cost of
a barrier in fences.

How: each check runs ``tests/kernels/codegen.py`` in a subprocess (the pytest process must
not import the kernels: its forked rank processes turn the interpreter on). That module uses
``tilecomm.device.compile_check``'s offline launch path: a stand-in for Triton's active driver
reporting ``cuda:sm_90`` makes ``JITFunction.run`` work on a CPU-only machine, so the **real
launchers** call ``kernel[grid](...)`` with a real ``KernelContext`` (on 256-byte aligned CPU
tensors) and **Triton's own binder** (``create_function_from_signature`` ->
``specialize_impl``: an integer equal to 1 becomes a constant, integers and pointers divisible
by 16 get the ``D`` / ``tt.divisibility`` attribute) computes the cache key and attributes;
Triton's ``jit_cache_hook`` records them and skips the launch. The PTX checks compile exactly
those recorded launches (signature, constants, attributes) for sm_90; one check compiles
through ``JITFunction.run(warmup=True)`` itself and counts the kernel cache's entries. No mock
of the specialization: only the driver (target, device name, stream) is stood in for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.compile

HERE = os.path.dirname(os.path.abspath(__file__))


def _codegen(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, os.path.join(HERE, "codegen.py"), *map(str, args)],
                       env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
def test_one_cache_key_per_kernel_across_epochs_ranks_sizes():
    # 22 epochs (1..20, 32, 48) x ranks 0..3, element counts 28..4100 (not all multiples of
    # 16), broadcast roots 0..3: every kernel (fp32 and bf16) compiles one variant. Before the
    # do_not_specialize list, one_shot had 12 keys here (epoch 1 / 16k / other, rank 1 / other,
    # n divisible by 16 or not) and pairwise all_to_all 18.
    keys = _codegen("launch_keys")
    expected = {"one_shot_all_reduce_kernel", "two_shot_all_reduce_kernel",
                "all_gather_direct_kernel", "all_gather_ring_kernel",
                "reduce_scatter_direct_kernel", "reduce_scatter_ring_kernel",
                "pairwise_all_to_all", "direct_broadcast"}
    assert {k.split("[")[0] for k in keys} == expected | {"all_to_all_v_counts"}
    many = {k: v for k, v in keys.items() if len(v) != 1}
    assert not many, json.dumps(many, indent=1)[:4000]
    # the runtime integers are unspecialized (None), pointers keep their 16-byte tag ('D')
    one_shot = keys["one_shot_all_reduce_kernel[bf16]"][0]
    assert "('i32', None)" in one_shot and "('*bf16', 'D')" in one_shot, one_shot


@pytest.mark.slow
def test_compiled_variants_stay_one_through_jit_warmup():
    # JITFunction.run(warmup=True) on target sm_90: 20 compiles requested with epochs 1..20,
    # ranks 0..3 (1 included) and n in {8192, 1000, 16, 1, 4097}; the kernel cache holds one
    # variant after the first call and after the last
    assert _codegen("warmup_variants") == [1] * 20


def _ld128(w):
    return w["ld"].get("128", 0)


def _st128(w):
    return w["st"].get("128", 0)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_peer_reads_are_128_bit(dtype):
    # 8 ranks, 16-byte aligned tensors, n = 8192. Per full block, a thread needs `vectors`
    # 128-bit accesses per source (BLOCK * itemsize / 16 / threads). Counted statically in the
    # PTX; the partial last block (masked) stays scalar by design. Before the fix the peer
    # path had no 128-bit load at all (scalar ld.global.b16 / .b32: peer_ptr lost the
    # alignment, and the runtime-n mask kept every block scalar).
    W = 8
    got = _codegen("widths_many", dtype, "all_reduce/one_shot", "all_reduce/two_shot",
                   "all_gather/direct", "reduce_scatter/direct", "all_to_all/pairwise",
                   "broadcast/direct")
    one = got["all_reduce/one_shot"]["one_shot_all_reduce_kernel"]
    v = one["vectors"]
    assert v >= 1 and not one["ordering"]
    assert _ld128(one) >= W * v + v, one            # W peers' stages + the local staging read
    two = got["all_reduce/two_shot"]["two_shot_all_reduce_kernel"]
    # W sources of the owned chunk, W peers' reduced chunks, W chunks staged
    assert _ld128(two) >= 3 * W * two["vectors"], two
    assert _st128(two) >= 2 * W * two["vectors"], two     # chunk starts are 16-byte aligned
    ag = got["all_gather/direct"]["all_gather_direct_kernel"]
    assert _ld128(ag) >= W * ag["vectors"] + ag["vectors"], ag
    assert _st128(ag) >= W * ag["vectors"], ag     # n % (16 B) == 0: out + j*n is aligned
    rs = got["reduce_scatter/direct"]["reduce_scatter_direct_kernel"]
    assert _ld128(rs) >= W * rs["vectors"], rs     # m % (16 B) == 0: src_q + r*m is aligned
    # all_to_all moves int64 words: the put into the peer's staging row (peer stores), the
    # local copy and the read of the own staging row are 128-bit (ld/st.global.v2.b64)
    a2a = got["all_to_all/pairwise"]["pairwise_all_to_all"]
    assert _ld128(a2a) >= 3 * a2a["vectors"] and _st128(a2a) >= 3 * a2a["vectors"], a2a
    bc = got["broadcast/direct"]["direct_broadcast"]
    assert _ld128(bc) >= 2 * bc["vectors"] and _st128(bc) >= 2 * bc["vectors"], bc


@pytest.mark.slow
def test_barrier_costs_one_release_at_eight_ranks():
    # lang.barrier once at WORLD=8, compiled for sm_90. Before: 8 release atomics in the code
    # (one per possible peer, 7 executed one after another: a fence and a remote round trip
    # each) and 16 fence.acquire (two per peer wait). Now: one vector release atomic (lanes =
    # peers, a single fence for the warp) and the acquire of one vector load, twice in the
    # code (first look, poll loop).
    for world in (8, 3):
        res = _codegen("barrier_syncs", world)
        assert res["ordering"] == [], res
        assert res["release"] == 1, res
        assert res["acquire"] <= 2, res


def test_two_shot_chunks_start_16_byte_aligned():
    # the chunk bounds the kernel uses (all_reduce.chunk_start) against the rule, in Python
    def start(c, n, w, a):
        return min((c * n // w + (c // w) * (a - 1)) // a * a, n)

    for a in (2, 4, 8):
        for w in (2, 3, 8):
            for n in (1, 5, 7, 33, 157, 1000, 4099):
                b = [start(c, n, w, a) for c in range(w + 1)]
                assert b[0] == 0 and b[-1] == n and b == sorted(b)
                assert all(x % a == 0 for x in b[:-1])
                assert all(b[c + 1] - b[c] <= -(-n // w) + a for c in range(w))
