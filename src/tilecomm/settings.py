"""Every setting tilecomm reads from the environment, with its default and meaning.

Read once per process through :func:`settings`; pass explicit arguments to override per call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import lru_cache


@dataclass(frozen=True)
class Settings:
    #: TILECOMM_TIMEOUT: seconds a rank waits for peers before raising CommTimeout.
    timeout: float = 60.0
    #: TILECOMM_HEAP_BYTES: bytes of symmetric heap per rank for comm.alloc (reserved, backed
    #: lazily by the kernel as pages are touched).
    heap_bytes: int = 256 << 20
    #: TILECOMM_SCRATCH_BYTES: bytes per rank used to stage tensors that are not in the heap
    #: (two halves, alternating between calls); it bounds TILECOMM_PIECE_BYTES.
    scratch_bytes: int = 32 << 20
    #: TILECOMM_PIECE_BYTES: scratch bytes one piece of a large collective uses (all chunks
    #: together). Pieces that fit in cache let the reads of a piece hit what its staging wrote.
    #: Four times larger when ranks outnumber cores (each piece costs synchronizations, and
    #: those wait for context switches there).
    piece_bytes: int = 1 << 20
    #: TILECOMM_SPIN: polls of a flag before a waiting rank starts yielding its core.
    spin: int = 2000
    #: TILECOMM_WAIT_SLEEP_AFTER: seconds a wait polls (spinning, then yielding) before it
    #: sleeps between polls (10 us, doubling to 100 us), so long waits leave the cores to
    #: ranks with work (simulated hosts, ranks blocked in Gloo on another host).
    wait_sleep_after: float = 2e-3
    #: TILECOMM_SHM_DIR: directory of the POSIX shared-memory files.
    shm_dir: str = "/dev/shm"
    #: TILECOMM_START_METHOD: multiprocessing start method of tilecomm.launch (fork, spawn,
    #: forkserver). fork starts in milliseconds and accepts closures.
    start_method: str = "fork"
    #: TILECOMM_TUNE: 1 (default) lets algo="auto" use what `tilecomm tune` measured on this
    #: machine (TILECOMM_TUNE_DIR); 0 uses the shipped costs only.
    tune: bool = True
    #: TILECOMM_TUNE_DIR: directory of `tilecomm tune`'s files (one per machine fingerprint).
    tune_dir: str = "~/.cache/tilecomm"
    #: TILECOMM_GPU_SYSTEM: the simulator preset (or .json system file) algo="auto" predicts
    #: GPU collectives on (one node of the communicator's world size).
    gpu_system: str = "dgx-h100"
    #: TILECOMM_BIND: 1 to pin each rank started by tilecomm.launch to its own core when there
    #: are enough cores (as MPI launchers do); 0 (default: no gain measured on 2 cores) to
    #: leave placement to the OS.
    bind: bool = False
    #: TILECOMM_DEVICE_TIMEOUT: seconds a device-side wait (tilecomm.device.lang.wait_ge,
    #: barrier) polls a signal slot before it records a timeout in the error buffer and gives
    #: up; the host then raises CommTimeout. Measured with the GPU global timer (the
    #: interpreter: the CPU clock), so a dead peer costs about this long, never a hang.
    device_timeout: float = 10.0
    #: TILECOMM_DEVICE_COMPAT: 1 makes tilecomm.device.lang use its compatibility path even
    #: where Triton has tl.atomic_load and tl.atomic_poll (3.9+): acquire loads as atomic adds
    #: of 0, bounded polls as spins on the GPU global timer (the interpreter: the CPU clock).
    #: 0 (default): the native primitives where Triton has them; an older Triton (3.6 checked)
    #: always takes the compatibility path. Read once, when lang is first imported.
    device_compat: bool = False
    #: TILECOMM_DEVICE_HEAP_BYTES: bytes of CUDA symmetric heap per rank for the GPU collective
    #: kernels (staging, scratch, signal pads) and comm.alloc(..., device="cuda").
    device_heap_bytes: int = 256 << 20
    #: TILECOMM_CPU_KERNELS: what runs collectives on CPU tensors: "executor" (the numpy
    #: schedule executor) or "triton" (the GPU kernels in the Triton interpreter on the
    #: shared-memory heap, one process per rank: slow, for testing the GPU path without a GPU).
    cpu_kernels: str = "executor"
    #: TILECOMM_NATIVE: 1 (default) runs the CPU executor's plans through its compiled runner
    #: (backends/cpu/_native.c, built at install time) when it was built; 0 runs them in
    #: Python (numpy/torch calls between flag waits). Both give the same bits and errors.
    native: bool = True
    #: TILECOMM_CMA: 1 (default) lets peers read a collective's ordinary CPU tensors in place
    #: with process_vm_readv (Linux cross-memory attach, as Open MPI's vader does) instead of
    #: staging them through shared memory, where every rank could read every peer at start
    #: (it needs ptrace rights: tilecomm allows same-user peers with PR_SET_PTRACER). Only
    #: buffers peers copy (broadcast, all_gather, all_to_all); reduction operands stay staged.
    #: 0 always stages; a rank with 0 turns it off for all. Not used with more ranks than CPUs.
    cma: bool = True
    #: TILECOMM_CMA_MIN_BYTES: smallest collective (bytes of its tensors together) that reads
    #: in place; below it the system call costs more than a staging copy in cache (2 ranks:
    #: 1.1-1.4x faster at 16 KiB, slower at 4 KiB; docs/benchmarks.md).
    cma_min_bytes: int = 16 << 10
    #: TILECOMM_DETERMINISTIC: 1 makes every all_reduce, reduce_scatter and reduce return the
    #: bits of the rank-order reference (float32 accumulation in rank order 0..W-1, 16-bit
    #: inputs rounded once at the end) whatever the size; algo="auto" picks only algorithms
    #: that guarantee it and any other algorithm is refused. Also Communicator(deterministic=).
    deterministic: bool = False
    #: TILECOMM_GPU_FUSED: 1 (default) runs the hand-fused GPU kernel of an algorithm where one
    #: exists; 0 runs every algorithm through the generic plan kernel (which executes any
    #: lowered schedule; the fused kernels must give its bits).
    gpu_fused: bool = True
    #: TILECOMM_DEVICE_DEBUG: 1 makes every GPU collective synchronous: a host handshake
    #: before its kernels compares the call (collective, algorithm, dtype, count, op, root,
    #: input placement; CommMismatch on every rank) and the device error word is read right
    #: after them (a stream synchronization). 0 (default): calls only launch kernels (no host
    #: synchronization); mismatches and device timeouts are found at the next check point
    #: (see TILECOMM_DEVICE_CHECK_EVERY).
    device_debug: bool = False
    #: TILECOMM_DEVICE_CHECK_EVERY: in the asynchronous GPU mode, every this many calls the
    #: ranks compare a digest of the calls since the last check point (one host handshake)
    #: and the device error word is polled without blocking; comm.synchronize() and close
    #: wait for the device and read it.
    device_check_every: int = 64
    #: TILECOMM_GPU_CTAS: the most CTAs one kernel launch of a rank may use on a GPU (every
    #: rank must set the same value). 0 (default): derived from the ranks' devices so that
    #: the grids of all ranks sharing a GPU fit on it at once (a kernel that waits for a peer
    #: progresses only if the peer's kernel is resident): the SMs a rank may use (its MPS
    #: share where CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is set) divided among the ranks on its
    #: device; see tilecomm.device.budget.
    gpu_ctas: int = 0
    #: TILECOMM_GPU_COOPERATIVE: 1 (default) launches the collective kernels cooperatively
    #: on CUDA, so a grid that cannot be resident at once fails at launch instead of hanging
    #: (NOTE [co-residency]); 0 launches them plainly (for a driver or MPS setup that refuses
    #: cooperative launches: the GPU check sets it when its probe's cooperative launch fails).
    gpu_cooperative: bool = True
    #: TILECOMM_MPS: whether tilecomm bench --device cuda and scripts/gpu_check.py run ranks
    #: that share a GPU under an MPS control daemon (tilecomm.mps; started if none runs,
    #: quit afterwards): "auto" (default: when ranks share a GPU), "on" (always try), "off".
    mps: str = "auto"
    #: TILECOMM_MPS_CONTROL: the MPS control program tilecomm.mps runs.
    mps_control: str = "nvidia-cuda-mps-control"
    #: TILECOMM_GLOO_HOST: the address the inter-host Gloo groups bind to when ranks span
    #: hosts. Empty (default): 127.0.0.1 when MASTER_ADDR is a loopback address (simulated
    #: hosts on one machine: no traffic leaves it), else Gloo's default (this host's name).
    gloo_host: str = ""
    #: TILECOMM_FLIGHT_RECORDS: calls each communicator keeps in its flight recorder (a ring;
    #: tilecomm.debug.flight): sequence number, op, algorithm, bytes, dtype, state, what it
    #: waits for, timestamps. 0 turns recording off.
    flight_records: int = 2000
    #: TILECOMM_DEBUG_DIR: directory where every live rank writes flight-rank{R}.json when a
    #: call raises CommError, on SIGUSR1, on comm.dump_flight() and when tilecomm.launch stops
    #: it; read them with `tilecomm trace analyze DIR`. Empty (default): no dumps.
    debug_dir: str = ""
    #: TILECOMM_TRACE: directory where every rank writes trace-rank{R}.json, a Chrome trace of
    #: its calls, phases and waits (and NVTX ranges around GPU collectives); merge them with
    #: `tilecomm trace merge DIR -o FILE`. Empty (default): no trace.
    trace: str = ""


def _parse(kind, text: str):
    if kind is bool:
        return text.strip().lower() in ("1", "true", "yes", "on")
    if kind is int:
        from .units import parse_size
        return parse_size(text)
    return kind(text)


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The settings of this process: defaults overridden by ``TILECOMM_*`` variables."""
    values = {}
    for f in fields(Settings):
        env = os.environ.get("TILECOMM_" + f.name.upper())
        if env is not None:
            kind = type(f.default)
            try:
                values[f.name] = _parse(kind, env)
            except ValueError as e:
                raise ValueError(f"TILECOMM_{f.name.upper()}={env!r}: {e}") from None
    out = Settings(**values)
    if out.start_method not in ("fork", "spawn", "forkserver"):
        raise ValueError(f"TILECOMM_START_METHOD={out.start_method!r}: use fork, spawn or "
                         f"forkserver")
    if out.cpu_kernels not in ("executor", "triton"):
        raise ValueError(f"TILECOMM_CPU_KERNELS={out.cpu_kernels!r}: use executor or triton")
    if out.timeout <= 0:
        raise ValueError(f"TILECOMM_TIMEOUT={out.timeout!r}: must be > 0 seconds")
    if out.flight_records < 0:
        raise ValueError(f"TILECOMM_FLIGHT_RECORDS={out.flight_records!r}: must be >= 0")
    if out.mps not in ("auto", "on", "off"):
        raise ValueError(f"TILECOMM_MPS={out.mps!r}: use auto, on or off")
    if out.gpu_ctas < 0:
        raise ValueError(f"TILECOMM_GPU_CTAS={out.gpu_ctas!r}: must be >= 0 (0: derived)")
    if out.device_timeout <= 0:
        raise ValueError(f"TILECOMM_DEVICE_TIMEOUT={out.device_timeout!r}: must be > 0 seconds")
    return out


def describe() -> list[tuple[str, str, str]]:
    """``(variable, current value, meaning)`` for every setting (for ``tilecomm doctor``)."""
    import inspect

    src = inspect.getsource(Settings).splitlines()
    docs, out = {}, []
    for i, line in enumerate(src):
        if line.strip().startswith("#: TILECOMM_"):
            name = line.strip()[3:].split(":")[0]
            text = [line.strip()[3:].split(":", 1)[1].strip()]
            j = i + 1
            while src[j].strip().startswith("#:"):
                text.append(src[j].strip()[2:].strip())
                j += 1
            docs[name] = " ".join(text)
    cur = settings()
    for f in fields(Settings):
        var = "TILECOMM_" + f.name.upper()
        out.append((var, str(getattr(cur, f.name)), docs.get(var, "")))
    return out
