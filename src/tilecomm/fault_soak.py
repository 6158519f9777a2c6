"""Fault soak: rounds of random calls, a rank killed or stopped at a random point, the survivors
shrink, and now and then grow back (``scripts/fault_soak.py``; a short run in
tests/runtime/test_fault_soak.py).

Round ``k`` of seed ``s`` is drawn from ``(s, k, world size)`` alone (:func:`plan`), so every
member knows it without talking: the calls (:func:`tilecomm.soak.spec`, each checked against
the references), and maybe a victim, how it fails (SIGKILL or SIGSTOP) and before which call.
The victim notes the time and its pid in the run directory and fails; the others notice as the
communicator reports it (a CommTimeout naming it: at once for a death, after the timeout for a
stopped rank), ``shrink`` past it, and time the recovery: from the victim's note to the first
barrier that completes on the shrunk communicator. The lowest survivor then kills a stopped
victim (its process would stay forever) and, when the plan says so, the survivors ``grow`` by
one rank: the lowest survivor forks the newcomer, which joins with the ticket and takes part in
the next rounds like any member. A newcomer writes its results to the run directory when it
leaves.

What a member reports (``member`` returns it; newcomers write it): rounds and calls made,
wrong results (each described), and the recoveries and grows it timed.
"""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import time
from dataclasses import dataclass

import torch

from .errors import CommError
from .soak import run_call, spec





@dataclass(frozen=True)
class Round:
    """Round ``index``: ``calls`` calls of soak seed ``seed``; ``victim`` (a rank, or None)
    fails by ``how`` ("kill" or "stop") before call ``at``; ``grow``: add a rank afterwards."""

    index: int
    seed: int
    calls: int
    victim: int | None
    how: str
    at: int
    grow: bool


def plan(seed: int, index: int, world: int, start_world: int, calls: int = 12,
         fail_rate: float = 0.7) -> Round:
    """The round every member of a ``world``-rank communicator draws for ``index``."""
    rng = random.Random(f"tilecomm-fault-soak:{seed}:{index}:{world}")
    n = rng.randrange(1, calls + 1)
    victim = rng.randrange(world) if world > 1 and rng.random() < fail_rate else None
    how = rng.choice(("kill", "stop"))
    at = rng.randrange(n)
    after = world - (victim is not None)
    grow = after < start_world and (after < 3 or rng.random() < 0.5)
    return Round(index, seed * 100_003 + index, n, victim, how, at, grow)


def member(comm, seed: int, rounds: int, start_world: int, run_dir: str, first: int = 0,
           calls: int = 12, fail_rate: float = 0.7) -> None:
    """Take part in rounds ``first .. rounds - 1`` (every member of the communicator calls
    it). What it sees goes to ``run_dir/events-PID.jsonl`` as it happens (a member may be a
    later round's victim): per round the calls made and the wrong results, and the
    recoveries and grows it timed."""
    log = _Log(run_dir)
    children: list[int] = []
    for k in range(first, rounds):
        r = plan(seed, k, comm.world_size, start_world, calls, fail_rate)
        mine = r.victim == comm.rank

        def before(i, r=r, mine=mine):
            if mine and i == r.at:
                _fail(r, run_dir)
        failed, made, wrong = _calls(comm, k, r.seed, r.calls, before)
        if mine:                            # a victim whose call came last: fail now
            _fail(r, run_dir)
        if r.victim is not None and not failed:
            _no_failure_seen(comm, k, f"rank {r.victim}", wrong)
        log.write(round=k, calls=made, wrong=wrong)
        if r.victim is None:
            continue
        new = comm.shrink([r.victim])
        new.barrier()
        ready = time.time()
        if new.rank == 0:
            pid, died = _note(run_dir, k)
            log.write(recovery=k, how=r.how, seconds=ready - died)
            if r.how == "stop":
                _kill(pid)                  # what is left of the stopped victim
        comm.close()
        comm = new
        if r.grow:
            comm = _grow(comm, seed, k, rounds, start_world, run_dir, calls, log, children)
        _reap(children)
    comm.close()
    _reap(children, wait=True)


