"""tilecomm: collectives over a symmetric heap, and a model of how long they take.

Public names only; see the README for a tour.
"""

from .communicator import Communicator
from .errors import CommError, CommMismatch, CommTimeout, NoDeviceError, RankError
from .launch import RankGroup, init, launch
from .types import ReduceOp
from . import torch as _torch_backend  # noqa: E402,F401 - registers the "tilecomm" backend

__version__ = "0.1.0"

__all__ = [
    "CommError", "CommMismatch", "CommTimeout", "Communicator", "NoDeviceError", "RankError",
    "RankGroup", "ReduceOp", "init", "launch", "__version__",
]
