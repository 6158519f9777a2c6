"""The simulator and the runtime offer the same algorithms by the same names (issue 37).

Without ``what_if`` every row of ``tilecomm sim --library tilecomm`` names an ``algo=`` the
runtime accepts on ranks placed like the simulated system: the registry's on one node, the
hierarchical ones across nodes. What the model has beyond that (NCCL's dbtree/nvls, bruck, the
ring-based ``hierarchical``, flat schedules across nodes) appears only with ``--what-if``,
labelled. ``rhd``, once model-only, is a registered schedule: it runs on the CPU executor with
the reference's bits, and the simulator's fast builder is its exact traffic.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tilecomm import reference
from tilecomm.algorithms import algorithms, even_chunks, get_schedule
from tilecomm.hier.layout import HostLayout
from tilecomm.hier.plans import flatten, hier_algorithms
from tilecomm.sim import builders, predict
from tilecomm.sim.api import candidates
from tilecomm.sim.cli import main
from tilecomm.sim.flowsched import from_plans, from_registered, model_plans
from tilecomm.sim.hierflows import chunk_frac, hier_flows, moves_estimate
from tilecomm.topology import build

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
               "all_to_all")
#: (system, nodes, gpus per node or None for all): one node of several kinds, GPU clusters
#: across nodes, one GPU per node, a shared-memory host
SHAPES = [("dgx-h100", 1, None), ("dgx-a100", 1, None), ("dgx-h100", 1, 6),
          ("dgx-h100", 2, None), ("dgx-h100", 4, None), ("dgx-a100", 3, 4),
          ("dgx-h100", 4, 1), ("cpu-shm", 1, 2), ("gb200-nvl72", 2, None)]


def _runtime_names(collective, topo):
    if topo.nodes == 1:
        return set(algorithms(collective))
    return set(hier_algorithms(collective, HostLayout.even(topo.nodes, topo.gpus)))


@pytest.mark.parametrize("system,nodes,gpus", SHAPES)
def test_every_candidate_without_what_if_is_a_runtime_algorithm(system, nodes, gpus):
    topo = build(system, nodes, gpus)
    for coll in COLLECTIVES:
        ours = candidates(coll, topo)
        assert ours, (coll, system, nodes)
        assert set(ours) <= _runtime_names(coll, topo), (coll, system, nodes, ours)
        assert "hierarchical" not in ours
        wider = candidates(coll, topo, what_if=True)
        assert set(ours) <= set(wider)


def test_what_if_rows_are_marked_and_runtime_rows_are_not():
    for nodes in (1, 2):
        topo = build("dgx-h100", nodes)
        runtime = _runtime_names("all_reduce", topo)
        preds = predict("all_reduce", 1 << 20, nodes=nodes, what_if=True)
        assert {p.algo for p in preds} - runtime, "the what-ifs are there"
        for p in preds:
            assert p.what_if == (p.algo not in runtime), p
        assert not any(p.what_if for p in predict("all_reduce", 1 << 20, nodes=nodes))
    multi = {p.algo for p in predict("all_reduce", 1 << 20, nodes=2, what_if=True)}
    assert {"hierarchical", "dbtree", "ring"} <= multi
    assert {"nvls", "dbtree"} <= {p.algo for p in predict("all_reduce", 1 << 20,
                                                          what_if=True)}


def test_cli_shows_runtime_names_and_labels_what_ifs(tmp_path, capsys):
    """The issue's session: 4 nodes of dgx-h100 pick an algorithm comm.all_reduce accepts."""
    out = tmp_path / "p.json"
    assert main(["sim", "all_reduce", "--system", "dgx-h100", "--nodes", "4", "-b", "1K",
                 "-e", "1G", "-f", "1024", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hier_rail" in text and "hierarchical" not in text and "dbtree" not in text
    assert "what-if" not in text
    rows = json.loads(out.read_text())["predictions"]
    assert {r["algo"] for r in rows} <= set(hier_algorithms("all_reduce", HostLayout.even(4, 8)))
    assert not any(r["what_if"] for r in rows)

    assert main(["sim", "all_reduce", "--system", "dgx-h100", "--nodes", "4", "-b", "1M",
                 "-e", "1M", "--what-if", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hierarchical (what-if)" in text and "dbtree (what-if)" in text
    assert "what-if: modeled, not in the runtime" in text
    assert "hier_rail (what-if)" not in text
    rows = json.loads(out.read_text())["predictions"]
    assert {r["algo"] for r in rows if r["what_if"]} >= {"hierarchical", "dbtree", "ring"}

    assert main(["sim", "all_reduce", "-b", "1M", "-e", "1M", "--what-if"]) == 0
    assert "nvls (what-if)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["sim", "all_reduce", "-b", "1M", "-e", "1M", "--what-if", "--library", "nccl"])
    assert "--what-if applies to --library tilecomm" in capsys.readouterr().err


def test_nccl_library_keeps_nccl_algorithms(capsys):
    assert main(["sim", "all_reduce", "--library", "nccl", "-b", "1M", "-e", "1M"]) == 0
    text = capsys.readouterr().out
    assert "nvls" in text and "what-if" not in text


# ---- rhd: a registered schedule, and the builder its exact traffic -----------------------------
def _assert_same_flows(a, b, what):
    assert len(a.phases) == len(b.phases), what
    for i, (x, y) in enumerate(zip(a.phases, b.phases)):
        assert x.repeat == y.repeat, (what, i)
        for f in ("dst", "src", "frac", "reduce"):
            assert np.array_equal(getattr(x, f), getattr(y, f)), (what, i, f)


@pytest.mark.parametrize("w", range(1, 18))
def test_rhd_builder_is_the_registered_schedule(w):
    _assert_same_flows(builders.rhd("all_reduce", w), from_registered("all_reduce", "rhd", w),
                       f"rhd W={w}")


def test_rhd_is_offered_at_any_world_size_and_scales():
    assert "rhd" in candidates("all_reduce", build("dgx-h100", 1, 6))
    big = build("dgx-h100", 64)        # 512 ranks: the builder, not 500k materialized moves
    p = predict("all_reduce", 1 << 30, nodes=64, algo="rhd", what_if=True, engine="phases")[0]
    assert p.what_if and p.time_us > 0 and "rhd" in candidates("all_reduce", big, True)


# ---- hierarchical rows are timed from the runtime's own plans ---------------------------------
@pytest.mark.parametrize("coll", COLLECTIVES)
def test_hier_flows_are_the_flattened_plans(coll):
    """hier flows = the flattened schedule's moves, every chunk ``chunk_frac`` of the message
    (a chunk of a hierarchical plan is ``1/nchunks(buf)`` of the buffer, or one rank's block)."""
    lay = HostLayout.even(2, 3)
    for algo in hier_algorithms(coll, lay):
        sched = flatten(coll, algo, lay)
        frac = chunk_frac(coll, algo, lay)
        in_place = coll in ("all_reduce", "broadcast", "reduce")
        want = 1 / sched.buffer("buf").nchunks if in_place else 1 / lay.world_size
        assert frac == pytest.approx(want, rel=1e-9), (coll, algo)
        _assert_same_flows(hier_flows(coll, algo, lay),
                           from_plans(model_plans(sched), chunk_frac=frac), f"{coll}/{algo}")
        est = moves_estimate(coll, algo, lay)
        moves = sum(len(ph) for ph in sched.phases)
        assert moves / 2 <= est <= 2 * moves + 20, (coll, algo, est, moves)


def test_hierarchical_builder_is_not_hier_rail():
    """The model's ring-based ``hierarchical`` moves other traffic than the runtime's
    ``hier_rail`` (direct legs), so it stays a what-if instead of lending hier_rail its name."""
    lay = HostLayout.even(4, 2)
    ours = hier_flows("all_reduce", "hier_rail", lay)
    model = builders.hierarchical("all_reduce", 4, 2)
    assert ours.num_steps != model.num_steps
    moved = [sum(float(p.frac[p.src != p.dst].sum()) * p.repeat for p in fs.phases)
             for fs in (ours, model)]
    assert moved[0] != pytest.approx(moved[1])


# ---- rhd on the CPU communicator -------------------------------------------------------------
def _ints(seed, rank, n, dtype):
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def _floats(seed, rank, n):
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    return (x * torch.exp2(torch.randint(-6, 7, (n,), generator=g)).double()).float()


def _run_rhd(comm, cases):
    out = []
    for seed, n, dtype, op in cases:
        t = (_floats(seed, comm.rank, n) if dtype == "random" else
             _ints(seed, comm.rank, n, dtype))
        assert comm.all_reduce(t, op, algo="rhd") is t
        out.append(t)
    return out


def _in_schedule_order(xs):
    """rhd's float32 sums in the order its schedule lists them (each chunk reduced once)."""
    w = len(xs)
    sched = get_schedule("all_reduce", "rhd", w)
    n = xs[0].numel()
    lens = even_chunks(n, sched.buffer("buf").nchunks)
    start = np.cumsum([0] + lens)
    state = [x.clone() for x in xs]

    def part(rank, loc):
        return state[rank][start[loc.chunk]:start[loc.chunk + 1]]

    for p in range(len(sched.phases)):
        for r in range(w):
            for red in sched.reductions_of(r, p):
                vals = ([part(r, red.dst).clone()] if red.accumulate else []) + \
                    [part(sr, loc).clone() for sr, loc in red.srcs]
                acc = vals[0]
                for v in vals[1:]:
                    acc = acc + v
                part(r, red.dst).copy_(acc)
    return state


@pytest.mark.parametrize("world_size", [3, 4])
def test_rhd_on_the_cpu_communicator_is_bit_exact(rank_pool, world_size):
    # 20_011 float64 elements exceed the test ranks' 64 KiB scratch: several pieces
    ints = [(i, n, d, op) for i, (n, d, op) in enumerate(
        (n, d, op) for n in (1, 7, 1000, 20_011)
        for d in (torch.float32, torch.float64, torch.bfloat16, torch.int32)
        for op in ("sum", "max", "avg") if op != "avg" or d.is_floating_point)]
    floats = [(100 + i, n, "random", "sum") for i, n in enumerate((5, 4099, 40_001))]
    results = rank_pool(world_size).run(_run_rhd, ints + floats)
    for c, (seed, n, dtype, op) in enumerate(ints):
        want = reference.all_reduce([_ints(seed, r, n, dtype) for r in range(world_size)], op)
        for r in range(world_size):
            assert torch.equal(results[r][c], want[r]), (dtype, n, op, r)
    for c, (seed, n, _, _) in enumerate(floats, start=len(ints)):
        xs = [_floats(seed, r, n) for r in range(world_size)]
        want = _in_schedule_order(xs)
        for r in range(world_size):
            assert torch.equal(results[r][c].view(torch.int32), want[r].view(torch.int32)), r
            assert torch.equal(results[r][c], results[0][c])     # every rank the same bits
