"""``tilecomm``: the command line.

    tilecomm bench all_reduce -n 2 -b 8 -e 256M -f 4 [--algo NAME|all] [--check] [--vs gloo]
    tilecomm sim all_reduce --system dgx-h100 -b 1K -e 8G -f 2
    tilecomm topo [--system NAME]
    tilecomm model llama3-70b --system dgx-h100 --gpus 1024 --tp 8 --pp 4 [--search] [--plot F]
    tilecomm trace analyze DIR [--json] | tilecomm trace merge DIR -o FILE
    tilecomm doctor [--device]
    tilecomm hosts run --hosts 2 --per-host 2 -- train.py   (simulated hosts, torchrun in each)
"""

from __future__ import annotations

import argparse
import sys

from .errors import CommError
from .helpfmt import HelpFormatter
from .units import parse_size, sizes


def _description(doc: str) -> str:
    """The first line of a module docstring as plain text (no reST ``literal`` markup)."""
    return doc.splitlines()[0].replace("``", "")


def add_bench_parser(sub) -> None:
    from .bench.cases import CASES
    from .bench.harness import MAX_SPREAD

    p = sub.add_parser("bench", help="nccl-tests-style benchmark on local ranks",
                       formatter_class=HelpFormatter,
                       description="Time a collective, MoE dispatch/combine, KV-cache transfer "
                                   "or the fused ops on local ranks, with baselines in the same "
                                   "run (time = slowest rank, median round; spread = slowest "
                                   "round / fastest; x B = B's time / tilecomm's, above 1: "
                                   "tilecomm faster). size = bytes of the largest buffer, "
                                   "rounded to whole elements per rank.")
    p.add_argument("op", choices=list(CASES) + ["kv", "moe", "ops"],
                   help="a collective, kv: KV-cache transfer (tilecomm.kv), moe: MoE "
                        "dispatch/combine (tilecomm.moe), or ops: the fused ops "
                        "(tilecomm.ops); their options below")
    p.add_argument("-n", "--nranks", type=int, default=2, help="number of local ranks")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (8, 1K, 256M, ...)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier per step")
    p.add_argument("-d", "--dtype", default=None,
                   help="float32 float64 float16 bfloat16 int32 int64 (uint8 int8: no "
                        "reduction); default float32 (kv, moe: bfloat16)")
    p.add_argument("--algo", default="auto", help="algorithm, 'auto' (tuner) or 'all'")
    p.add_argument("--mem", choices=["user", "heap"], default="user",
                   help="user: ordinary tensors (staged through scratch); heap: comm.alloc "
                        "(with --device cuda: comm.alloc(..., device='cuda'), zero copy)")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda (rank r on cuda:{r %% device_count}; one visible GPU: all "
                        "ranks share it) or cuda:N (every rank on GPU N); CUDA tensors run "
                        "the Triton kernels")
    p.add_argument("--redop", default="sum", choices=["sum", "prod", "min", "max", "avg"],
                   help="reduction of all_reduce, reduce_scatter and reduce")
    p.add_argument("--iters", type=int, default=None,
                   help="calls per timed round (collectives: chosen per size; ops: 1)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls per size")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (median reported)")
    p.add_argument("--max-spread", type=float, default=MAX_SPREAD,
                   help="a time whose rounds disagree by more than this (slowest round / "
                        "fastest) is marked noisy (* in the table, noisy in the JSON)")
    p.add_argument("-c", "--check", action="store_true", help="check results (#wrong)")
    p.add_argument("--vs", action="append", default=[], choices=["gloo", "python", "staged"],
                   help="baseline measured in the same run, interleaved round by round: gloo "
                        "(torch.distributed), python (tilecomm with the native runner off), "
                        "staged (tilecomm with single-copy reads off); repeat for several")
    p.add_argument("--no-bound", action="store_true", help="skip the memory-bandwidth bound")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic mode: rank-order bits for every reduction "
                        "(TILECOMM_DETERMINISTIC)")
    p.add_argument("--hosts", type=int, default=None,
                   help="run the ranks on this many simulated hosts (torchrun in private "
                        "namespaces, tilecomm hosts run); Gloo baselines stay flat over all ranks")
    p.add_argument("--per-host", default=None,
                   help="with --hosts: ranks per host, one count or one per host (default: "
                        "-n split evenly)")
    p.add_argument("--json", default=None, help="write rows as JSON")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="every rank writes a Chrome trace to DIR (TILECOMM_TRACE), merged into "
                        "DIR/trace.json (tracing slows the calls it times)")
    k = p.add_argument_group("kv (tilecomm bench kv): prefill ranks 0..n/2-1 push to decode "
                             "ranks n/2..n-1, against one Gloo send/recv per (layer, block), "
                             "bare Gloo streaming the bytes, and memcpy of a request")
    k.add_argument("--layers", type=int, default=32)
    k.add_argument("--blocks", type=int, default=1024, help="blocks per rank's cache")
    k.add_argument("--block-size", type=int, default=16, help="tokens per block")
    k.add_argument("--kv-heads", type=int, default=8)
    k.add_argument("--head-dim", type=int, default=128)
    k.add_argument("--request-blocks", type=int, default=64, help="blocks per request")
    k.add_argument("--requests", type=int, default=4, help="requests in flight per pair")
    k.add_argument("--fragmented", action="store_true",
                   help="random block ids on both sides (default: one run per request)")
    k.add_argument("--whole-request", action="store_true",
                   help="one push per request (default: one per layer, as prefill makes them)")
    m = p.add_argument_group("moe (tilecomm bench moe): ExpertParallel dispatch + combine with "
                             "identity experts, against permute + Gloo all_to_all_single and "
                             "tilecomm all_to_all_v on the same routing")
    m.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    m.add_argument("--hidden", type=int, default=7168)
    m.add_argument("--topk", type=int, default=8)
    m.add_argument("--experts", type=int, default=64)
    m.add_argument("--mode", choices=["normal", "low_latency"], default="normal")
    m.add_argument("--fp8", action="store_true", help="dispatch rows as float8 e4m3 + scales")
    o = p.add_argument_group("ops (tilecomm bench ops): the fused ops against the collective "
                             "then the matmul, and the matmul alone")
    o.add_argument("--fused", default="all_gather_matmul,matmul_reduce_scatter",
                   help="fused ops, comma separated")
    o.add_argument("--gemm", default="256x1024x1024",
                   help="MxKxN (m rows per rank), comma separated for several")
    p.set_defaults(func=run_bench)


