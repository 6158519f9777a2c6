"""lang's compatibility path (Triton without tl.atomic_load / tl.atomic_poll, e.g. 3.6), forced
with TILECOMM_DEVICE_COMPAT=1 under whatever Triton is installed (CI: 3.9).

(a) a few device-API and kernel scenarios in the interpreter, 2 ranks: put + signal + wait,
    barriers (all and subset), the registered one_shot all_reduce kernel through the
    Communicator, and a wait on a silent peer that times out and names it;
(b) the tutorials' kernels compiled for sm_90 with the compat path: the PTX has the global
    timer spin, acquire loads, release atomics, and passes compile_check's ordering check.

Like the rest of tests/device, the pytest process never imports lang: rank processes and a
subprocess do, with the environment set first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from .helpers import EXAMPLES, run_tutorial
from .test_device_api import _silent_peer

pytestmark = pytest.mark.interpreter


def _compat_flags(comm):
    from tilecomm.device import lang

    return lang.COMPAT, lang.INTERPRETED


def _one_shot_all_reduce(comm, n):
    """The registered one_shot kernel on CPU tensors (TILECOMM_CPU_KERNELS=triton path)."""
    w, r = comm.world_size, comm.rank
    comm.use_cpu_kernels("triton")
    try:
        out = []
        for k in range(2):
            x = torch.arange(n, dtype=torch.float32) * (r + 1) + k
            comm.all_reduce(x, algo="one_shot")
            want = torch.arange(n, dtype=torch.float32) * (w * (w + 1) // 2) + w * k
            out.append(torch.equal(x, want))
        return out
    finally:
        comm.use_cpu_kernels("executor")


@pytest.mark.slow
def test_compat_interpreter_scenarios(rank_pool):
    pool = rank_pool(2, "compat")
    assert pool.run(_compat_flags) == [(True, True)] * 2
    compat_ranks = pool.run
    t = time.perf_counter()
    # put + signal_set + wait_ge (ping-pong), three epochs
    seen = compat_ranks(run_tutorial, "01_notify_wait", 16, 3)
    assert seen[0] == [[(i * 10 + e) * 2 for i in range(16)] for e in (1, 2, 3)]
    # put/get through peer pointers, then signals
    assert compat_ranks(run_tutorial, "02_put_get", 100, 64, 1) == [2 * 100] * 2
    # barrier of all ranks (vector release + acquire), then a subset barrier with signal_add
    assert compat_ranks(run_tutorial, "03_barrier", 40, 32, 2)[0] == 2
    # a registered collective kernel through the Communicator
    assert compat_ranks(_one_shot_all_reduce, 100) == [[True, True]] * 2
    # last (leaves rank 1 an epoch ahead): a wait on a silent peer times out and names it
    _, res = pool.run_and_discard(_silent_peer, 0.3)
    assert res[0] == "DeviceTimeout", res
    name, msg, rank, peer, epoch, slot, site, missing, elapsed, again = res
    assert (rank, peer, epoch, slot, site, missing) == (1, 0, 7, 0, 1, (0,))
    assert "ping_pong" in msg and "rank 1 timed out" in msg and "rank 0" in msg
    assert 0.3 <= elapsed < 10, elapsed          # bounded by the CPU clock, not a hang
    assert time.perf_counter() - t < 60


_PTX_FACTS = r"""
import json, re, sys
from tilecomm.device import lang
from tilecomm.device.compile_check import (compile_for, cuda_backend_available, load_module,
                                           ordering_problems)
if cuda_backend_available() is not None:
    print(json.dumps({"skip": cuda_backend_available()})); sys.exit(0)
facts = {"compat": lang.COMPAT, "native_available": lang.NATIVE_AVAILABLE, "kernels": {}}
for path in sys.argv[1:]:
    for kernel, sig, consts in load_module(path).COMPILE:
        ptx = compile_for(kernel, sig, consts).asm["ptx"]
        ops = re.findall(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)", ptx, re.M)
        facts["kernels"][kernel.__name__] = {
            "globaltimer": ptx.count("%globaltimer"),
            "acquire": sum(o.startswith(("ld.", "atom.")) and ".acquire" in o and ".sys" in o
                           for o in ops),
            "release": sum(o.startswith("atom.") and ".release" in o and ".sys" in o
                           for o in ops),
            "volatile_loads": sum(o.startswith("ld.volatile") for o in ops),
            "native_ops": sum(o.startswith("fence.acquire") for o in ops),
            "bar_sync": sum(o.startswith("bar.sync") for o in ops),
            "ordering": ordering_problems(ptx),
        }
print(json.dumps(facts))
"""


@pytest.mark.slow
@pytest.mark.compile
def test_compat_ptx_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILECOMM_DEVICE_COMPAT"] = "1"
    files = [os.path.join(EXAMPLES, f + ".py") for f in ("01_notify_wait", "03_barrier")]
    r = subprocess.run([sys.executable, "-c", _PTX_FACTS, *files], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in facts:
        pytest.skip(facts["skip"])
    assert facts["compat"] is True
    ks = facts["kernels"]
    assert set(ks) == {"ping_pong", "gather_then_barrier", "subset_barrier"}
    for name, k in ks.items():
        # bounded polls read the global timer; waits acquire at system scope (ld.acquire.sys
        # for a scalar, atom.acquire.sys.add of 0 per lane in lang.barrier); signals are
        # release atomics at system scope, each after a bar.sync (the ordering check)
        assert k["globaltimer"] >= 2, (name, k)
        assert k["acquire"] >= 1 and k["release"] >= 1, (name, k)
        assert k["volatile_loads"] >= 1, (name, k)
        assert k["native_ops"] == 0, (name, k)       # no fence.acquire: that is 3.9's lowering
        assert k["ordering"] == [], (name, k)
    # ping_pong: rank 0 signals once, rank 1 once (two release atomics); two waits
    assert ks["ping_pong"]["release"] == 2 and ks["ping_pong"]["acquire"] >= 2
