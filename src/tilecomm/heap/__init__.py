"""Symmetric heaps: every rank maps every rank's buffer at the same offsets."""

from .base import SegmentLayout, SymmetricHeap
from .shm import ShmHeap

__all__ = ["SegmentLayout", "ShmHeap", "SymmetricHeap"]
