"""GPU-resident communication: a device-side API over a symmetric heap.

* :mod:`tilecomm.device.lang` -- the Triton ``@jit`` primitives (peer_ptr, put, get,
  signal_set, signal_add, wait_ge, barrier). Importing it imports triton; set
  ``TRITON_INTERPRET=1`` before that to run kernels on the CPU.
* :class:`DeviceHeap` -- symmetric tensors, signal pads, the peer address table and the error
  buffer for kernels (CPU shared memory or CUDA IPC).
* :mod:`tilecomm.device.errors` -- the error buffer and :class:`DeviceTimeout`.
* :mod:`tilecomm.device.compile_check` -- compile kernels for sm_90 without a GPU.

See docs/device-api.md and the tutorials in examples/device/. Importing this package does not
import triton.
"""

from .errors import DeviceTimeout
from .heap import CudaDeviceHeap, DeviceHeap, ShmDeviceHeap, interpreted

__all__ = ["CudaDeviceHeap", "DeviceHeap", "DeviceTimeout", "ShmDeviceHeap", "interpreted"]
