"""Seeing inside a job: the flight recorder (``flight.py``), the analysis of its dumps
(``analyze.py``) and Chrome traces (``trace.py``); ``tilecomm trace ...`` on the command line.
Nothing here is on a collective's path except the recorder's few field writes per call."""

from __future__ import annotations


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
