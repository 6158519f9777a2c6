"""What the shared launch of each layout runs (tests/hosts/hosts_api.py, the ``shared_hosts``
fixture): starting simulated hosts costs seconds of CPU per host and rank (torchrun, then torch
imported by every process), so every scenario that leaves the ranks alive runs in the one
launch of its layout, one after another, each with its own communicator or process group. The
tests of test_hosts.py, test_kv_hosts.py, test_moe_hosts.py and test_elastic_hosts.py read
their parts of its output.
A scenario that ends a rank (a rank that dies) keeps a launch of its own."""

from __future__ import annotations

#: MoE dispatch/combine cases per layout: name -> tokens per rank (moe_hosts.py)
MOE_CASES = {
    (2, 2): {"bf16": [5, 0, 7, 3], "fp8": [4, 6, 2, 5], "f32": [9, 8, 7, 9]},
    (1, 2, 1): {"int32": [6, 3, 0, 4], "grad": [5, 0, 6, 3]},    # uneven: partners wrap
}

#: KV transfer scenarios per layout (kv_hosts.py, tests/kv/kv_scenarios.py)
KV_NAMES = {
    (2, 2): ("many_requests", "all_pairs", "layer_by_layer", "errors", "geometry_mismatch",
             "heap_after_close", "deadlines"),
    (2, 1): ("head_split_gather", "head_split_scatter", "retries_and_failures"),
}

#: hosts_faults.py scenarios that leave the ranks alive, per layout
FAULTS = {(2, 2): "mismatch", (1, 2, 1): "shm", (2, 1): "splits"}

#: layouts whose launch also runs hosts_shrink.py (an abort across hosts, then shrinks)
ELASTIC = ((2, 2),)

#: layouts whose launch also runs every collective and the torch backend
API = ((2, 2), (1, 2, 1))

LAYOUTS = tuple(sorted(set(MOE_CASES) | set(KV_NAMES) | set(FAULTS) | set(API)))


def scenarios(per_host: tuple, out_dir: str) -> list[str]:
    """hosts_api.py's arguments for the shared launch of ``per_host``."""
    args = ["collectives", "torch"] if per_host in API else []
    args.append(FAULTS[per_host])
    if per_host in ELASTIC:
        args.append("elastic")
    if per_host in KV_NAMES:
        args.append("kv:" + ",".join(KV_NAMES[per_host]))
    if per_host in MOE_CASES:
        cases = "/".join(f"{n}:{','.join(map(str, t))}" for n, t in MOE_CASES[per_host].items())
        args.append(f"moe:{out_dir}|{cases}")
    return args
