"""Hierarchical algorithms lowered to flat schedules: the checker proves every one on layouts
up to 4 hosts x 4 ranks, uneven and interleaved ones included; a broken plan is caught."""

from __future__ import annotations

import itertools

import pytest

from tilecomm.algorithms.checker import ScheduleError, check_schedule
from tilecomm.algorithms.schedule import Schedule
from tilecomm.hier.discover import layout_from_matrix
from tilecomm.hier.layout import HostLayout
from tilecomm.hier.plans import flatten, hier_algorithms, hier_plan
from tilecomm.errors import CommError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
               "all_to_all", "all_to_all_v")

LAYOUTS = [HostLayout.sizes(*s) for s in
           [(1, 1), (2, 2), (2, 1), (1, 2, 1), (3, 3), (4, 4), (4, 1), (1, 4), (2, 3, 4),
            (4, 4, 4, 4), (1, 1, 1, 1), (4, 2, 3, 1), (3, 3, 3, 3)]]
LAYOUTS.append(HostLayout(((0, 2), (1, 3))))           # hosts whose ranks interleave
LAYOUTS.append(HostLayout(((3, 0, 5), (1, 4), (2,))))  # ranks in no particular order


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l.describe().replace(" ", ""))
def test_every_hierarchical_algorithm_is_proved(layout):
    n = 0
    for coll in COLLECTIVES:
        algos = hier_algorithms(coll, layout)
        assert algos, (coll, layout)
        roots = range(layout.world_size) if coll in ("broadcast", "reduce") else [0]
        for algo, root in itertools.product(algos, roots):
            check_schedule(flatten(coll, algo, layout, root))
            n += 1
    assert n >= len(COLLECTIVES)


def test_rail_algorithms_need_an_even_layout():
    uneven = HostLayout.sizes(2, 1)
    assert "hier_rail" not in hier_algorithms("all_reduce", uneven)
    assert "hier_leader" in hier_algorithms("all_reduce", uneven)
    with pytest.raises(ValueError, match="same number of ranks on every host"):
        hier_plan("all_reduce", "hier_rail", uneven, 0, 0)


def test_auto_never_offers_the_rails_on_an_uneven_layout():
    from tilecomm.tuner import choose

    uneven = HostLayout.sizes(2, 1)
    for coll in ("all_to_all", "all_reduce"):
        for nbytes in (64, 1 << 20):
            got = choose(coll, nbytes, 3, kind="hier", available=hier_algorithms(coll, uneven),
                         layout=uneven)
            assert got in hier_algorithms(coll, uneven) and got != "hier_rail"


def test_rail_all_to_all_sends_one_message_per_other_host():
    """Each rank's inter-host moves come from its rail partners only (one per other host)."""
    lay = HostLayout.sizes(3, 3)
    sched = flatten("all_to_all", "hier_rail", lay)
    crossing = [m for ph in sched.phases for m in ph
                if lay.host_of(m.src_rank) != lay.host_of(m.rank)]
    assert crossing
    for m in crossing:
        assert lay.local_rank(m.src_rank) == lay.local_rank(m.rank), m


def test_flattened_plans_cross_hosts_only_on_rail_and_exchange_steps():
    lay = HostLayout.even(2, 2)
    s = flatten("all_reduce", "hier_rail", lay)
    inter = [p for p, ph in enumerate(s.phases)
             if any(lay.host_of(m.rank) != lay.host_of(m.src_rank) for m in ph)]
    assert len(inter) == 1          # the rail step only
    # each rank reads exactly its rail partner across hosts
    for m in s.phases[inter[0]]:
        if lay.host_of(m.rank) != lay.host_of(m.src_rank):
            assert lay.local_rank(m.rank) == lay.local_rank(m.src_rank)


@pytest.mark.parametrize("drop", [0, 1, 2])
def test_checker_catches_a_broken_hierarchical_plan(drop):
    s = flatten("all_reduce", "hier_rail", HostLayout.even(2, 2))
    bad = Schedule(s.collective, s.algo, s.world_size, s.buffers,
                   s.phases[:drop] + s.phases[drop + 1:], s.root)
    with pytest.raises(ScheduleError):
        check_schedule(bad)


def test_rails_of_an_uneven_layout_have_one_rank_per_host():
    lay = HostLayout.sizes(3, 1, 2)
    assert lay.max_local == 3
    for c in range(3):
        rail = lay.rail(c)
        assert [lay.host_of(r) for r in rail] == [0, 1, 2]
    assert lay.rails_of(3) == (0, 1, 2)       # the one-rank host sits on every rail
    assert lay.rails_of(4) == (0, 2) and lay.rails_of(5) == (1,)


def test_hosts_from_what_ranks_can_map():
    # ranks 0 and 2 map each other, 1 and 3 do: two hosts, whatever the hostnames say
    rows = ["1010", "0101", "1010", "0101"]
    assert layout_from_matrix(rows).hosts == ((0, 2), (1, 3))
    with pytest.raises(CommError, match="cannot map"):
        layout_from_matrix(["111", "110", "101"])   # 1 and 2 both map 0 but not each other
