"""tilecomm: collectives over a symmetric heap, and a model of how long they take.

Public names only; see the README for a tour.
"""

from .communicator import Communicator
from .elastic import join
from .errors import (CommAborted, CommError, CommMismatch, CommRevoked, CommTimeout,
                     NoDeviceError, RankError)
from .launch import RankGroup, init, launch
from .types import ReduceOp
from . import torch as _torch_backend  # noqa: E402,F401 - registers the "tilecomm" backend

__version__ = "0.1.0"

__all__ = [
    "CommAborted", "CommError", "CommMismatch", "CommRevoked", "CommTimeout", "Communicator",
    "NoDeviceError", "RankError", "RankGroup", "ReduceOp", "init", "join", "launch",
    "__version__",
]
