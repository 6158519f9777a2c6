"""The launcher side of every bench: one run loop and one record format for every case.

``tilecomm bench`` times collectives, MoE dispatch/combine, KV-cache transfer and the fused
ops the same way. A *bench* (``runner.BenchConfig``, ``moe.MoEBenchConfig``,
``kv.KVBenchConfig``, ``ops.OpsBenchConfig``) supplies its cases, a rank-side function that
times one case's methods with :func:`.timing.measure`, and the fields of its row; :func:`run`
starts the ranks once, prepares them (Gloo for the baselines, the memory rates of the bound),
runs every case on every rank, and reduces what the ranks measured the same way:

* a round's time is the **slowest rank's** (the collective is done when its last rank is);
  a method with phases separated by barriers (dispatch, then combine) takes the sum over its
  phases of each phase's slowest rank;
* a row's time is the **median round**; its **spread** is the slowest round over the fastest
  (max/min, 1.0 = the rounds agree). A row whose tilecomm method or any baseline has a spread
  above ``max_spread`` (default :data:`MAX_SPREAD`) is ``noisy``: the table marks it and the
  JSON says which methods were (``noisy``, ``noisy_methods``);
* every ratio reads the same way: ``x_<baseline>`` = the baseline's time / tilecomm's time,
  so above 1 tilecomm is faster (:func:`ratio`). Floors (memcpy, the matmul alone) read
  the same: at most 1, and 1 would be as fast as the floor.

The row (one JSON object per case): ``case`` (the case id), ``bench`` (its kind), ``time_us``,
``spread``, ``rounds_us`` (the slowest rank's time of each round), ``<phase>_us`` for a
method with phases, per baseline ``<b>_time_us``, ``<b>_spread`` and ``x_<b>``, ``noisy``,
``noisy_methods``, ``max_spread``, then the bench's own fields (sizes, bandwidths, the bound).
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
from dataclasses import dataclass, field
from typing import Callable

#: rounds that disagree by more than this (slowest round / fastest round) mark a row noisy.
#: On an idle machine rounds agree to a few percent; 1.5 is well past that, and a repeat
#: minutes apart that gave 2.6 and 59.5 us (8 B), or 21 and 146 us (128 KB), is far beyond it.
MAX_SPREAD = 1.5

#: the name of tilecomm's own method in every bench (the others are its baselines)
PRIMARY = "tilecomm"


def slowest_rounds(per_rank: list[list[float]]) -> list[float]:
    """Per round, the slowest rank's seconds (ranks that timed nothing are left out)."""
    timed = [r for r in per_rank if r]
    if not timed:
        return []
    return [max(r[i] for r in timed) for i in range(min(len(r) for r in timed))]


def slowest_median(per_rank: list[list[float]]) -> float:
    """The median over rounds of the slowest rank's seconds."""
    return statistics.median(slowest_rounds(per_rank))


def spread(rounds: list[float]) -> float | None:
    """The slowest round over the fastest; None with fewer than two rounds (unknown)."""
    if len(rounds) < 2 or min(rounds) <= 0:
        return None
    return max(rounds) / min(rounds)


def ratio(baseline_s: float | None, tilecomm_s: float | None) -> float | None:
    """``x <baseline>``: the baseline's time over tilecomm's (above 1: tilecomm is faster)."""
    if not baseline_s or not tilecomm_s:
        return None
    return baseline_s / tilecomm_s


@dataclass
class Stats:
    """One method of one case, reduced over ranks: its round times and phase medians."""

    rounds_s: list[float]
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def median_s(self) -> float:
        return statistics.median(self.rounds_s)

    @property
    def spread(self) -> float | None:
        return spread(self.rounds_s)


def method_stats(per_rank: list[dict[str, list[float]]]) -> Stats | None:
    """Reduce one method's ``{phase: [seconds per round]}`` of every rank: per phase the
    slowest rank of each round; a round's time is the sum over phases (barriers separate
    them). None when no rank timed it."""
    phases: list[str] = []          # in the order the method timed them
    for r in per_rank:
        phases += [p for p, v in r.items() if v and p not in phases]
    if not phases:
        return None
    slow = {p: slowest_rounds([r.get(p, []) for r in per_rank]) for p in phases}
    n = min(len(v) for v in slow.values())
    if n == 0:
        return None
    rounds = [sum(slow[p][i] for p in phases) for i in range(n)]
    return Stats(rounds, {p: statistics.median(v[:n]) for p, v in slow.items()})


