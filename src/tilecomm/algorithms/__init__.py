"""Collective algorithms, each defined once as a :class:`~tilecomm.algorithms.schedule.Schedule`."""

from .checker import ScheduleError, check_schedule
from .collectives import BUSBW_FACTOR, COLLECTIVES, chunk_lengths, even_chunks
from .registry import algorithms, all_algorithms, get_schedule, register
from .schedule import BufferSpec, Loc, Move, Schedule

__all__ = [
    "BUSBW_FACTOR", "COLLECTIVES", "BufferSpec", "Loc", "Move", "Schedule", "ScheduleError",
    "algorithms", "all_algorithms", "check_schedule", "chunk_lengths", "even_chunks",
    "get_schedule", "register",
]
