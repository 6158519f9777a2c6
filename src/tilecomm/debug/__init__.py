"""Seeing inside a job: the flight recorder (``flight.py``), the analysis of its dumps
(``analyze.py``) and Chrome traces (``trace.py``); ``tilecomm trace ...`` on the command line.
Nothing here is on a collective's path except the recorder's few field writes per call."""

from __future__ import annotations


def load_rank_files(directory: str, stem: str, valid, hint: str) -> dict[int, dict]:
    """``DIR/{stem}{R}.json`` of every rank R (rank -> document); ``valid(doc)`` returns None
    or why the file is not one of ours; ``hint`` says how to make them when there are none."""
    import glob
    import json
    import os
    import re

    out = {}
    for path in glob.glob(os.path.join(directory, f"{stem}*.json")):
        m = re.search(rf"{re.escape(stem)}(\d+)\.json$", path)
        if not m:
            continue
        with open(path) as f:
            doc = json.load(f)
        why = valid(doc)
        if why:
            raise ValueError(f"{path}: {why}")
        out[int(m.group(1))] = doc
    if not out:
        raise FileNotFoundError(f"no {stem}*.json files in {directory!r}; {hint}")
    return out


def attach(comm, backend):
    """The flight recorder of a new communicator (and the process's tracer under
    TILECOMM_TRACE), handed to its host backend for its waits and phases."""
    from ..settings import settings
    from .flight import FlightRecorder

    s = settings()
    tracer = None
    if s.trace:
        from .trace import process_tracer
        tracer = process_tracer(s.trace, comm.rank, comm.world_size)
    rec = FlightRecorder(comm.rank, comm.world_size, s.flight_records, debug_dir=s.debug_dir,
                         tracer=tracer)
    backend.attach_debug(rec, tracer)
    return rec
