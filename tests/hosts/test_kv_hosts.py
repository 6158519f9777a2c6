"""The KV transfer engine across simulated hosts (torchrun per host, tilecomm.simhosts): the
scenarios of tests/kv/kv_scenarios.py with the two sides of each request on different hosts."""

import re

import pytest
from shared_launches import KV_NAMES

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

SCRIPT = "kv_hosts.py"


def _ok(out: str, name: str) -> list[str]:
    return re.findall(rf"rank \d+ {name} ok.*", out)


@pytest.mark.timeout(400)
def test_requests_errors_and_layers_across_two_hosts(shared_hosts):
    out, _ = shared_hosts((2, 2))
    for name in KV_NAMES[(2, 2)]:
        assert len(_ok(out, name)) == 4, (name, out[-3000:])
    # the receiver on the other host saw each layer as it landed
    assert "rank 2 layer_by_layer ok [[True, False, False], [True, True, False], " \
           "[True, True, True]]" in out, out[-3000:]
    # both sides of a bad call raised, each naming what was wrong
    assert re.search(r"rank 2 errors ok .*'unknown': \"rank 0 pushed request 'nope'", out)
    assert re.search(r"rank 0 errors ok .*'mine': \"rank 2 rejected request 'mine'", out)
    # a request past its deadline ended on both hosts; held blocks were refused on both
    assert re.search(r"rank 2 deadlines ok \{'state': 'stalled'", out), out[-3000:]
    assert re.search(r"rank 0 deadlines ok .*'held': \"rank 2 rejected request 'h2'", out)


@pytest.mark.timeout(400)
def test_heads_resharded_across_hosts(shared_hosts):
    out, _ = shared_hosts((2, 1))
    assert len(_ok(out, "head_split_gather")) == 3 and len(_ok(out, "head_split_scatter")) == 3
    # rank 1 (host 0) was told that the request failed on rank 2 (host 1) because of rank 0
    assert len(_ok(out, "retries_and_failures")) == 3, out[-3000:]
    assert re.search(r"rank 1 retries_and_failures ok .*'g': \"rank 2 gave up request 'g'",
                     out), out[-3000:]
    assert re.search(r"rank 2 retries_and_failures ok .*'g_blocks_untouched': True", out)


@pytest.mark.timeout(400)
def test_a_sender_that_dies_is_named_by_its_receiver(run_on_hosts):
    out = run_on_hosts((2, 2), SCRIPT, "dead_sender")
    m = re.search(r"rank 2: dead_sender OK after (\d+\.\d)s: .*rank 0", out)
    assert m, out[-3000:]
    assert float(m.group(1)) < 30, "noticed only by the timeout (60 s), not by the link"


@pytest.mark.timeout(300)
def test_bench_kv_across_two_hosts_moves_every_request_exactly():
    from tilecomm import simhosts
    from tilecomm.bench.kv import KVBenchConfig, run

    reason = simhosts.available()
    if reason:
        pytest.skip(f"simulated hosts unavailable here: {reason}")
    row = run(KVBenchConfig(hosts=[1, 1], layers=3, blocks=40, block_size=4, kv_heads=2,
                            head_dim=16, request_blocks=6, requests=2, rounds=2,
                            fragmented=True))
    assert row["wrong"] == 0
    assert "memcpy_shm_time_us" not in row      # no shared memory between the two hosts
    assert row["time_us"] > 0 and row["naive_time_us"] > 0 and row["memcpy_time_us"] > 0
