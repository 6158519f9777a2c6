"""Simulated hosts on one machine: ``tilecomm hosts run --hosts 2 --per-host 2 -- script.py``.

A simulated host is a process tree in its own mount and UTS namespaces (``unshare --mount
--uts``) with a private tmpfs on /dev/shm and its own hostname, so no rank can map another
host's shared memory; torchrun runs in each with ``--nnodes``/``--node-rank``, and every
connection stays on 127.0.0.1 (the rendezvous store and the Gloo groups bind to loopback).
Needs root (or user namespaces); :func:`available` says whether this machine allows it.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from functools import lru_cache


@lru_cache(maxsize=1)
def available() -> str | None:
    """None when simulated hosts can be made here, else the reason they cannot."""
    try:
        r = subprocess.run(["unshare", "--mount", "--uts", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm && hostname probe"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare unavailable: {e}"
    if r.returncode:
        return f"unshare --mount --uts failed: {(r.stderr or r.stdout).strip()[:200]}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_commands(per_host: list[int], argv: list[str], *, port: int,
                  shm_size: str = "2g", python: str = sys.executable) -> list[list[str]]:
    """One command line per simulated host (torchrun inside fresh namespaces)."""
    n = len(per_host)
    cmds = []
    for h, nproc in enumerate(per_host):
        torchrun = [python, "-m", "torch.distributed.run", f"--nnodes={n}",
                    f"--node-rank={h}", f"--nproc-per-node={nproc}",
                    "--master-addr=127.0.0.1", f"--master-port={port}",
                    "--rdzv-backend=static", *argv]
        inner = (f"mount -t tmpfs -o size={shm_size},mode=1777 tmpfs /dev/shm && "
                 f"hostname simhost{h} && exec {shlex.join(torchrun)}")
        cmds.append(["unshare", "--mount", "--uts", "--propagation", "private",
                     "sh", "-c", inner])
    return cmds


def run(per_host: list[int], argv: list[str], *, timeout: float | None = None,
        env: dict | None = None, capture: bool = False) -> "Result":
    """Run ``argv`` (a script and its arguments, as for torchrun) on simulated hosts with
    ``per_host[h]`` ranks each; returns exit codes (and output when ``capture``). Every host
    is stopped when one fails or ``timeout`` passes."""
    reason = available()
    if reason:
        raise RuntimeError(f"simulated hosts need mount and UTS namespaces: {reason}")
    port = free_port()
    e = dict(os.environ if env is None else env)
    e.setdefault("OMP_NUM_THREADS", "1")
    procs = []
    out = subprocess.PIPE if capture else None
    for cmd in host_commands(per_host, argv, port=port):
        procs.append(subprocess.Popen(cmd, env=e, stdout=out, stderr=subprocess.STDOUT
                                      if capture else None, text=True, start_new_session=True))
    deadline = None if timeout is None else time.monotonic() + timeout
    codes: list[int | None] = [None] * len(procs)
    outputs = [""] * len(procs)
    try:
        if capture:
            import threading

            def drain(i):
                outputs[i] = procs[i].stdout.read()
            threads = [threading.Thread(target=drain, args=(i,), daemon=True)
                       for i in range(len(procs))]
            for t in threads:
                t.start()
        while any(c is None for c in codes):
            for i, p in enumerate(procs):
                if codes[i] is None:
                    codes[i] = p.poll()
            failed = any(c not in (None, 0) for c in codes)
            if failed or (deadline is not None and time.monotonic() > deadline):
                time.sleep(0.0 if not failed else 2.0)   # let the others report their error
                break
            time.sleep(0.05)
    finally:
        for i, p in enumerate(procs):
            if p.poll() is None:
                _kill_tree(p)
            codes[i] = p.wait()
        if capture:
            for t in threads:
                t.join(timeout=5)
    return Result(codes, outputs)


def _kill_tree(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue


class Result:
    def __init__(self, codes, outputs):
        self.codes, self.outputs = codes, outputs

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)

    @property
    def output(self) -> str:
        return "".join(f"--- host {h} (exit {c}) ---\n{o}" for h, (c, o)
                       in enumerate(zip(self.codes, self.outputs)))


def parse_per_host(hosts: int, per_host: str) -> list[int]:
    """``--hosts 3 --per-host 2`` -> [2, 2, 2]; ``--per-host 2,1`` -> [2, 1]."""
    vals = [int(x) for x in str(per_host).split(",") if x.strip()]
    if len(vals) == 1:
        vals = vals * hosts
    if len(vals) != hosts or any(v < 1 for v in vals):
        raise ValueError(f"--per-host must be one count or {hosts} counts >= 1, got {per_host!r}")
    return vals
