"""``dist.shrink_group`` with ``backend="tilecomm"`` (NOTE [shrink_group] in
tilecomm/torch/__init__.py), and the elastic DDP example on one host."""

from __future__ import annotations

import importlib.util
import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from tilecomm import CommAborted

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic_ddp.py"


def _shrink_default_group(comm):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) \
        if comm.rank == 0 else None
    port = comm.exchange([store.port if store else 0])[0][0]
    store = store or dist.TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group("tilecomm", store=store, rank=comm.rank, world_size=3,
                            timeout=timedelta(seconds=20))
    old = dist.group.WORLD
    t = torch.ones(8)
    dist.all_reduce(t)
    if comm.rank == 2:                   # left out, alive: it just leaves
        dist.destroy_process_group()
        comm.barrier()                   # the others' barrier below
        return None
    # SHRINK_ABORT would cut a peer still finishing the all_reduce above (as it should):
    # examples/elastic_ddp.py uses it after a failure, where nothing is left to finish
    new = dist.shrink_group([2])
    x = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    got = (dist.get_rank(), dist.get_world_size(), new.size(), x[0].item(),
           c10d._get_group_desc(new) if hasattr(c10d, "_get_group_desc") else new.group_desc,
           new is dist.group.WORLD, old.comm.closed)
    # torch's abort path reaches the communicator: its calls end with CommAborted. Both
    # ranks finish the all_reduce above first (a barrier of the pool's own communicator):
    # an abort cuts short whatever call of the group a peer is still finishing, by design
    comm.barrier()
    new.abort()
    try:
        dist.all_reduce(x)
        after = "completed"
    except CommAborted:
        after = "CommAborted"
    dist.destroy_process_group()
    return got + (after,)


def test_dist_shrink_group_runs_on_tilecomm(rank_pool):
    out = rank_pool(3).run_and_discard(_shrink_default_group)
    assert out[2] is None
    for rank in (0, 1):
        assert out[rank] == (rank, 2, 2, 3.0, "default:shrunken", True, True, "CommAborted")


def _example(tmp: Path, *args) -> dict:
    """Run the example's main in this process (its ranks fork from here: no interpreter to
    start and no torch to import again)."""
    out = tmp / f"losses-{len(list(tmp.iterdir()))}.json"
    spec = importlib.util.spec_from_file_location("elastic_ddp", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(["--steps", "5", "--census", "0.3", "--losses", str(out), *args])
    data = json.loads(out.read_text())
    return {int(k): v for k, v in data["losses"].items()} | {"events": data["events"],
                                                            "sizes": data["world_sizes"]}


def test_elastic_ddp_survivors_train_on_as_a_smaller_job_would(tmp_path):
    """3 ranks under tilecomm.launch, rank 2 killed at step 2: the survivors shrink to 2 and
    finish; from step 2 on their losses equal those of a 2-rank run started from the state
    they resumed from."""
    state = tmp_path / "state.pt"
    run = tmp_path / "runs"
    run.mkdir()
    got = _example(run, "--local", "3", "--kill-rank", "2", "--at", "2", "--ckpt", str(state))
    assert [e["lost"] for e in got["events"]] == [[2]]
    assert {int(k): v for k, v in got["sizes"].items()} == {0: 3, 1: 3, 2: 2, 3: 2, 4: 2}
    ref = _example(run, "--local", "2", "--resume", str(state))
    assert sorted(k for k in ref if isinstance(k, int)) == list(range(2, 5))
    for step in range(2, 5):
        assert abs(got[step] - ref[step]) <= 1e-6, (step, got[step], ref[step])
    assert got[4] < got[0]                      # it trains