def _calls(comm, k: int, seed: int, n: int, before, auto_only: bool = False):
    """Round ``k``'s ``n`` calls of soak seed ``seed``, each checked; ``before(i)`` runs
    before call ``i`` (a victim fails there). Returns (failed: a call raised CommError,
    calls made, wrong results)."""
    made, wrong = 0, []
    for i in range(n):
        before(i)
        try:
            bad = run_call(comm, spec(seed, comm.world_size, i, auto_only))
        except CommError:
            return True, made, wrong
        made += 1
        if bad is not None:
            wrong.append(f"round {k}, rank {comm.rank}: {bad}")
    return False, made, wrong


def _no_failure_seen(comm, k: int, who: str, wrong: list) -> None:
    """Every call of the round went around the victim: a barrier must fail without it."""
    try:
        comm.barrier()
        wrong.append(f"round {k}: a barrier completed without {who}")
    except CommError:
        pass


class _Log:
    """One member's events, a JSON line each, flushed as written."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, f"events-{os.getpid()}.jsonl")

    def write(self, **event) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")


def _fail(r: Round, run_dir: str) -> None:
    _note_failure(run_dir, r.index)
    os.kill(os.getpid(), signal.SIGKILL if r.how == "kill" else signal.SIGSTOP)
    time.sleep(3600)        # SIGSTOP takes effect at once; never reached


def _note_failure(run_dir: str, k: int) -> None:
    """The victim's pid and the time it fails, for the survivors' timing of round ``k``."""
    with open(os.path.join(run_dir, f"victim-{k}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {time.time()!r}")
    os.rename(os.path.join(run_dir, f"victim-{k}.tmp"), os.path.join(run_dir, f"victim-{k}"))


def _note(run_dir: str, k: int) -> tuple[int, float]:
    with open(os.path.join(run_dir, f"victim-{k}")) as f:
        pid, t = f.read().split()
    return int(pid), float(t)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _grow(comm, seed, k, rounds, start_world, run_dir, calls, log, children):
    """Grow ``comm`` by one rank; the lowest member forks the newcomer."""
    t0 = time.time()
    g = comm.grow(1)
    if comm.rank == 0:
        pid = os.fork()
        if pid == 0:                        # the newcomer: never returns
            _newcomer(g.ticket, seed, k + 1, rounds, start_world, run_dir, calls)
        children.append(pid)
    grown = g.join()
    grown.barrier()
    if grown.rank == 0:
        log.write(grow=k, seconds=time.time() - t0)
    comm.close()
    return grown


def _newcomer(ticket, seed, first, rounds, start_world, run_dir, calls) -> None:
    # Forked from a member: what it inherited (old communicators, a TCP store whose server
    # thread did not come along) must never be collected here; its destructor would touch
    # threads and state this process does not have (a segfault, seen in the collector).
    gc.freeze()
    _Log(run_dir).write(newcomer=os.getpid())     # the runner waits for it by this file
    code = 0
    try:
        from .elastic import join

        torch.set_num_threads(1)
        comm = join(ticket, 0)
        comm.barrier()                      # the running members' first call on it (_grow)
        member(comm, seed, rounds, start_world, run_dir, first, calls)
    except BaseException as e:  # noqa: BLE001 - reported through the run directory
        _Log(run_dir).write(error=f"newcomer: {type(e).__name__}: {e}")
        code = 1
    finally:
        os._exit(code)


def _reap(children: list[int], wait: bool = False) -> None:
    """Drop the forked newcomers that have ended (``wait``: wait for them all) from
    ``children``."""
    children[:] = [pid for pid in children if not _reaped(pid, wait)]


def summarize(results: list, run_dir: str) -> dict:
    """The run's figures from the members' event files, and the launcher's ``results``
    (a RankError for each rank that failed: the victims, and any other is an error)."""
    victims = set()
    events = []
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name)
        if name.startswith("victim-") and not name.endswith(".tmp"):
            victims.add(_note(run_dir, int(name[len("victim-"):]))[0])
        elif name.startswith("events-"):
            with open(path) as f:
                events += [json.loads(line) for line in f if line.strip()]
    errors = [e["error"] for e in events if "error" in e]
    errors += [str(r) for r in results if isinstance(r, Exception) and not _a_victim(r)]
    rounds = {e["round"] for e in events if "round" in e}
    kills = sorted(e["seconds"] for e in events if e.get("how") == "kill")
    hosts = sorted(e["seconds"] for e in events if e.get("how") == "host")
    stops = sorted(e["seconds"] for e in events if e.get("how") == "stop")
    grows = sorted(e["seconds"] for e in events if "grow" in e)
    return {
        "rounds": len(rounds),
        "calls": sum(e["calls"] for e in events if "round" in e),
        "wrong": [w for e in events for w in e.get("wrong", ())],
        "errors": errors,
        "victims": len(victims), "kills": len(kills), "stops": len(stops),
        "grows": len(grows), "recovery_kill_s": stats(kills),
        "recovery_stop_s": stats(stops), "grow_s": stats(grows),
        "hosts_lost": len(hosts), "recovery_host_s": stats(hosts),
        "recovery_host_times": hosts,     # for a total over several runs
        "left_in_shm": sum(e["left_in_shm"] for e in events if "left_in_shm" in e),
    }


def _a_victim(err) -> bool:
    """A launcher rank that failed as planned (killed; a stopped one is killed afterwards)."""
    return "SIGKILL" in str(err) or "SIGSTOP" in str(err)


def stats(xs: list[float]) -> dict | None:
    """Median, max and count of ``xs`` (None when empty)."""
    if not xs:
        return None
    xs = sorted(xs)
    return {"median": xs[len(xs) // 2], "max": xs[-1], "n": len(xs)}


def run(world: int, rounds: int, seed: int = 0, *, timeout: float = 1.0, calls: int = 12,
        run_dir: str, heap_bytes: int = 16 << 20, scratch_bytes: int = 64 << 10) -> dict:
    """A fault soak of ``rounds`` rounds on ``world`` local ranks (``timeout``: the
    communicators' wait bound, which is also how long a stopped rank takes to be noticed).
    Returns :func:`summarize`'s figures plus ``hangs`` (1 when the run outlived a generous
    bound: every wait has one, so this must stay 0), ``left_in_shm`` (tilecomm's files left
    in the segment directory) and ``seconds``."""
    import threading

    from .launch import RankGroup
    from .settings import settings

    shm = settings().shm_dir
    before = _segments(shm)
    t0 = time.monotonic()
    _subreaper(True)
    group = RankGroup(world, timeout=timeout, heap_bytes=heap_bytes, scratch_bytes=scratch_bytes)
    got: dict = {}
    group.start(first_task=(member, (seed, rounds, world, run_dir, 0, calls)))

    def collect():
        got["results"] = group.collect(keep_going=True)

    th = threading.Thread(target=collect, daemon=True)
    th.start()
    bound = rounds * (3 * timeout + 5) + 30
    th.join(bound)
    hangs = int(th.is_alive())
    group.stop()
    th.join(10)
    # the newcomers go on after the last of the launcher's ranks was a victim: wait for them
    # (they were forked by ranks, and are this process's children now: see _subreaper)
    if not _reap_newcomers(run_dir, t0 + bound):
        hangs = 1
    res = summarize(got.get("results", []), run_dir)
    deadline = time.monotonic() + 5         # newcomers still leaving
    while _segments(shm) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    res.update(requested=rounds, world=world, seed=seed, hangs=hangs,
               left_in_shm=len(_segments(shm) - before), seconds=time.monotonic() - t0)
    return res


def _subreaper(on: bool) -> None:
    """Make this process the parent of orphaned descendants (PR_SET_CHILD_SUBREAPER): a
    newcomer whose forking rank died is reparented here, where ``_reap_newcomers`` waits for
    it, instead of to init."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _reap_newcomers(run_dir: str, deadline: float) -> bool:
    """Wait (until ``deadline``, monotonic) for the newcomers of the run (they note their pid
    in ``run_dir`` first thing; reparented to this process, ``_subreaper``); False if some
    outlived it (then they are killed)."""
    try:
        while True:
            alive = [pid for pid in _newcomer_pids(run_dir) if not _reaped(pid)]
            if not alive:
                return True
            if time.monotonic() > deadline:
                for pid in alive:
                    _kill(pid)
                return False
            time.sleep(0.05)
    finally:
        _subreaper(False)