def _bench_hosts(args) -> list[int] | None:
    """Ranks per simulated host from ``--hosts``/``--per-host`` (None: one host)."""
    if not args.hosts:
        return None
    from .simhosts import parse_per_host
    if args.per_host is None and args.nranks % args.hosts:
        raise ValueError(f"--hosts {args.hosts} does not divide -n {args.nranks}; give "
                         f"--per-host")
    hosts = parse_per_host(args.hosts, args.per_host or str(args.nranks // args.hosts))
    if sum(hosts) != args.nranks:
        raise ValueError(f"--per-host {args.per_host} makes {sum(hosts)} ranks, -n says "
                         f"{args.nranks}")
    return hosts


def _bench_moe(args):
    from .bench.moe import MoEBenchConfig, table

    return MoEBenchConfig(world_size=args.nranks, hosts=_bench_hosts(args), tokens=args.tokens,
                          hidden=args.hidden, topk=args.topk, experts=args.experts,
                          mode=args.mode, fp8=args.fp8, rounds=args.rounds,
                          dtype=args.dtype or "bfloat16", bound=not args.no_bound,
                          max_spread=args.max_spread), table


def _bench_kv(args):
    from .bench.kv import KVBenchConfig, table

    return KVBenchConfig(world_size=args.nranks, hosts=_bench_hosts(args), layers=args.layers,
                         blocks=args.blocks, block_size=args.block_size,
                         kv_heads=args.kv_heads, head_dim=args.head_dim,
                         request_blocks=args.request_blocks, requests=args.requests,
                         rounds=args.rounds, fragmented=args.fragmented,
                         layerwise=not args.whole_request, dtype=args.dtype or "bfloat16",
                         max_spread=args.max_spread), table


def _bench_ops(args):
    from .bench.ops import OpsBenchConfig, parse_gemm, table

    cfg = OpsBenchConfig(world_size=args.nranks, hosts=_bench_hosts(args),
                         ops=[x.strip() for x in args.fused.split(",")],
                         shapes=parse_gemm(args.gemm), dtype=args.dtype or "float32",
                         iters=args.iters or 1, rounds=args.rounds,
                         max_spread=args.max_spread)
    title = f"tilecomm ops: {args.nranks} ranks, {cfg.dtype}, {cfg.iters} call(s) per round"
    return cfg, lambda rows: table(rows, title)


def _bench_collective(args):
    from .bench import BenchConfig
    from .bench.runner import table

    args.dtype = args.dtype or "float32"
    hosts = _bench_hosts(args)
    cfg = BenchConfig(hosts=hosts, op=args.op, world_size=args.nranks,
                      sizes=sizes(parse_size(args.minbytes), parse_size(args.maxbytes),
                                  args.stepfactor),
                      dtype=args.dtype, algos=[a.strip() for a in args.algo.split(",")],
                      mem=args.mem, iters=args.iters, warmup=args.warmup, rounds=args.rounds,
                      check=args.check, vs=args.vs, bound=not args.no_bound,
                      device=args.device, redop=args.redop, deterministic=args.deterministic,
                      trace=args.trace, max_spread=args.max_spread)
    where = f" on {len(hosts)} simulated hosts ({'+'.join(map(str, hosts))})" if hosts else ""
    title = (f"tilecomm {args.op}: {args.nranks} ranks{where}, {args.dtype}, {args.mem} "
             f"memory, {args.device}{', deterministic' if args.deterministic else ''}")
    return cfg, lambda rows: table(rows, title)


def run_bench(args) -> int:
    """Every bench through one harness (tilecomm.bench.harness): build its config, run its
    cases with a progress bar, print its table, write its rows; exit 1 on wrong results."""
    from rich.console import Console
    from rich.progress import Progress

    from .bench import harness, runner
    from .bench.report import write_json

    make = {"kv": _bench_kv, "moe": _bench_moe, "ops": _bench_ops}.get(args.op,
                                                                      _bench_collective)
    cfg, render = make(args)
    console = _console()
    with Progress(console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task(f"{args.op} on {args.nranks} ranks", total=None)

        def progress(done, total, label):
            prog.update(task, completed=done, total=total, description=label)

        rows = runner.run(cfg, progress) if make is _bench_collective else \
            harness.run(cfg, progress)
    console.print(render(rows))
    slow = [r for r in rows if r.get("machine_slow")]
    if slow:
        from .bench.machine import SLOW_RATIO
        console.print(f"[bold]warning:[/bold] this launch ran in the machine's slow state "
                      f"(rewriting memory a peer core read: x{slow[0]['machine_ratio']:.0f} a "
                      f"local copy, slow above x{SLOW_RATIO:g}): the times above are not "
                      f"representative; rerun later (NOTE [the slow launch], bench/machine.py)")
    if args.json:
        write_json(rows, args.json)
        console.print(f"wrote {len(rows)} row{'s' if len(rows) != 1 else ''} to {args.json}")
    if args.trace:
        import os
        console.print(f"wrote the ranks' traces to {args.trace}; merged: "
                      f"{os.path.join(args.trace, 'trace.json')} (open it in Perfetto)")
    wrong = sum(r.get("wrong", 0) or 0 for r in rows)
    return 1 if wrong else 0


def _console():
    """Wide tables when the output is a file or a CI log (rich assumes 80 columns there)."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=200)


def add_doctor_parser(sub) -> None:
    p = sub.add_parser("doctor", help="settings, versions, and a 2-rank self-test",
                       formatter_class=HelpFormatter,
                       description="Versions, settings and a 2-rank all_reduce self-test; "
                                   "with --device, the GPU check's preflight too. Exit "
                                   "status: 0 all well; 1 the self-test failed, or --device "
                                   "found that the GPU path cannot run here (no CUDA device "
                                   "included); 2 bad arguments.")
    p.add_argument("--device", action="store_true",
                   help="run the GPU check's preflight (tilecomm.bench.gpucheck.preflight: the "
                        "CUDA device, the driver against Triton's ptxas, compute and MIG "
                        "modes, peer access, tools) and print what it finds")
    p.set_defaults(func=run_doctor)


def _doctor_device(c) -> bool:
    """The GPU check's preflight, printed; True if it found nothing that stops the GPU path.
    The preflight is the one ``scripts/gpu_check.py`` runs (its probe is a subprocess, so
    this process never initializes CUDA)."""
    from rich.markup import escape

    from .bench.gpucheck import preflight as gpu_preflight

    pf = gpu_preflight.preflight(False)
    if not (pf.get("probe") or {}).get("cuda_available"):
        c.print("device: no CUDA device on this machine: the GPU kernels cannot run here "
                "(the CPU collectives and the Triton interpreter still do)")
    # the preflight's words come from the machine (tool output, paths): brackets in them
    # are text, not rich markup
    c.print(f"device preflight: {escape(pf['summary'])}: {escape(pf['verdict'])}")
    for w in pf["warnings"]:
        c.print(f"  warning: {escape(w)}")
    return not pf["problems"]


def _doctor_check(comm):
    import torch

    from .heap.base import SegmentLayout
    t = torch.full((1000,), float(comm.rank + 1))
    comm.all_reduce(t)          # after it, every rank has published its start-up probe
    ch = comm.host.backend.executor.ch
    return float(t[0]), max(int(ch.slots[r][SegmentLayout.CMA]) for r in range(comm.world_size))


def run_doctor(args) -> int:
    import os
    import platform

    import numpy
    import torch
    from rich.markup import escape
    from rich.table import Table

    from . import __version__, launch
    from .settings import describe, settings

    c = _console()
    c.print(f"tilecomm {__version__}, Python {platform.python_version()}, torch "
            f"{torch.__version__}, numpy {numpy.__version__}, {os.cpu_count()} CPUs")
    st = os.statvfs(settings().shm_dir)
    c.print(f"{settings().shm_dir}: {st.f_bavail * st.f_frsize >> 20} MiB free")
    import importlib.util

    import torch.distributed as dist
    if importlib.util.find_spec("triton") is None:
        c.print("triton: not installed (the device API and GPU kernels need it: pip install "
                "'tilecomm[gpu]')")
    else:
        import importlib.metadata as md
        cuda = "CUDA available" if torch.cuda.is_available() else "no CUDA: interpreter only"
        c.print(f"triton {md.version('triton')}: device API and GPU kernels usable ({cuda})")
    from .backends.cpu import native
    if native._native is None:
        c.print("native runner: not built (no C compiler at install time?): CPU collectives "
                "run on the Python path, about 4x slower per small call")
    else:
        c.print(f"native runner: built, {'on' if native.enabled() else 'off (TILECOMM_NATIVE=0)'}")
    registered = dist.is_available() and "TILECOMM" in dist.Backend._plugins
    c.print(f"torch.distributed backend 'tilecomm': {'registered' if registered else 'MISSING'}")
    t = Table("variable", "value", "meaning", header_style="bold")
    for row in describe():
        # rich reads "[word ...]" as a style tag and drops it; the meanings cite NOTEs as
        # "NOTE [co-residency]", and a value may hold brackets too: print them as text
        t.add_row(*(escape(cell) for cell in row))
    c.print(t)
    from .bench.machine import describe, probe, verdict
    c.print(describe(verdict(launch(probe, 2, timeout=20))))
    got = launch(_doctor_check, 2, timeout=20)
    ok = [v for v, _ in got] == [3.0, 3.0]
    c.print(f"2-rank all_reduce self-test: {'ok' if ok else f'FAILED {got}'}")
    from .backends.cpu.cma import SINGLE_COPY_OVERSUBSCRIBED, SINGLE_COPY_YES
    state = max(s for _, s in got)
    if state == SINGLE_COPY_YES:
        c.print("single-copy reads (process_vm_readv): on; broadcast, all_gather and "
                "all_to_all read peers' tensors in place")
    else:
        why = ("off (TILECOMM_CMA=0)" if not settings().cma else
               "not used (more ranks than CPUs)" if state == SINGLE_COPY_OVERSUBSCRIBED else
               "not allowed here (ptrace rights: a seccomp filter, a container, or Yama "
               "ptrace_scope 2-3)")
        c.print(f"single-copy reads (process_vm_readv): {why}; every tensor is staged "
                f"through shared memory (broadcast and all_gather 1.1-2.3x slower from 16 KiB on 2 ranks)")
    if args.device:
        ok = _doctor_device(c) and ok
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tilecomm", description=_description(__doc__))
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    from .sim.cli import add_sim_parser, add_topo_parser
    add_sim_parser(sub)
    add_topo_parser(sub)
    from .workloads.cli import add_model_parser
    add_model_parser(sub)
    from .debug.cli import add_trace_parser
    add_trace_parser(sub)
    add_doctor_parser(sub)
    from .tuning.cli import add_tune_parser
    add_tune_parser(sub)
    from .simhosts import add_hosts_parser
    add_hosts_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"tilecomm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except CommError as e:   # a rank failed: its first line says what; the traceback is noise
        print(f"tilecomm {args.command}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
