"""Flows of the runtime's hierarchical algorithms, from their own plans.

Across nodes the simulator times what ``comm.<collective>(algo="hier_...")`` runs: the
:class:`~tilecomm.hier.plans.HierPlan` s lowered by :func:`~tilecomm.hier.plans.flatten` into one
flat schedule (the one the checker proves), whose rank plans become flows as a registered
schedule's do. Local steps embed the registry's schedule that ``flatten`` picks for the host's
sub-collective (``default_local_algo``); rail and exchange steps become direct moves between
the nodes.

Every chunk of every buffer of a hierarchical plan holds the same number of elements (the
backend cuts them so: ``sim/hosts.py`` :func:`unit_elems`), so one fraction of the message
sizes them all.
"""

from __future__ import annotations

from functools import lru_cache

from tilecomm.algorithms.registry import get_schedule
from tilecomm.hier.layout import HostLayout
from tilecomm.hier.plans import Copy, Exchange, Local, Rail, default_local_algo, flatten, hier_plan

from .flowsched import FlowSchedule, from_plans, model_plans
from .hosts import caller_count, unit_elems

#: a large message for exact-enough fractions (nccl-tests bytes of 1-byte elements)
_BIG = 1 << 40


def chunk_frac(collective: str, algo: str, layout: HostLayout) -> float:
    """Bytes of one chunk of the plans over ``nbytes`` (nccl-tests sizes)."""
    plan = hier_plan(collective, algo, layout, 0, 0)
    count = caller_count(collective, _BIG, layout.world_size, itemsize=1)
    return unit_elems(plan, count) / _BIG


@lru_cache(maxsize=1024)
def moves_estimate(collective: str, algo: str, layout: HostLayout) -> int:
    """About how many moves ``flatten`` would materialize, without building them (the
    simulator skips what is too large to flatten): host 0's ranks' share times the number of
    hosts, exact up to the local steps' rounding on the even layouts the simulator uses."""
    host = layout.hosts[0]
    u = len(host)
    total = 0
    for rank in host:
        for st in hier_plan(collective, algo, layout, 0, rank).steps:
            total += _step_moves(st, u)
    return total * layout.num_hosts


def _step_moves(st, u: int) -> int:
    """Moves one rank's step adds to the flat schedule (its share of a local step)."""
    if isinstance(st, Copy):
        return sum(d.n for d, _ in st.pairs)
    if isinstance(st, Local):
        if st.collective == "barrier":
            return 0
        sub = get_schedule(st.collective, default_local_algo(st.collective, u), u, st.root)
        per_chunk = sub.buffer("buf" if st.dst is None else "in").nchunks
        moves = sum(len(ph) for ph in sub.phases)
        return max(1, st.src.n // per_chunk) * moves // u + 1
    if isinstance(st, Rail):
        reducing = st.kind in ("all_reduce", "reduce_scatter", "reduce")
        return sum(p.dst.n * (len(p.members) if reducing else 1)
                   for p in st.parts if p.dst is not None)
    if isinstance(st, Exchange):
        return sum(r.n for _, r in st.recvs)
    return 0


@lru_cache(maxsize=32)
def hier_flows(collective: str, algo: str, layout: HostLayout) -> FlowSchedule:
    """Flows of the hierarchical ``collective/algo`` on ``layout`` (root 0). Cached: flattening
    and lowering cost seconds at hundreds of ranks and a sweep times every size from the same
    flows (the engines only read them)."""
    plans = model_plans(flatten(collective, algo, layout))
    fs = from_plans(plans, chunk_frac=chunk_frac(collective, algo, layout))
    fs.notes = f"hier plan on {layout.describe()}, flattened (hier/plans.py)"
    return fs
