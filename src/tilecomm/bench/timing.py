"""The rank side of every bench: one loop of warm-up and timed rounds, for every method.

A *method* is one way of doing a case's work on a rank: tilecomm's call, and the baselines it
is compared with (Gloo, a naive loop, a memcpy, the unfused op). It is a function of a
:class:`Timer` that does one round's work and times its parts with the timer:

* :meth:`Timer.calls`: ``iters`` back-to-back calls after a barrier, seconds per call (the
  collectives, nccl-tests' way), with an untimed re-fill every ``chunk`` calls;
* :meth:`Timer.phase`: one call after a barrier, its seconds (MoE's dispatch, then combine);
* :meth:`Timer.add`: seconds a method measured itself (KV: until the last request landed).

:func:`measure` warms every method up, then runs ``rounds`` rounds of every method,
interleaved (A B, B A, A B, ...: drift in the machine's load hits tilecomm and its baselines
alike, and neither always runs first), and returns per method and phase this rank's seconds
per round. The launcher side (:mod:`.harness`) reduces them over ranks.
"""

from __future__ import annotations

import time
from typing import Callable

import torch


class Clock:
    """Accumulates the time of timed sections: CUDA events on a CUDA device (read once per
    round), else perf_counter."""

    def __init__(self, dev: torch.device):
        self.cuda = dev.type == "cuda"
        self.reset()

    def reset(self):
        self.pairs, self.total = [], 0.0

    def start(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.pairs.append([e, None])
        else:
            self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.pairs[-1][1] = e
        else:
            self.total += time.perf_counter() - self.t0

    def seconds(self) -> float:
        if self.cuda and self.pairs:
            self.pairs[-1][1].synchronize()
            return sum(s.elapsed_time(e) for s, e in self.pairs) / 1e3
        return self.total


class Timer:
    """One method's seconds per round on this rank, by phase. While ``timing`` is False (the
    warm-up) the method runs the same code and nothing is recorded."""

    def __init__(self, barrier: Callable[[], None], clock: Clock):
        self.barrier, self.clock = barrier, clock
        self.samples: dict[str, list[float]] = {}
        self.timing = False

    def add(self, name: str, seconds: float) -> None:
        """Record ``seconds`` (measured by the method itself) for this round's ``name``."""
        if self.timing:
            self.samples.setdefault(name, []).append(seconds)

    def phase(self, name: str, fn: Callable):
        """A barrier, then ``fn()`` timed once; returns what ``fn`` returned."""
        self.barrier()
        self.clock.reset()
        self.clock.start()
        out = fn()
        self.clock.stop()
        self.add(name, self.clock.seconds())
        return out

    def calls(self, name: str, fn: Callable, iters: int, *, refill: Callable | None = None,
              chunk: int | None = None, warmup: int | None = None,
              setup: Callable | None = None, teardown: Callable | None = None) -> None:
        """``iters`` back-to-back calls after a barrier, recorded as seconds per call.
        ``refill`` (untimed) runs before the first call and then every ``chunk`` calls. In
        the warm-up: ``warmup`` calls (default ``iters``), no barrier, re-filled the same way.
        ``setup`` and ``teardown`` run untimed around the round (and the warm-up)."""
        if setup:
            setup()
        try:
            self._calls(name, fn, iters, refill, chunk, warmup)
        finally:
            if teardown:
                teardown()

    def _calls(self, name, fn, iters, refill, chunk, warmup) -> None:
        step = chunk or max(iters, warmup or 0, 1)
        if not self.timing:
            for i in range(iters if warmup is None else warmup):
                if refill and i % step == 0:
                    refill()
                fn()
            return
        self.barrier()
        self.clock.reset()
        left = iters
        while left > 0:
            k = min(step, left)
            if refill:
                refill()
            self.clock.start()
            for _ in range(k):
                fn()
            self.clock.stop()
            left -= k
        self.add(name, self.clock.seconds() / iters)


Method = Callable[[Timer], object]


def measure(barrier: Callable[[], None], methods: dict[str, Method], rounds: int, *,
            warmup: int = 1, clock: Clock | None = None,
            clocks: dict[str, Clock] | None = None) -> dict[str, dict[str, list[float]]]:
    """``warmup`` untimed rounds of each method, then ``rounds`` timed rounds of all of them,
    interleaved in alternating order. Returns ``{method: {phase: [seconds per round]}}``.
    ``clock`` times every method (default: perf_counter) but those ``clocks`` names (a Gloo
    baseline of a CUDA bench runs on the host: CUDA events would not see it)."""
    clock = clock or Clock(torch.device("cpu"))
    timers = {m: Timer(barrier, (clocks or {}).get(m, clock)) for m in methods}
    for m, fn in methods.items():
        for _ in range(warmup):
            fn(timers[m])
        timers[m].timing = True
    names = list(methods)
    for r in range(rounds):
        for m in (names if r % 2 == 0 else names[::-1]):
            methods[m](timers[m])
    return {m: t.samples for m, t in timers.items()}


def time_rounds(barrier, fn, warmup: int, iters: int, rounds: int, *, refill=None,
                chunk: int | None = None, clock: Clock | None = None) -> list[float]:
    """Seconds per call of each round of one method of back-to-back calls (``warmup`` untimed
    calls first): :func:`measure` with :meth:`Timer.calls`. ``refill`` (untimed) runs before
    the first call and then every ``chunk`` calls, warm-up included."""
    def method(t: Timer):
        t.calls("call", fn, iters, refill=refill, chunk=chunk, warmup=warmup)
    return measure(barrier, {"m": method}, rounds, clock=clock)["m"].get("call", [])
