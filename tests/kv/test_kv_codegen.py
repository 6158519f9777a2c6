"""What the KV copy kernel and the layer wait compile to for sm_90, checked without a GPU:
the engine's own launcher on tile tables of real pushes, through Triton's binder and
specialization (tests/kernels/codegen.py ``kv_copy``; the pytest process must not import the
kernels without the interpreter, so it runs in a subprocess)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.compile

CODEGEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "codegen.py")


@pytest.mark.slow
def test_copy_kernel_moves_128_bit_words_and_publishes_each_layer_with_release():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, CODEGEN, "kv_copy"], env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode == 3:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    for case in ("whole", "heads"):
        c = out[case]
        # the data: 128-bit loads and stores only (the 64-bit loads are the tile table's and
        # the handle's scalars)
        assert c["st"] == {"128": c["st"]["128"]} and c["ld"]["128"] >= 1, c
        assert set(c["ld"]) <= {"64", "128"}, c
        # the layer counter (acq_rel) and the flag (release), both at system scope, each
        # after a CTA barrier (compile_check.ordering_problems)
        assert c["release_sys"] == ["atom.global.sys.acq_rel.add.u32",
                                    "atom.global.sys.release.exch.b64"], c
        assert c["ordering"] == [], c
        assert c["keys"] == 1, c          # other peers and layer counts: the same binary
    assert out["wait"]["acquire"] >= 1 and out["wait"]["ordering"] == [], out["wait"]
