"""Backends: how bytes move for a given device type (``cpu`` now; ``cuda`` with the GPU work)."""

from .base import Backend, CollectiveCall

__all__ = ["Backend", "CollectiveCall"]
