"""Simulated hosts on one machine: ``tilecomm hosts run --hosts 2 --per-host 2 -- script.py``.

A simulated host is a process tree in its own mount and UTS namespaces (``unshare --mount
--uts``) with a private tmpfs on /dev/shm and its own hostname, so no rank can map another
host's shared memory; torchrun runs in each with ``--nnodes``/``--node-rank``, and every
connection stays on 127.0.0.1 (the rendezvous store and the Gloo groups bind to loopback).
Needs root (or user namespaces); :func:`available` says whether this machine allows it.
"""

from __future__ import annotations

import argparse
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


def start(per_host: list[int], argv: list[str], *, env: dict | None = None,
          capture: bool = False, shm_size: str = "2g") -> list[subprocess.Popen]:
    """Start torchrun with ``argv`` on simulated hosts; one process (tree) per host, each with
    a private /dev/shm of ``shm_size`` (tmpfs size: "2g", bytes, ...)."""
    reason = available()
    if reason:
        raise RuntimeError(f"simulated hosts need mount and UTS namespaces: {reason}")
    port = free_port()
    e = dict(os.environ if env is None else env)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.setdefault("GLOO_SOCKET_IFNAME", "lo")   # any Gloo group of the program binds to loopback
    out = subprocess.PIPE if capture else None
    procs = []
    try:
        for cmd in host_commands(per_host, argv, port=port, shm_size=str(shm_size)):
            procs.append(subprocess.Popen(cmd, env=e, stdout=out,
                                          stderr=subprocess.STDOUT if capture else None,
                                          text=True, start_new_session=True))
    except BaseException:
        stop(procs)
        raise
    return procs


def stop(procs: list[subprocess.Popen]) -> list[int]:
    """End every host's process tree (politely, then by force); their exit codes."""
    for p in procs:
        if p.poll() is None:
            _kill_tree(p)
    return [p.wait() for p in procs]


def run(per_host: list[int], argv: list[str], *, timeout: float | None = None,
        env: dict | None = None, capture: bool = False, keep_going: bool = False) -> "Result":
    """Run ``argv`` (a script and its arguments, as for torchrun) on simulated hosts with
    ``per_host[h]`` ranks each; returns exit codes (and output when ``capture``). Every host
    is stopped when one fails or ``timeout`` passes; with ``keep_going`` a host that fails
    (or is killed) stops nobody else: the others run to their end (a job that survives the
    loss of a host, ``examples/elastic_ddp.py``)."""
    import threading

    procs = start(per_host, argv, env=env, capture=capture)
    outputs = [""] * len(procs)
    threads = []
    if capture:
        def drain(i):
            outputs[i] = procs[i].stdout.read()
        threads = [threading.Thread(target=drain, args=(i,), daemon=True)
                   for i in range(len(procs))]
        for t in threads:
            t.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if not keep_going and any(p.poll() not in (None, 0) for p in procs):
                _wait_all(procs, 3.0)      # let the others report their error, then stop
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        codes = stop(procs)
        for t in threads:
            t.join(timeout=5)
    return Result(codes, outputs, timed_out=deadline is not None and
                  time.monotonic() > deadline)


def _wait_all(procs, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.05)


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
    """Exit codes (one per host), captured output, and whether the run hit its timeout."""

    def __init__(self, codes, outputs, timed_out: bool = False):
        self.codes, self.outputs, self.timed_out = codes, outputs, timed_out

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


# ---- command line: tilecomm hosts ... ----------------------------------------------------------
def add_hosts_parser(sub) -> None:
    p = sub.add_parser("hosts", help="run a torchrun program on simulated hosts",
                       description="Simulated hosts on this machine: each host is torchrun "
                                   "in its own mount and UTS namespaces with a private "
                                   "/dev/shm and hostname; all traffic stays on 127.0.0.1.")
    hs = p.add_subparsers(dest="hosts_command", required=True)
    r = hs.add_parser("run", help="run SCRIPT [ARGS] under torchrun on simulated hosts")
    r.add_argument("--hosts", type=int, default=2, help="number of simulated hosts")
    r.add_argument("--per-host", default="2",
                   help="ranks per host: one count, or one per host (e.g. 2,1)")
    r.add_argument("--timeout", type=float, default=None, help="stop every host after S s")
    r.add_argument("--keep-going", action="store_true",
                   help="a host that fails stops no other host (jobs that survive a lost "
                        "host); the exit status is then that of the hosts that survived")
    r.add_argument("argv", nargs=argparse.REMAINDER, help="-- script.py [args]")
    r.set_defaults(func=_run_cli)
    c = hs.add_parser("check", help="say whether simulated hosts can be made here")
    c.set_defaults(func=_check_cli)


def _run_cli(args) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise ValueError("hosts run: give the program after --, e.g. "
                         "tilecomm hosts run --hosts 2 -- train.py")
    per_host = parse_per_host(args.hosts, args.per_host)
    res = run(per_host, argv, timeout=args.timeout, keep_going=args.keep_going)
    if res.timed_out:
        print(f"tilecomm hosts: stopped after {args.timeout:g} s", file=sys.stderr)
    bad = [h for h, c in enumerate(res.codes) if c]
    if bad:
        print(f"tilecomm hosts: host(s) {bad} exited with {[res.codes[h] for h in bad]}",
              file=sys.stderr)
    if args.keep_going:     # the job survived when some host finished and none timed out
        return 0 if len(bad) < len(res.codes) and not res.timed_out and \
            all(c == 0 or c < 0 or c == 137 for c in res.codes) else 1
    return 0 if res.ok else 1


def _check_cli(args) -> int:
    reason = available()
    print("simulated hosts: available" if reason is None else f"simulated hosts: {reason}")
    return 0 if reason is None else 1
