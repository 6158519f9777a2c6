"""CudaHeap's IPC exchange with the CUDA calls faked (no GPU here): every peer handle is opened
with this rank's device current, no other device is ever made current (one CUDA context per
rank), and missing peer access or an invisible peer GPU is a clear CommError."""

from __future__ import annotations

import types

import pytest
import torch

import tilecomm
from tilecomm.heap import cuda as cuda_heap


class FakeRuntime:
    """The CUDA runtime as CudaHeap uses it; records the current device at every call."""

    def __init__(self, log):
        self.log = log
        self.current = 0
        self.next_ptr = 1 << 40

    def set_device(self, i):
        self.log.append(("set_device", i))
        self.current = i

    def get_device(self):
        return self.current

    def malloc(self, n):
        self.log.append(("malloc", self.current, n))
        self.next_ptr += 1 << 30
        return self.next_ptr

    def free(self, p):
        self.log.append(("free", p))

    def ipc_get_handle(self, p):
        return p.to_bytes(8, "little") * 8

    def ipc_open(self, h):
        self.log.append(("ipc_open", self.current, h))
        return int.from_bytes(h[:8], "little") + 7     # "mapped" elsewhere in this process

    def ipc_close(self, p):
        self.log.append(("ipc_close", p))


@pytest.fixture
def fake(monkeypatch):
    """A process that sees ``gpus`` GPUs (uuids gpu-0..), with peer access given by ``p2p``."""
    state = types.SimpleNamespace(log=[], gpus=2, p2p=True, peer_queries=[])
    rt = FakeRuntime(state.log)
    state.rt = rt

    def set_device(d):
        i = d.index if isinstance(d, torch.device) else int(d)
        state.log.append(("torch.set_device", i))
        rt.current = i

    def can_access(a, b):
        state.peer_queries.append((a, b))
        return state.p2p

    monkeypatch.setattr(cuda_heap, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(cuda_heap, "cudart", lambda: rt)
    monkeypatch.setattr(cuda_heap, "tensor_at", lambda p, n, dev: torch.zeros(n, dtype=torch.uint8))
    monkeypatch.setattr(cuda_heap, "device_uuid", lambda i: f"gpu-{i}")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state.gpus)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: rt.current)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", can_access)
    return state


def _exchange(peers):
    """An all-gather where the other ranks' objects are ``peers[r]`` (``None``: this rank's)."""
    def exchange(mine):
        return [mine if p is None else p for p in peers]
    return exchange


def _peer(nbytes, ptr, gpu):
    return (nbytes, ptr.to_bytes(8, "little") * 8, f"gpu-{gpu}", 999)


def test_peer_handles_open_with_the_local_device_current_and_no_other(fake):
    # rank 1 of 3 on cuda:1; rank 0 on gpu 0, rank 2 on gpu 1 (shares rank 1's GPU)
    h = cuda_heap.CudaHeap(1, 3, 4096, _exchange([_peer(4096, 1000, 0), None,
                                                  _peer(4096, 3000, 1)]),
                           device="cuda:1")
    opens = [e for e in fake.log if e[0] == "ipc_open"]
    assert [e[1] for e in opens] == [1, 1], fake.log          # current device: the local one
    made_current = {e[1] for e in fake.log if e[0] in ("set_device", "torch.set_device")}
    assert made_current == {1}, fake.log                         # one context: cuda:1 only
    assert [e[1] for e in fake.log if e[0] == "malloc"] == [1]
    assert h.address(0) == 1007 and h.address(2) == 3007 and h.address(1) == h._ptr
    assert fake.peer_queries == [(1, 0)]                         # only the other GPU is checked
    assert (h.peer_device(0), h.peer_device(2)) == (0, 1)
    assert h.buffer(1).numel() == 4096
    with pytest.raises(ValueError, match="address"):
        h.buffer(0)
    h.close()
    assert sorted(e[1] for e in fake.log if e[0] == "ipc_close") == [1007, 3007]
    assert [e for e in fake.log if e[0] == "free"]


def test_without_peer_access_the_error_says_so(fake):
    fake.p2p = False
    with pytest.raises(tilecomm.CommError, match=r"no peer access to cuda:1.*NVLink or PCIe P2P"):
        cuda_heap.CudaHeap(0, 2, 4096, _exchange([None, _peer(4096, 5000, 1)]), device="cuda:0")
    assert not [e for e in fake.log if e[0] == "ipc_open"]
    assert [e for e in fake.log if e[0] == "free"]               # the local buffer is released


def test_a_peer_gpu_hidden_by_cuda_visible_devices_is_named(fake, monkeypatch):
    fake.gpus = 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(tilecomm.CommError, match=r"rank 1's GPU \(gpu-3\) is not visible"):
        cuda_heap.CudaHeap(0, 2, 4096, _exchange([None, _peer(4096, 5000, 3)]), device="cuda:0")


def test_ranks_sharing_one_gpu_need_no_peer_access(fake):
    fake.p2p = False
    h = cuda_heap.CudaHeap(0, 2, 4096, _exchange([None, _peer(4096, 5000, 0)]), device="cuda:0")
    assert h.address(1) == 5007 and fake.peer_queries == []
    h.close()


def test_different_sizes_are_refused_and_mappings_released(fake):
    with pytest.raises(tilecomm.CommError, match="different sizes"):
        cuda_heap.CudaHeap(0, 2, 4096, _exchange([None, _peer(8192, 5000, 1)]), device="cuda:0")
    assert [e for e in fake.log if e[0] == "free"]


def test_importable_and_clear_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this test is for machines without CUDA")
    assert cuda_heap.cuda_unavailable_reason()
    with pytest.raises(tilecomm.NoDeviceError, match="CudaHeap: no CUDA GPU is available"):
        cuda_heap.CudaHeap(0, 1, 4096, lambda o: [o])
