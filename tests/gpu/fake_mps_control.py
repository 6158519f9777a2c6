#!/usr/bin/env python
"""A stand-in for nvidia-cuda-mps-control, for tests on machines without a GPU.

``-d`` starts a "daemon" (a background process) that answers on
``$CUDA_MPS_PIPE_DIRECTORY/control`` until it gets ``quit``; without arguments it reads
commands from stdin (``get_server_list``: exit 0 while the daemon lives; ``quit``: stop it).
Every invocation is appended to ``$FAKE_MPS_LOG`` as a JSON line (argv, commands, the pipe
and log directories). ``FAKE_MPS_FAIL=1`` makes ``-d`` fail the way a machine without MPS
does; ``FAKE_MPS_IGNORE_QUIT=1`` makes the daemon ignore quit.
"""

import json
import os
import signal
import sys
import time

pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
logd = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "")
control = os.path.join(pipe, "control")


def note(**rec):
    path = os.environ.get("FAKE_MPS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(rec, pipe=pipe, log=logd)) + "\n")


def alive() -> int | None:
    """The daemon's pid while it answers (it removes the control file as it exits; a dead
    daemon may linger as a zombie, so the file, not the pid, says whether it answers)."""
    try:
        return int(open(control).read().strip())
    except (OSError, ValueError):
        return None


def leave(*_):
    try:
        os.unlink(control)
    except OSError:
        pass
    os._exit(0)


if sys.argv[1:] == ["-d"]:
    note(argv=sys.argv[1:])
    if os.environ.get("FAKE_MPS_FAIL") == "1":
        print("An instance of this daemon is already running / cannot start", file=sys.stderr)
        sys.exit(1)
    if os.fork():
        sys.exit(0)               # the parent returns at once, as the real -d does
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)     # a daemon keeps none of its caller's pipes
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if logd:
        with open(os.path.join(logd, "control.log"), "a") as f:
            f.write("[fake] Starting control daemon\n")
    with open(control, "w") as f:
        f.write(str(os.getpid()))
    ignore = os.environ.get("FAKE_MPS_IGNORE_QUIT") == "1"
    signal.signal(signal.SIGUSR1, (lambda *a: None) if ignore else leave)
    deadline = time.time() + 120          # never outlive a test run
    while time.time() < deadline and os.path.exists(control):
        time.sleep(0.05)
    leave()

cmds = [c.strip() for c in sys.stdin.read().splitlines() if c.strip()]
note(argv=sys.argv[1:], commands=cmds)
pid = alive()
if pid is None:
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
for c in cmds:
    if c == "quit":
        os.kill(pid, signal.SIGUSR1)
        for _ in range(100):
            if alive() is None:
                break
            time.sleep(0.02)
        if alive() is None:
            if logd:
                with open(os.path.join(logd, "control.log"), "a") as f:
                    f.write("[fake] Exit\n")
sys.exit(0)
