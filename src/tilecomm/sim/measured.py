"""Measurements in: nccl-tests text logs and tilecomm ``bench --json`` rows.

Both become :class:`Measurement` rows (collective, algo, world size, bytes, time in us). The
nccl-tests table (all_reduce_perf and friends) has, per size::

    size  count  type  redop  root  | out-of-place: time algbw busbw #wrong | in-place: time ...

We keep the out-of-place time and busbw (``inplace=True`` selects the in-place columns). The world
size is the number of ``#  Rank  N ...`` device lines (0 when the log has none); it can undercount
(logs cut short), so consumers use the log's own busbw rather than recompute it. The node count
is the number of hosts those lines name (``... on HOST device ...``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Measurement:
    collective: str
    algo: str
    world_size: int
    nbytes: int
    time_us: float
    source: str = ""
    busbw_GBps: float | None = None   # as the log printed it (nccl-tests), else None
    nodes: int = 0                    # hosts the log's rank lines name (0: not known)


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+|-)\s+(-?\d+)\s+(.*)$")
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group(?:.*?\son\s+(\S+)\s+device)?")
_BIN = re.compile(r"(\w+)_perf")


_RUN_START = re.compile(r"^#\s*(nThread\b|Collective test starting)")


def parse_nccl_tests(text: str, collective: str | None = None, inplace: bool = False,
                     source: str = "nccl-tests") -> list[Measurement]:
    """Rows of an nccl-tests log. ``collective`` defaults to the binary named in the log. A
    file may hold several runs one after another (``# nThread`` or ``# Collective test
    starting`` opens each): every run's rows get its own collective, ranks and hosts."""
    out: list[Measurement] = []
    run: list[Measurement] = []
    ranks: set = set()
    hosts: set = set()
    coll = collective

    def close():
        # rank lines come before a run's table: its rows are of the whole run
        out.extend(replace(x, world_size=len(ranks), nodes=len(hosts)) for x in run)

    for line in text.splitlines():
        if _RUN_START.match(line) and run:
            close()
            run, ranks, hosts, coll = [], set(), set(), collective
        m = _RANK.match(line)
        if m:
            ranks.add(int(m.group(1)))
            if m.group(2):
                hosts.add(m.group(2))
            continue
        if coll is None:
            b = _BIN.search(line)
            if b and b.group(1) in ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                    "reduce", "alltoall", "sendrecv"):
                coll = {"alltoall": "all_to_all", "sendrecv": "send_recv"}.get(
                    b.group(1), b.group(1))
        if line.lstrip().startswith("#"):
            continue
        m = _ROW.match(line)
        if not m:
            continue
        rest = m.group(6).split()
        # out-of-place: time algbw busbw #wrong ; in-place: time algbw busbw #wrong
        col = 4 if inplace else 0
        if len(rest) < col + 3:
            continue
        try:
            t = float(rest[col])
        except ValueError:
            continue
        try:
            busbw = float(rest[col + 2])
        except ValueError:
            busbw = None
        run.append(Measurement(coll or "unknown", "nccl", len(ranks), int(m.group(1)), t, source,
                               busbw))
    close()
    return out


def parse_bench_json(data, source: str = "tilecomm-bench") -> list[Measurement]:
    """Rows of ``tilecomm bench --json`` (a list of dicts, or {"rows": [...]}).

    Contract: ``collective, algo, world_size, bytes, time_us`` (algbw/busbw are ignored).
    """
    rows = data.get("rows", data.get("results", [])) if isinstance(data, dict) else data
    return [Measurement(r["collective"], r.get("algo", "?"), int(r["world_size"]),
                        int(r["bytes"]), float(r["time_us"]), source) for r in rows]


def load_measurements(path: str, collective: str | None = None) -> list[Measurement]:
    """JSON (tilecomm bench) or text (nccl-tests), chosen by content."""
    text = Path(path).read_text()
    s = text.lstrip()
    if s.startswith("[") or s.startswith("{"):
        return parse_bench_json(json.loads(text), source=path)
    return parse_nccl_tests(text, collective, source=path)
