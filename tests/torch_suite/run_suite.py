#!/usr/bin/env python3
"""Run PyTorch's own distributed test suite against the tilecomm torch.distributed backend.

PyTorch ships the suite in its wheel (``torch.testing._internal.distributed.distributed_test``,
class ``DistributedTest._DistTestBase``) but not the few lines that turn it into runnable
tests (upstream's ``test/distributed/test_distributed_spawn.py``). This script is those lines
plus what a third-party backend needs, a selection mechanism and a machine-readable report::

    python tests/torch_suite/run_suite.py --backend tilecomm --select fast --json out.json
    python tests/torch_suite/run_suite.py --backend gloo --select collectives   # the baseline
    python tests/torch_suite/run_suite.py --backend tilecomm -k 'all_reduce|broadcast'
    python tests/torch_suite/run_suite.py --list --select fast

Each test runs in fresh rank processes, as upstream does: the parent process (this script)
starts ``--world-size`` ranks with ``--start-method`` (spawn, as upstream, by default) and
joins them. Spawned ranks re-import this file as ``__mp_main__``; the module-level code below
therefore runs in every rank too, so each rank imports ``tilecomm.torch`` (which registers
the backend) and sees the same feature sets and unlocked tests as the parent.

What a third-party backend needs (read from torch/testing/_internal/distributed/distributed_test.py
and common_distributed.py):

* ``BACKEND`` and ``WORLD_SIZE`` are read when the suite is imported, and every skip decorator
  is evaluated then, so they (and the feature sets below) must be in place before the import.
* ``require_backend_is_available(backends)`` skips unless ``BACKEND`` is in ``backends`` and
  "available"; a name that is not gloo/nccl/mpi/ucc counts as available only when it is in
  ``DistTestCases.backend_feature["plugin"]``. Other feature sets (``ddp``, ``subgroup``,
  ``gpu``, ``cuda``) list gloo/nccl/ucc by name. ``FEATURES`` below adds tilecomm to the sets
  whose feature it has; each entry says why.
* Many tests are gated on a backend *name* although the test body runs the same CPU code for
  any backend that implements the call (``BACKEND != "mpi"`` for CPU all_to_all, ``{"gloo"}``
  for all_reduce_coalesced and object scatter). ``UNLOCKS`` lists those, with the upstream
  reason that is lifted, the backends it is lifted for (Gloo too where Gloo implements the
  call, so both are compared on the same tests) and why; the report marks them.
  ``--no-unlock`` runs the suite exactly as upstream gates it.
* ``test_barrier_timeout_global`` runs only when ``INIT_METHOD`` is a file:// URL at import;
  upstream's CI sets one, and so does this runner (each test then gets its own file).

Results: one line per test on stdout, and ``--json`` / ``--junit`` files. A skip raised
inside a rank process reaches the parent upstream only as "look at subprocess log"; this
runner records the rank's real reason. Exit status: 0 when no selected test failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest

# ---------------------------------------------------------------------------------------------
# Selections

#: A fast selection of collective tests (well under a second each with ``--start-method fork``):
#: every collective the suite tests on CPU. ``--select fast`` picks FAST at world size 2,
#: FAST_WS4 at 4..7 and FAST_WS8 at 8 or more. The suite has no CPU test of reduce_scatter or
#: all_gather_into_tensor (only NCCL/CUDA ones).
FAST = [
    # all_reduce: ops, async, complex, unsupported ops, full new_group, coalesced, future
    "test_all_reduce_sum",
    "test_all_reduce_max",
    "test_all_reduce_product",
    "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_sum",
    "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_full_group_min",
    "test_get_future",
    # broadcast, reduce
    "test_broadcast",
    "test_broadcast_full_group",
    "test_reduce_sum",
    "test_reduce_min",
    "test_reduce_full_group_max",
    "test_reduce_sum_twice",
    # all_gather (list), coalesced, objects
    "test_all_gather",
    "test_all_gather_complex",
    "test_all_gather_full_group",
    "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_with_empty",
    "test_all_gather_object_default_pg",
    "test_all_gather_object_subgroup",
    # gather / scatter and their argument checks, objects
    "test_gather",
    "test_gather_checks",
    "test_scatter",
    "test_scatter_checks",
    "test_scatter_complex",
    "test_scatter_object_list",
    # all_to_all: single with equal and unequal splits, list
    "test_all_to_all_single_equal_split",
    "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_equal_split_complex",
    "test_all_to_all_single_unequal_split_full_group",
    "test_all_to_all",
    "test_all_to_all_full_group",
    # point to point
    "test_send_recv",
    "test_send_recv_with_tag",
    "test_send_recv_any_source",
    "test_isend",
    "test_irecv",
    "test_batch_isend_irecv_gloo",
    # barrier, groups, DDP on CPU (all_reduce/broadcast under autograd hooks)
    "test_barrier",
    "test_barrier_full_group",
    "test_barrier_timeout_full_group",
    "test_get_rank_size_group",
    "test_get_rank_size_full_group",
    "test_destroy_group",
    "test_destroy_full_group",
    "test_get_backend",
    "test_Backend_enum_class",
    "test_DistributedDataParallelCPU",
]

#: The tests that need more ranks than 2: the '_group' variants use group [1, 2] and run only at
#: world size >= 8 (skip_if_small_worldsize); gather_object wants exactly 4.
FAST_WS4 = [
    "test_get_rank_size_group",
    "test_destroy_group",
    "test_gather_object",
    "test_gather_object_subgroup",
    "test_all_gather_object_subgroup",
]
FAST_WS8 = [
    "test_all_reduce_group_sum",
    "test_all_reduce_coalesced_group_sum",
    "test_broadcast_group",
    "test_reduce_group_max",
    "test_all_gather_group",
    "test_gather_group",
    "test_scatter_group",
    "test_all_to_all_single_unequal_split_group",
    "test_all_to_all_group",
    "test_barrier_group",
]

#: Tests that exercise the process group's collectives and point-to-point directly (as
#: opposed to DDP, optimizers, profiling and model averaging built on top of them).
COLLECTIVE_RE = re.compile(
    r"^test_(all_reduce|all_gather|all_to_all|broadcast|reduce|scatter|gather|send_recv|"
    r"isend|irecv|batch_isend_irecv|barrier|monitored_barrier|new_subgroups|get_rank|"
    r"get_backend|destroy|Backend_enum|coalescing_manager|sparse_all_reduce|nccl_backend_bool)"
)

# ---------------------------------------------------------------------------------------------
# What the runner changes about the suite, for the tilecomm backend only

#: Feature sets of ``DistTestCases.backend_feature`` that tilecomm is added to, and why. Not
#: added: "gpu" and "cuda": tilecomm's backend serves CPU tensors only (the CPU-only tests gated
#: on "gpu" are lifted one by one in UNLOCKS).
FEATURES = {
    "plugin": "tilecomm is a registered third-party backend (dist.Backend.register_backend); "
              "without this require_backend_is_available treats it as unavailable",
    "ddp": "DistributedDataParallel on CPU needs only all_reduce, broadcast and all_gather, "
           "which tilecomm implements",
    "subgroup": "new_group / new_subgroups(_by_enumeration) create tilecomm groups over any "
                "subset of ranks (the skip message says 'on CUDA devices', but the gated tests "
                "that need CUDA also carry their own GPU skip, which still applies)",
}

#: Tests the suite gates on a backend *name* although the body runs the same CPU code for every
#: backend that implements the call. Each entry: (tests, the upstream skip reason that is lifted
#: (a prefix; "{B}" stands for the backend), backends it is lifted for, why). A test is only lifted
#: when its upstream reason matches (so an upstream change shows up as a skip, not a surprise).
#: ``--no-unlock`` keeps every upstream gate.
UNLOCKS = [
    (("test_all_to_all_single_equal_split", "test_all_to_all_single_equal_split_complex",
      "test_all_to_all_single_equal_split_full_group", "test_all_to_all_single_equal_split_group",
      "test_all_to_all_single_unequal_split", "test_all_to_all_single_unequal_split_complex",
      "test_all_to_all_single_unequal_split_full_group",
      "test_all_to_all_single_unequal_split_group"),
     "Only MPI supports CPU all_to_all_single", ("gloo", "tilecomm"),
     "Gloo and tilecomm both implement all_to_all_single (with split sizes) on CPU tensors"),
    (("test_all_to_all", "test_all_to_all_complex", "test_all_to_all_full_group",
      "test_all_to_all_group"),
     "Only MPI supports all_to_all", ("tilecomm",),
     "tilecomm implements list all_to_all with per-peer sizes; Gloo's alltoall requires equal "
     "sizes (it fails these tests with 'ProcessGroupGloo::alltoall: invalid tensor size'), so "
     "for Gloo the upstream skip is genuine and stays"),
    (tuple(f"test_all_reduce_coalesced_{g}{op}" for g in ("", "group_", "full_group_")
           for op in ("sum", "product", "min", "max")) + ("test_scatter_object_list",),
     "Test requires backend {B} to be one of {'gloo'}", ("tilecomm",),
     "allreduce_coalesced and scatter_object_list on CPU tensors; the bodies never branch on "
     "the backend"),
    (("test_grads_same_across_ranks_with_no_sync",),
     "Test requires backend {B} to be one of {'gloo'}", ("tilecomm",),
     "DDP on a CPU model (the 'ddp' feature); the body never branches on the backend"),
    (("test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags"),
     "GLOO Batch Send Recv CPU", ("tilecomm",),
     "batch_isend_irecv of CPU tensors; the body never branches on the backend"),
    (("test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
      "test_gather_object", "test_gather_object_subgroup"),
     "Test requires backend {B} to be one of", ("tilecomm",),
     "object collectives, gated on the 'gpu' feature set although for every backend but NCCL "
     "the body pickles CPU objects only (tilecomm has no GPU support, so it is not added to "
     "that set)"),
    (("test_get_future",),
     "get_future is only supported on mpi, nccl and gloo", ("tilecomm",),
     "tilecomm's Work objects return a torch.futures.Future from get_future()"),
    (("test_sparse_all_reduce_sum",),
     "Only Gloo backend supports sparse all reduce", ("tilecomm",),
     "tilecomm's process group sums sparse COO tensors (gathers every rank's indices and "
     "values, adds them in rank order); the body never branches on the backend"),
    (("test_barrier_timeout_global", "test_barrier_timeout_group",
      "test_barrier_timeout_full_group"),
     "Only gloo backend supports timeouts", ("tilecomm",),
     "tilecomm process groups take the timeout of init_process_group/new_group; a barrier "
     "that peers never join must raise after it"),
]

# ---------------------------------------------------------------------------------------------
# Configuration. Runs in the parent and again in every spawned rank (as __mp_main__).


def _parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("tilecomm", "gloo"), default="tilecomm")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--select", choices=("fast", "collectives", "all"), default="collectives",
                   help="fast: the CI selection (which depends on --world-size); collectives: every test of a collective or "
                        "point-to-point call; all: the whole suite (default: collectives)")
    p.add_argument("-k", dest="patterns", action="append", default=[],
                   help="keep tests whose name matches this regular expression (re.search; "
                        "repeatable, any may match); applied after --select")
    p.add_argument("--tests", nargs="+", default=[], help="run exactly these tests")
    p.add_argument("--start-method", choices=("spawn", "fork"), default="spawn",
                   help="how rank processes start: spawn (as upstream; ~5 s per test to "
                        "import torch) or fork (ranks inherit the imported suite: ~0.5 s)")
    p.add_argument("--timeout", type=int, default=120,
                   help="seconds one test may take before its ranks are killed (default 120)")
    p.add_argument("--no-unlock", action="store_true",
                   help="run the suite exactly as upstream gates it (see UNLOCKS)")
    p.add_argument("--json", help="write the results as JSON to this file")
    p.add_argument("--junit", help="write the results as JUnit XML to this file")
    p.add_argument("--list", action="store_true", help="print the selected tests and exit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print the ranks' log output (skip reasons, tracebacks) as it comes")
    return p.parse_args(argv)


if __name__ == "__main__":
    ARGS = _parse_args(sys.argv[1:])
    os.environ["BACKEND"] = ARGS.backend
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    # common_distributed reads it at import: the per-test limit of MultiProcessTestCase.
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(ARGS.timeout)
    os.environ["TILECOMM_SUITE_UNLOCK"] = "0" if ARGS.no_unlock else "1"
    os.environ["TILECOMM_SUITE_VERBOSE"] = "1" if ARGS.verbose else "0"
    # Failing tests otherwise print a repro command that names upstream's file layout.
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    os.environ["TILECOMM_SUITE_RUN_DIR"] = tempfile.mkdtemp(prefix="tilecomm-suite-")
    # As upstream's CI: a file:// init method (TestDistBackend.setUp points it at a fresh file
    # for every test; this value only lets the suite know, at import, which kind it is).
    os.environ["INIT_METHOD"] = "file://" + os.path.join(os.environ["TILECOMM_SUITE_RUN_DIR"],
                                                         "init")
    if ARGS.backend == "tilecomm":
        # A private shared-memory directory (TILECOMM_SHM_DIR is a documented setting): what a
        # test leaves in it is that test's leak, whatever else runs on the machine.
        os.environ["TILECOMM_SHM_DIR"] = tempfile.mkdtemp(prefix="tcsuite-", dir="/dev/shm")

if "BACKEND" not in os.environ or "TILECOMM_SUITE_RUN_DIR" not in os.environ:
    sys.exit("run this file as a script: python tests/torch_suite/run_suite.py --help")

BACKEND = os.environ["BACKEND"]
UNLOCK = os.environ.get("TILECOMM_SUITE_UNLOCK", "1") == "1"
RUN_DIR = os.environ["TILECOMM_SUITE_RUN_DIR"]

import torch
from torch.testing._internal.common_distributed import (
    TEST_SKIPS,
    DistTestCases,
)

if os.environ.get("TILECOMM_SUITE_VERBOSE") != "1":
    import logging

    # Ranks log every skip and traceback through this logger (set to INFO by its import);
    # the report has them.
    logging.getLogger("torch.testing._internal.common_distributed").setLevel(logging.CRITICAL)

if BACKEND == "tilecomm":
    try:
        import tilecomm.torch  # registers the "tilecomm" backend
    except ImportError:
        # The package is normally installed; from a bare checkout, use its src/.
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "..", "..", "src"))
        import tilecomm.torch  # noqa: F401
    for _feature in FEATURES:
        DistTestCases.backend_feature[_feature].add(BACKEND)

import torch.testing._internal.distributed.distributed_test as _suite
from torch.testing._internal.distributed.distributed_test import (
    DistributedTest,
    TestDistBackend,
)

_BASE = DistributedTest._DistTestBase


def _unlock() -> dict[str, str]:
    """Lift the name-only gates in UNLOCKS for BACKEND; return {test: lifted upstream reason}."""
    lifted = {}
    for names, reason, backends, _why in UNLOCKS:
        if BACKEND not in backends:
            continue
        prefix = reason.replace("{B}", BACKEND)
        for name in names:
            fn = getattr(_BASE, name, None)
            if fn is None or not getattr(fn, "__unittest_skip__", False):
                continue
            why = getattr(fn, "__unittest_skip_why__", "") or ""
            if not why.startswith(prefix):
                continue
            # Skip decorators applied below a wrapping one (functools.wraps copies the flag up,
            # and the gate then overwrites the reason) stay in force: e.g. an exact world size.
            other, inner = None, fn
            while other is None and hasattr(inner, "__wrapped__"):
                inner = inner.__wrapped__
                inner_why = getattr(inner, "__unittest_skip_why__", "") or ""
                if getattr(inner, "__unittest_skip__", False) and not inner_why.startswith(prefix):
                    other = inner_why
            if other is not None:
                fn.__unittest_skip_why__ = other
                continue
            fn.__unittest_skip__ = False
            lifted[name] = why
    return lifted


LIFTED = _unlock() if UNLOCK else {}


def skip_reasons(name: str) -> list[str]:
    """Every upstream skip reason stacked on a test, outermost first (a gate often hides an
    inner ``unittest.skip``: e.g. test_broadcast_object_list is skipped for every backend)."""
    reasons, fn = [], getattr(_BASE, name)
    while fn is not None:
        if getattr(fn, "__unittest_skip__", False):
            why = getattr(fn, "__unittest_skip_why__", "")
            if why not in reasons and why != LIFTED.get(name):
                reasons.append(why)
        fn = getattr(fn, "__wrapped__", None)
    return reasons


def _skip_file(test_name: str, rank: int) -> str:
    return os.path.join(RUN_DIR, f"skip.{test_name}.{rank}")


class TestDistBackendWithSpawn(TestDistBackend, _BASE):
    """Upstream's test_distributed_spawn.py class, plus the runner's bookkeeping."""

    START_METHOD = "spawn"

    def setUp(self):
        super().setUp()
        if self.START_METHOD == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def run_test(self, test_name, parent_pipe):
        # In a rank. A forked rank has the parent's module state: take this test's init file.
        _suite.INIT_METHOD = os.environ.get("INIT_METHOD", _suite.INIT_METHOD)
        # Remember why the test skipped, which upstream only logs.
        fn = getattr(self, test_name)

        def recorded():
            try:
                return fn()
            except unittest.SkipTest as e:
                with open(_skip_file(test_name, self.rank), "w") as f:
                    f.write(str(e))
                raise

        setattr(self, test_name, recorded)
        super().run_test(test_name, parent_pipe)

    def tearDown(self):
        procs = list(self.processes)
        try:
            super().tearDown()  # terminates ranks still running
        finally:
            for p in procs:
                p.join(10)
                if p.exitcode is None:
                    p.kill()
                    p.join(10)
            if os.path.exists(self.file_name):
                os.unlink(self.file_name)


# ---------------------------------------------------------------------------------------------
# Running and reporting (parent only)


def select(args) -> list[str]:
    names = sorted(n for n in dir(_BASE) if n.startswith("test_"))
    if args.tests:
        unknown = [t for t in args.tests if t not in names]
        if unknown:
            raise SystemExit(f"no such tests: {unknown}")
        chosen = list(args.tests)
    elif args.select == "fast":
        ws = int(os.environ["WORLD_SIZE"])
        chosen = FAST_WS8 if ws >= 8 else FAST_WS4 if ws >= 4 else FAST
        chosen = [n for n in chosen if n in names]
    elif args.select == "collectives":
        chosen = [n for n in names if COLLECTIVE_RE.search(n)]
    else:
        chosen = names
    if args.patterns:
        chosen = [n for n in chosen if any(re.search(p, n) for p in args.patterns)]
    return chosen


def error_line(text: str) -> str:
    """The exception line of the (first) traceback in ``text``, else its first line."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            for rest in lines[i + 1:]:
                if rest and not rest.startswith(" "):
                    return rest.strip()
    return next((ln.strip() for ln in lines if ln.strip()), "")