def _newcomer_pids(run_dir: str) -> list[int]:
    out = []
    for n in os.listdir(run_dir):
        if n.startswith("events-"):
            with open(os.path.join(run_dir, n)) as f:
                first = f.readline()
            if first.startswith('{"newcomer"'):
                out.append(json.loads(first)["newcomer"])
    return out


def _reaped(pid: int, wait: bool = False) -> bool:
    """True when ``pid`` (a newcomer, this process's child) has ended; reaps it (``wait``:
    waits for it). One that is not a child here was reaped by someone else (its pid may be
    reused: not asked)."""
    try:
        done, _ = os.waitpid(pid, 0 if wait else os.WNOHANG)
        return done != 0
    except ChildProcessError:
        return True


def across_hosts(seed: int, rounds: int, run_dir: str, timeout: float,
                 calls: int = 12) -> None:
    """A rank's part of a fault soak under torchrun on simulated hosts (every rank calls it;
    ``scripts/fault_soak.py --hosts``). Rounds of random calls (``algo="auto"``: the
    hierarchical algorithms) on the communicator that spans the hosts; in a round drawn from
    the seed the last host is lost at a random call (its torchrun and ranks killed; the first
    host holds torchrun's store, which shrink meets through), the survivors shrink past its
    ranks, and the remaining rounds run on them without further faults (under torchrun a rank
    that dies takes its host's ranks with it, so one host cannot lose one rank)."""
    from .launch import init
    from .torchrun import check_in_for_lost_agents, kill_this_host

    comm = init(timeout=timeout)
    rng = random.Random(f"tilecomm-fault-soak-hosts:{seed}")
    lose, at = rng.randrange(rounds), rng.randrange(calls)
    lost = list(comm.layout.hosts[-1])
    log = _Log(run_dir)
    for k in range(rounds):
        def before(i, k=k):
            if k == lose and i == at and comm.rank in lost:
                if comm.topology.local_rank == 0:
                    _note_failure(run_dir, k)
                kill_this_host()
        failed, made, wrong = _calls(comm, k, seed * 100_003 + k, calls, before,
                                     auto_only=True)
        if k == lose and not failed:
            _no_failure_seen(comm, k, f"ranks {lost}", wrong)
        log.write(round=k, calls=made, wrong=wrong)
        if k == lose:
            new = comm.shrink(lost)
            new.barrier()
            if new.rank == 0:
                log.write(recovery=k, how="host", seconds=time.time() - _note(run_dir, k)[1])
            comm.close()
            comm = new
            member(comm, seed, rounds, comm.world_size, run_dir, k + 1, calls, fail_rate=0)
            break
    else:
        comm.close()
    if comm.rank == 0:      # what this host's /dev/shm holds once every rank has closed
        from .settings import settings
        check_in_for_lost_agents(1)
        time.sleep(0.5)
        log.write(left_in_shm=len(_segments(settings().shm_dir)))


def _segments(directory: str) -> set[str]:
    try:
        return {n for n in os.listdir(directory) if n.startswith("tilecomm")}
    except FileNotFoundError:
        return set()
