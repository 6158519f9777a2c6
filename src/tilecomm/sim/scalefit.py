"""Fit small, predict large: a system's own class parameters from its small runs.

A user measures one or two nodes with nccl-tests (any collective) and asks what 16 or 1,024
nodes will give. :func:`fit_own` starts from the class parameters fitted on every published
system (``nccl_fit.json``) and refits them on the user's rows only (``crossval.fit`` with a
start: every parameter the rows inform - per-call overhead, link efficiencies, the network
class's per-hop cost and efficiency, pipeline fill - becomes this system's; the rest keep the
class values). :func:`scale_checks` scores exactly that on published multi-scale sweeps: for each
system measured at several node counts, the class start is fitted on the *other* systems, the own
fit on the system's smallest multi-node count (and its one-node rows), and only rows of larger
node counts are scored. The errors give the band of a fitted prediction (``scale_bands``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecomm.topology import SystemSpec

from . import crossval, ncclsim, rcclsim
from .measured import Measurement
from .ncclsim import NcclParams
from .published import Row


def rows_of(measurements: list[Measurement], spec: SystemSpec, library: str = "nccl",
            gpus_per_node: int | None = None, system: str = "user") -> list[Row]:
    """Published-form rows of parsed nccl-tests logs run on ``spec``.

    A log's node count is the number of hosts its rank lines name; a log without rank lines
    needs ``gpus_per_node`` (ValueError otherwise)."""
    supported = rcclsim.SUPPORTED if library == "rccl" else ncclsim.SUPPORTED
    out = []
    for m in measurements:
        if m.world_size <= 0:
            raise ValueError(f"{m.source}: the log names no ranks ('#  Rank ...' lines): keep "
                             "nccl-tests' header in the log")
        nodes = m.nodes or (m.world_size // gpus_per_node if gpus_per_node else 0)
        if nodes <= 0 or m.world_size % nodes:
            raise ValueError(f"{m.source}: cannot tell the node count of {m.world_size} ranks: the "
                             "log names no hosts" + (
                                 f" and the ranks are not a multiple of the system's "
                                 f"{gpus_per_node} GPUs per node" if gpus_per_node else ""))
        if m.collective not in supported or m.time_us <= 0:
            continue
        out.append(Row(system, m.source, m.collective, m.world_size, nodes, m.nbytes, m.time_us,
                       None, m.source, spec, library, spec.fabric.transport))
    if not out:
        raise ValueError(f"no rows the {library} model times in the logs ("
                         + ", ".join(supported) + ")")
    return out


def fit_own(rows: list[Row], start: NcclParams | None = None) -> NcclParams:
    """The system's own parameters: ``crossval.fit`` on its ``rows`` from the class fit."""
    if start is None:
        start, _ = crossval.load_fit()
    return crossval.fit(rows, start=start, own=True)


@dataclass
class ScaleCheck:
    check: crossval.Check       # the prediction from the system's own small-run fit
    class_error: float          # the same row predicted from the class fit alone (LOSO)
    fit_nodes: int              # the largest node count the own fit saw


def scale_checks(rows: list[Row], fit_fn=crossval.fit) -> list[ScaleCheck]:
    """Fit on each multi-scale system's smallest multi-node count, score its larger counts."""
    out = []
    for s in sorted({r.system for r in rows}):
        mine = [r for r in rows if r.system == s]
        counts = sorted({r.nodes for r in mine if r.nodes > 1})
        if len(counts) < 2:
            continue
        small = counts[0]
        own_rows = [r for r in mine if r.nodes <= small]
        target = [r for r in mine if r.nodes > small]
        base = fit_fn([r for r in rows if r.unit != mine[0].unit])
        own = fit_own(own_rows, base)
        for c, b in zip(crossval.evaluate(target, own), crossval.evaluate(target, base)):
            out.append(ScaleCheck(c, b.error, small))
    return out