def _shm_entries() -> set[str]:
    d = os.environ.get("TILECOMM_SHM_DIR")
    return set(os.listdir(d)) if d and os.path.isdir(d) else set()


class Result(unittest.TestResult):
    def __init__(self, stream=None, descriptions=None, verbosity=0):
        super().__init__(stream, descriptions, verbosity)
        self.records: dict[str, dict] = {}
        self._t0 = 0.0

    @staticmethod
    def _name(test) -> str:
        return test.id().split(".")[-1]

    def startTest(self, test):
        super().startTest(test)
        self._t0 = time.monotonic()
        for f in os.listdir(RUN_DIR):
            if f.startswith("skip."):
                os.unlink(os.path.join(RUN_DIR, f))

    def _record(self, test, status, reason="", detail=""):
        name = self._name(test)
        rec = {"status": status, "duration_s": round(time.monotonic() - self._t0, 2)}
        if reason:
            rec["reason"] = reason
        if detail:
            rec["detail"] = detail
        if name in LIFTED:
            rec["unlocked"] = LIFTED[name]
        self.records[name] = rec
        print(f"{status.upper():7s} {rec['duration_s']:6.2f}s  {name}"
              + (f"  -- {reason}" if reason else ""), flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        name = self._name(test)
        if reason == TEST_SKIPS["generic"].message:
            ranks = []
            for r in range(int(os.environ["WORLD_SIZE"])):
                try:
                    with open(_skip_file(name, r)) as f:
                        ranks.append(f.read())
                except FileNotFoundError:
                    pass
            if ranks:
                reason = ranks[0]
        self._record(test, "skipped", reason)
        also = [r for r in skip_reasons(name) if r != reason]
        if also:
            self.records[name]["also_skipped_for"] = also

    def _fail(self, test, err, status):
        exc = err[1]
        text = str(exc)
        # A rank's exception arrives as "Process i exited with error code 10 and exception:\n<tb>".
        if "Traceback (most recent call last)" in text:
            line = error_line(text)
        else:
            line = error_line(self._exc_info_to_string(err, test))
        self._record(test, status, line, self._exc_info_to_string(err, test))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._fail(test, err, "failed")

    def addError(self, test, err):
        super().addError(test, err)
        self._fail(test, err, "failed")

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "xfailed", error_line(self._exc_info_to_string(err, test)))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def write_junit(path: str, meta: dict, records: dict) -> None:
    import xml.etree.ElementTree as ET

    counts = meta["counts"]
    suite = ET.Element("testsuite", name=f"pytorch-distributed-{meta['backend']}",
                       tests=str(len(records)), failures=str(counts.get("failed", 0)),
                       skipped=str(counts.get("skipped", 0)), errors="0",
                       time=str(meta["wall_s"]))
    for name, rec in records.items():
        case = ET.SubElement(suite, "testcase", classname="TestDistBackendWithSpawn",
                             name=name, time=str(rec["duration_s"]))
        if rec["status"] == "skipped":
            ET.SubElement(case, "skipped", message=rec.get("reason", ""))
        elif rec["status"] == "failed":
            el = ET.SubElement(case, "failure", message=rec.get("reason", ""))
            el.text = rec.get("detail", "")
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def _kill_leftovers() -> list[int]:
    import multiprocessing

    left = []
    for p in multiprocessing.active_children():
        left.append(p.pid)
        p.kill()
        p.join(5)
    return left