def timing_fields(primary: Stats, baselines: dict[str, Stats | None],
                  max_spread: float = MAX_SPREAD) -> dict:
    """The part of a row every bench shares (the module doc's format)."""
    row = {"time_us": primary.median_s * 1e6, "spread": primary.spread,
           "rounds_us": [t * 1e6 for t in primary.rounds_s]}
    if len(primary.phases_s) > 1:
        row.update({f"{p}_us": t * 1e6 for p, t in primary.phases_s.items()})
    noisy = [PRIMARY] if (primary.spread or 1.0) > max_spread else []
    for name, st in baselines.items():
        if st is None:
            continue
        row.update({f"{name}_time_us": st.median_s * 1e6, f"{name}_spread": st.spread,
                    f"x_{name}": ratio(st.median_s, primary.median_s)})
        if len(st.phases_s) > 1:
            row.update({f"{name}_{p}_us": t * 1e6 for p, t in st.phases_s.items()})
        if (st.spread or 1.0) > max_spread:
            noisy.append(name)
    row.update(noisy=bool(noisy), noisy_methods=noisy, max_spread=max_spread)
    return row


def case_row(bench: str, case_id: str, per_rank: list[dict], baselines: list[str],
             max_spread: float = MAX_SPREAD) -> dict:
    """A row's shared part from every rank's ``measure`` result (``per_rank[r]["times"]``):
    the tilecomm method and each baseline in ``baselines`` that some rank timed."""
    times = [r["times"] for r in per_rank]
    primary = method_stats([t.get(PRIMARY, {}) for t in times])
    if primary is None:
        raise RuntimeError(f"{case_id}: no rank timed tilecomm")
    base = {b: method_stats([t.get(b, {}) for t in times]) for b in baselines}
    return {"case": case_id, "bench": bench, **timing_fields(primary, base, max_spread)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_init_gloo(comm, port: int) -> bool:
    """On every rank: the Gloo process group the baselines run on (once per run)."""
    import warnings

    import torch.distributed as dist
    # The baselines call all_gather_into_tensor, which torch marks deprecated; once per rank
    # per size that warning would drown the table.
    warnings.filterwarnings("ignore", category=FutureWarning)
    if not dist.is_initialized():
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE"):  # a torchrun worker (--hosts):
            dist.init_process_group("gloo")                  # meet at torchrun's store
        else:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=comm.rank, world_size=comm.world_size)
    return True


class Bench:
    """What :func:`run` needs from a kind of bench (mixed into its config dataclass).

    The config provides ``world_size``, ``hosts``, ``timeout``, ``heap_bytes``; and
    ``kind``, :meth:`cases` (objects with an ``id``), ``rank_case`` (a module-level function
    ``(comm, config, case) -> dict`` with ``"times"`` from :func:`.timing.measure`, so that
    the ranks can import it) and :meth:`row`. :meth:`group` and :meth:`prepare` have
    defaults: local ranks or simulated hosts, Gloo initialized when ``uses_gloo``.
    """

    kind = "?"
    uses_gloo = True
    rank_case: Callable

    def validate(self) -> None:
        """Raise ValueError on arguments that cannot run (before any rank starts)."""

    def cases(self) -> list:
        raise NotImplementedError

    def group(self):
        """The ranks: local processes, or simulated hosts with ``hosts``."""
        from ..launch import RankGroup
        if self.hosts:
            from .hosts_group import HostsGroup
            return HostsGroup(self.hosts, timeout=self.timeout, heap_bytes=self.heap_bytes)
        return RankGroup(self.world_size, timeout=self.timeout, heap_bytes=self.heap_bytes)

    def prepare(self, group) -> dict:
        """Once per run before the cases; returns what :meth:`row` needs (the rates)."""
        if self.uses_gloo:
            group.run(rank_init_gloo, free_port())
        return {}

    def finish(self, group, ctx: dict) -> dict:
        """Once per run after the cases, before any row is made: the final ``ctx`` (the
        bound's rates measured again, so that a noisy start cannot loosen it)."""
        return ctx

    def row(self, case, per_rank: list[dict], ctx: dict) -> dict:
        raise NotImplementedError


def run(bench: Bench, progress: Callable | None = None) -> list[dict]:
    """Start the ranks, prepare them, and run every case of ``bench`` on every rank; one row
    per case. ``progress(done, total, label)`` after each case."""
    bench.validate()
    cases = bench.cases()
    with contextlib.ExitStack() as stack:
        group = stack.enter_context(bench.group())
        ctx = bench.prepare(group)
        results = []
        for done, case in enumerate(cases):
            if progress:
                progress(done, len(cases), case.id)
            results.append((case, group.run(bench.rank_case, bench, case)))
        ctx = bench.finish(group, ctx)
        rows = [bench.row(case, per_rank, ctx) for case, per_rank in results]
        if progress:
            progress(len(cases), len(cases), "done")
    return rows
