"""Which algorithms the simulator offers, under the names the runtime accepts.

``tilecomm sim --library tilecomm`` answers "which ``algo=`` should I pass": a row must name
something ``comm.<collective>(t, algo=...)`` runs on ranks placed like the simulated system.

* One node: the registry's algorithms (``algorithms/registry.py``), which the CPU executor and
  the GPU kernels run.
* Several nodes: ranks that span hosts run the hierarchical algorithms
  (``hier_algorithms(collective, layout)``, ``hier/plans.py``) and nothing else; the layout is
  the system's block placement (``HostLayout.even(nodes, gpus)``).

Everything else the model can time is a *what-if*, shown only when asked for
(``--what-if`` / ``what_if=True``) and labelled so: NCCL-style algorithms the runtime lacks
(``dbtree``, ``nvls``, ``bruck``, the ring-based ``hierarchical``) and, across nodes, the
registry's flat schedules over all ranks (the runtime never runs them across hosts).
``send_recv`` is point-to-point, not an algorithm choice: its one row (``pairwise``, the
nccl-tests pattern) is always shown.
"""

from __future__ import annotations

from functools import lru_cache

from tilecomm.algorithms import algorithms
from tilecomm.hier.layout import HostLayout
from tilecomm.hier.plans import hier_algorithms
from tilecomm.topology import Topology

#: the one pattern the model times point-to-point traffic with (builders.send_recv)
SEND_RECV = "pairwise"


def host_layout(topo: Topology) -> HostLayout:
    """The runtime's view of ``topo``'s ranks: block placement, ``topo.gpus`` per node."""
    return _even(topo.nodes, topo.gpus)


@lru_cache(maxsize=256)
def _even(nodes: int, gpus: int) -> HostLayout:
    # one object per shape: the plan and estimate caches keyed by layout then hit by identity
    return HostLayout.even(nodes, gpus)


def runtime_algorithms(collective: str, topo: Topology) -> list[str]:
    """The ``algo=`` names the runtime accepts for ``collective`` on ranks placed as ``topo``."""
    if collective == "send_recv":
        return [SEND_RECV]
    if topo.nodes == 1:
        return list(algorithms(collective))
    return hier_algorithms(collective, host_layout(topo))


def what_if_algorithms(collective: str, topo: Topology) -> list[str]:
    """Algorithms the model times on ``topo`` that the runtime does not run there."""
    w = topo.world_size
    if topo.spec.shm is not None and topo.nodes == 1:
        return []   # one shared-memory host: only the runtime's algorithms (its cost model)
    out = []
    if topo.nodes > 1 and collective != "send_recv":
        out += algorithms(collective)          # one flat schedule over every node's ranks
    if collective == "all_reduce":
        if topo.nodes > 1 and topo.gpus > 1:
            out.append("hierarchical")
        if topo.spec.intra != "shm":
            out.append("dbtree")
        if topo.spec.nvls and topo.nodes == 1:
            out.append("nvls")
    if collective == "all_to_all" and w > 1:
        out.append("bruck")
    return out


def is_what_if(collective: str, algo: str, topo: Topology) -> bool:
    """Whether a row of ``algo`` on ``topo`` is a what-if (the runtime would refuse the name)."""
    return algo not in runtime_algorithms(collective, topo)