def main(args) -> int:
    try:
        return _main(args)
    finally:
        shm_dir = os.environ.get("TILECOMM_SHM_DIR")
        if shm_dir and os.path.isdir(shm_dir):
            shutil.rmtree(shm_dir, ignore_errors=True)
        shutil.rmtree(RUN_DIR, ignore_errors=True)


def _main(args) -> int:
    TestDistBackendWithSpawn.START_METHOD = args.start_method
    names = select(args)
    if args.list:
        for n in names:
            print(n + (f"   [unlocked: {LIFTED[n]}]" if n in LIFTED else ""))
        return 0
    if not names:
        print("no tests selected", file=sys.stderr)
        return 2
    # A SIGTERM (e.g. from a CI timeout) should still end the ranks and clean up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = Result()
    shm_leaks: dict[str, list[str]] = {}
    t0 = time.monotonic()
    try:
        for name in names:
            before = _shm_entries()
            TestDistBackendWithSpawn(name).run(result)
            new = sorted(_shm_entries() - before)
            if new:
                shm_leaks[name] = new
                result.records[name].setdefault("shm_leaked", new)
    finally:
        leftover_pids = _kill_leftovers()
    wall = round(time.monotonic() - t0, 1)

    counts: dict[str, int] = {}
    for rec in result.records.values():
        counts[rec["status"]] = counts.get(rec["status"], 0) + 1
    meta = {
        "backend": BACKEND,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "selection": args.tests and "tests" or args.select,
        "patterns": args.patterns,
        "start_method": args.start_method,
        "unlock": UNLOCK,
        "features_added": sorted(FEATURES) if BACKEND == "tilecomm" else [],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "wall_s": wall,
        "counts": counts,
        "shm_leaked": shm_leaks,
        "leftover_processes": leftover_pids,
    }
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"\n{BACKEND}: {len(result.records)} tests in {wall} s: {summary}", flush=True)
    if shm_leaks:
        print(f"shared-memory files left behind: {shm_leaks}")
    if leftover_pids:
        print(f"rank processes still alive at the end (killed): {leftover_pids}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "tests": result.records}, f, indent=1, sort_keys=False)
            f.write("\n")
    if args.junit:
        write_junit(args.junit, meta, result.records)
    ok = counts.get("failed", 0) == 0 and not shm_leaks and not leftover_pids
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
