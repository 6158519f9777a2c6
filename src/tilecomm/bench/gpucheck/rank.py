"""The rank side of the GPU check: what every phase gets (:class:`RankCheck`).

A phase runs on every rank of a world at once and must keep the ranks in step: each case is
entered by all ranks or by none (:meth:`RankCheck.agree` on rank 0's clock), each outcome is
learned by every rank (:meth:`RankCheck.judged`), and after a failure the ranks re-align
(:meth:`RankCheck.recover`). Agreement runs on the host (``comm.exchange``), never on the
kernels under test. Only public interfaces of the communicator and the bench are used.
"""

from __future__ import annotations

import gc
import json
import statistics
import time

import torch

from ...errors import CommMismatch

#: bytes of a rank's error text that reach the other ranks (the report of "failed on rank q")
ERROR_TEXT_BYTES = 320


class RankCheck:
    """One rank's view of a world of the check: ``comm``, the configuration, its device."""

    def __init__(self, comm, cfg: dict, device: str, partial_path: str | None):
        from .. import runner

        self.comm, self.cfg, self.runner = comm, cfg, runner
        self.w, self.r = comm.world_size, comm.rank
        self.partial = partial_path if comm.rank == 0 else None
        if cfg["interpret"]:
            comm.use_cpu_kernels("triton")
        self.dev = torch.device(runner.rank_setup(
            comm, device, None if cfg["interpret"] else cfg["device_heap_bytes"]))
        self.cuda = self.dev.type == "cuda"
        self._baselines = None

    def baselines(self):
        """The world's torch.distributed baselines (:class:`.baselines.Baselines`; set up at
        the first use, collectively)."""
        if self._baselines is None:
            from .baselines import Baselines
            self._baselines = Baselines(self, self.cfg["store"])
        return self._baselines

    # ---- agreement among ranks (host executor, never the kernels under test) ----------------
    def gather(self, ints) -> list[list[int]]:
        """Every rank's list of ints (the same length on every rank), in rank order.

        A rank whose case raised comes here while its peers may still be in the case's next
        collective (a barrier between timed rounds): both calls then fail as mismatched, the
        peers' inside their case (which they report and leave for this same agreement), this
        rank's here; so a mismatch here is retried once, where the peers now are."""
        values = [int(v) for v in ints]
        try:
            return self.comm.exchange(values)
        except CommMismatch:
            return self.comm.exchange(values)

    def gather_text(self, text: str | None, nbytes: int = ERROR_TEXT_BYTES) -> list[str]:
        """Every rank's ``text`` (its first ``nbytes`` UTF-8 bytes; "" for None)."""
        raw = (text or "").encode()[:nbytes].ljust(nbytes, b"\0")
        words = torch.frombuffer(bytearray(raw), dtype=torch.int64).tolist()
        rows = self.gather(words)
        return [torch.tensor(r, dtype=torch.int64).numpy().tobytes().rstrip(b"\0")
                .decode(errors="replace") for r in rows]

    def agree(self, flag: bool) -> bool:
        """Rank 0's decision, on every rank."""
        return bool(self.gather([int(flag)])[0][0])

    def all_ok(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on every rank."""
        return all(r[0] for r in self.gather([int(bool(flag))]))

    def in_time(self, deadline: float) -> bool:
        """Whether the next case starts: rank 0's clock against ``deadline``, on every rank."""
        return self.agree(time.time() < deadline)

    def gather_times(self, secs: list[float] | None, n: int) -> list[list[float]] | None:
        """Every rank's ``n`` timings (seconds), or None when a rank had none (it failed)."""
        rows = self.gather([int(x * 1e9) for x in secs] if secs else [-1] * n)
        if any(r[0] < 0 for r in rows):
            return None
        return [[v / 1e9 for v in r] for r in rows]

    @staticmethod
    def slowest_median(per_rank: list[list[float]]) -> float:
        """The median over rounds of the slowest rank's time (nccl-tests' convention)."""
        return statistics.median(max(rk[i] for rk in per_rank) for i in range(len(per_rank[0])))

    # ---- outcomes ---------------------------------------------------------------------------
    def timed_into(self, row: dict, label: str, time_it, rounds: int) -> None:
        """Run ``time_it() -> [seconds per call] * rounds`` on this rank and record, on every
        rank, the slowest rank's median in ``row["us"][label]`` (microseconds); if a rank
        failed, its error in ``row["errors"][label]`` and every rank recovers (collective)."""
        secs, err = None, None
        try:
            secs = time_it()
        except Exception as e:  # noqa: BLE001 - reported
            err = f"{type(e).__name__}: {str(e)[:300]}"
        per_rank = self.gather_times(secs, rounds)
        if per_rank is None:
            row["errors"][label] = self.failed_elsewhere(err)
            self.recover()
            return
        row["us"][label] = self.slowest_median(per_rank) * 1e6

    def judged(self, rec: dict, fn) -> dict:
        """Run ``fn() -> wrong elements`` on every rank; every rank learns every rank's
        outcome, and a failure names the rank that saw it and what it saw."""
        err, wrong, raised = None, 0, False
        t0 = time.perf_counter()
        try:
            wrong = fn()
            if wrong:
                err = f"{wrong} wrong elements"
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            raised = True
            err = f"{type(e).__name__}: {str(e)[:400]}"
        status = self.gather([int(err is None), int(raised)])
        ok = all(s[0] for s in status)
        failed = [q for q, s in enumerate(status) if not s[0]]
        if not ok:
            texts = self.gather_text(err)
            if err is None:                  # say what the first failing rank saw
                err = f"failed on rank {failed[0]}: {texts[failed[0]]}"
            self.recover()
        return dict(rec, ok=ok, ranks_failed=failed, error=err,
                    seconds=round(time.perf_counter() - t0, 4))

    def failed_elsewhere(self, err: str | None) -> str:
        """What a failing rank saw, for a rank that saw nothing wrong itself (collective:
        every rank calls it after a failure was agreed on)."""
        status = self.gather([int(err is None)])
        texts = self.gather_text(err)
        if err is not None:
            return err
        q = next((q for q, s in enumerate(status) if not s[0]), 0)
        return f"failed on rank {q}: {texts[q]}"

    def recover(self) -> None:
        """After a failure: every rank finishes its kernels and all continue from a common
        epoch (``comm.recover_device``); a traceback may hold heap tensors: free them in
        step."""
        gc.collect()
        try:
            self.sync()
        except Exception:  # noqa: BLE001 - a sticky CUDA error: reported by the next case
            pass
        self.comm.recover_device()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def skipped(self, rec: dict) -> dict:
        return dict(rec, ok=None, error="skipped: phase budget spent")

    def log(self, rec: dict) -> None:
        """Rank 0 appends every record to the world's partial file as it is made (what a
        world that dies leaves behind)."""
        if self.partial:
            with open(self.partial, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")


def checks_then_timings(rk, deadline: float, checks, timings, share: float) -> list[dict]:
    """A phase that checks, then times: ``checks(rk, t)`` in the first ``share`` of the time
    left, ``timings(rk, deadline)`` in the rest; the checks alone where the world cannot time
    (``cfg["timings"]`` false: ranks time-slicing a GPU without MPS)."""
    t0 = time.time()
    if not rk.cfg.get("timings", True):
        return checks(rk, deadline)
    rows = checks(rk, t0 + share * (deadline - t0))
    return rows + timings(rk, deadline)
