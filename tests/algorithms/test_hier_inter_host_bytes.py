"""What each hierarchical algorithm sends between hosts per call, against its formula.

On simulated hosts the inter-host link is loopback TCP on the same cores, so wall-clock time
cannot show what the hierarchy saves; the bytes can. Counted from the flattened plans (the
schedule the checker proves and the simulator times: a move whose source rank is on another
host crosses), in units of the call's size S as the bench reports it (all_gather: the output;
otherwise the input), on H hosts of P ranks (W = H P):

=================  ==================  ==========================================
collective         algorithm           bytes between hosts
=================  ==================  ==========================================
all_reduce         hier_rail           H (H - 1) S   (each rail: its 1/P of S)
all_reduce         hier_leader         H (H - 1) S   (the leaders: all of S)
all_reduce         hier_rail_first     W (H - 1) S   (every rank's whole buffer)
all_gather         hier_rail/_leader   (H - 1) S     (each host gets the others' part)
reduce_scatter     hier_rail           (H - 1) S
reduce_scatter     hier_leader         H (H - 1) S
broadcast, reduce  hier_rail           (H - 1) S
all_to_all         hier_rail/_direct   (W - P) S     (the blocks bound for other hosts)
=================  ==================  ==========================================

Gloo's ring over all W ranks, for comparison, sends 2 (W - 1) S around its ring for an
all_reduce, of which at least 2 H (W - 1) / W S cross hosts.
"""

from fractions import Fraction

import pytest

from tilecomm.hier.layout import HostLayout
from tilecomm.hier.plans import flatten, hier_algorithms

FORMULA = {
    ("all_reduce", "hier_rail"): lambda h, p: h * (h - 1),
    ("all_reduce", "hier_leader"): lambda h, p: h * (h - 1),
    ("all_reduce", "hier_rail_first"): lambda h, p: h * p * (h - 1),
    ("all_gather", "hier_rail"): lambda h, p: h - 1,
    ("all_gather", "hier_leader"): lambda h, p: h - 1,
    ("reduce_scatter", "hier_rail"): lambda h, p: h - 1,
    ("reduce_scatter", "hier_leader"): lambda h, p: h * (h - 1),
    ("broadcast", "hier_rail"): lambda h, p: h - 1,
    ("reduce", "hier_rail"): lambda h, p: h - 1,
    ("all_to_all", "hier_rail"): lambda h, p: h * p - p,
    ("all_to_all", "hier_direct"): lambda h, p: h * p - p,
}


def crossing(collective: str, algo: str, lay: HostLayout) -> Fraction:
    """Bytes between hosts of one call, as a multiple of its size."""
    sched = flatten(collective, algo, lay)
    chunks = {b.name: b.nchunks for b in sched.buffers}
    # every buffer of a call is cut in chunks of one size (hier/backend.py _Run._setup)
    unit = Fraction(1, chunks["buf"]) if collective in ("all_reduce", "broadcast", "reduce") \
        else Fraction(1, lay.world_size)
    moves = sum(1 for ph in sched.phases for m in ph
                if lay.host_of(m.src_rank) != lay.host_of(m.rank))
    return moves * unit


@pytest.mark.parametrize("hosts,per_host", [(2, 2), (3, 2), (2, 3), (4, 1), (3, 3)])
def test_bytes_between_hosts_match_the_formulas(hosts, per_host):
    lay = HostLayout.even(hosts, per_host)
    seen = set()
    for (coll, algo), formula in FORMULA.items():
        if algo not in hier_algorithms(coll, lay):
            continue
        assert crossing(coll, algo, lay) == formula(hosts, per_host), (coll, algo)
        seen.add((coll, algo))
    # every hierarchical algorithm of these collectives has its formula here
    for coll in {c for c, _ in FORMULA}:
        assert {(coll, a) for a in hier_algorithms(coll, lay)} <= seen, coll


def test_the_rails_send_less_between_hosts_than_every_rank_on_the_wire():
    """hier_rail moves a P-th of what hier_rail_first does: the point of the hierarchy."""
    for h, p in [(2, 2), (2, 4), (4, 2)]:
        lay = HostLayout.even(h, p)
        assert crossing("all_reduce", "hier_rail_first", lay) == \
            p * crossing("all_reduce", "hier_rail", lay)
