"""``tilecomm model``: the training/inference breakdown, ``--search`` table, ``--plot``, ``--json``.

    tilecomm model llama3-70b --system dgx-h100 --gpus 1024 --tp 8 --pp 4 --global-batch 1024
    tilecomm model llama3-70b --system dgx-h100 --nodes 128 --search --top 10
    tilecomm model deepseek-v3 --system dgx-h100 --gpus 32 --tp 8 --dp 4 --ep 4 --mode decode
    tilecomm model llama3-70b --system gb200-nvl72 --gpus 256 --tp 2 --pp 4   # 4 racks x 64
"""

from __future__ import annotations

import json

from .layout import Layout
from .models import model_names


def add_model_parser(sub) -> None:
    from ..helpfmt import HelpFormatter

    p = sub.add_parser("model", help="parallelism workload model (training / inference)",
                       formatter_class=HelpFormatter,
                       description="Step time, exposed communication per parallelism, memory "
                                   "and the best layouts for a model on a cluster, with "
                                   "collectives timed by tilecomm's simulator.")
    p.add_argument("model", help=f"preset ({', '.join(model_names())}) or a model .json")
    p.add_argument("--system", default="dgx-h100", help="system preset or .json")
    p.add_argument("--gpus", type=int, default=None, help="GPUs (default: --nodes x node)")
    p.add_argument("--nodes", type=int, default=None, help="nodes (instead of --gpus)")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="training: GPUs used per node or rack (default: all of it, or for a "
                        "GPU count that does not fill whole racks the largest multiple of 8 "
                        "that divides it, e.g. 64 of a GB200 NVL72's 72)")
    for k, h in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context"), ("ep", "expert")):
        p.add_argument(f"--{k}", type=int, default=1, help=f"{h} parallel size")
    p.add_argument("--dp", type=int, default=None, help="data parallel (default: the rest)")
    p.add_argument("--vpp", type=int, default=1, help="model chunks per pipeline rank")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (with tp > 1)")
    p.add_argument("--tp-overlap", action="store_true", help="overlap TP comm with GEMMs")
    p.add_argument("--ep-overlap", action="store_true",
                   help="hide EP all_to_all behind another micro-batch (DualPipe-style)")
    p.add_argument("--no-dp-overlap", action="store_true", help="DP comm after backward")
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per step (default: 1 per GPU)")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096, help="training sequence length")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp8"], default="bf16")
    p.add_argument("--kernels", choices=["fused", "eager"], default="fused",
                   help="training: element-wise kernels fused (Megatron-LM/Transformer Engine, "
                        "torch.compile) or eager PyTorch ops")
    p.add_argument("--mode", choices=["train", "prefill", "decode", "serve"], default="train")
    p.add_argument("--batch", type=int, default=None, help="inference: concurrent requests")
    p.add_argument("--prompt", type=int, default=2048, help="inference: prompt tokens")
    p.add_argument("--gen", type=int, default=256, help="inference: generated tokens")
    p.add_argument("--kv-block-size", type=int, default=16,
                   help="serve: tokens per KV-cache block (the engine moves whole blocks)")
    p.add_argument("--kv-run-blocks", type=float, default=None,
                   help="serve: average run of blocks contiguous on both sides (default: the "
                        "request's blocks are contiguous, one transfer per layer and K/V)")
    p.add_argument("--search", action="store_true", help="rank all valid layouts")
    p.add_argument("--top", type=int, default=10, help="rows of the --search table")
    p.add_argument("--plot", default=None, help="write a PNG (stacked bars + timeline)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run_model)


def _gpus(args, gpn: int) -> int:
    if args.gpus_per_node is not None:
        if args.gpus_per_node < 1:
            raise ValueError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")
        if args.gpus_per_node > gpn:
            raise ValueError(f"--gpus-per-node {args.gpus_per_node} exceeds the {gpn} GPUs of "
                             "one node")
        gpn = args.gpus_per_node
    if args.gpus is not None and args.nodes is not None and args.gpus != args.nodes * gpn:
        raise ValueError(f"--gpus {args.gpus} and --nodes {args.nodes} disagree "
                         f"({args.nodes} x {gpn} GPUs per node)")
    if args.gpus is not None:
        g = args.gpus
    elif args.nodes is not None:
        g = args.nodes * gpn
    else:
        g = gpn
    if g < 1:
        raise ValueError(f"--gpus must be >= 1, got {g}")
    return g


def _layout(args, gpus: int, infer: bool) -> Layout:
    base = args.tp * args.pp * args.cp
    dp = args.dp
    if dp is None:
        if gpus % base:
            raise ValueError(f"tp*pp*cp = {base} does not divide the {gpus} GPUs")
        dp = gpus // base
    return Layout(tp=args.tp, pp=args.pp, dp=dp, cp=args.cp, ep=args.ep, vpp=args.vpp,
                  zero=args.zero, sp=args.sp, tp_overlap=args.tp_overlap,
                  ep_overlap=args.ep_overlap, dp_overlap=not args.no_dp_overlap,
                  recompute=args.recompute)


def run_model(args) -> int:
    from .comm import spec_of
    from .models import load_model
    for k in ("top", "seq", "micro_batch", "prompt", "batch", "global_batch"):
        v = getattr(args, k)
        if v is not None and v < 1:
            raise ValueError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
    if args.gen < 0:
        raise ValueError(f"--gen must be >= 0, got {args.gen}")
    model = load_model(args.model)
    spec = spec_of(args.system)
    gpus = _gpus(args, spec.gpus_per_node)
    if args.mode == "train":
        gb = args.global_batch if args.global_batch is not None else gpus
        if args.search:
            from .search import search_train
            results = search_train(model, args.system, gpus, gb, args.seq, args.dtype,
                                   zero=args.zero, tp_overlap=args.tp_overlap,
                                   ep_overlap=args.ep_overlap,
                                   gpus_per_node=args.gpus_per_node, kernels=args.kernels)
        else:
            from .training import train_step
            results = [train_step(model, args.system, gpus, _layout(args, gpus, False), gb,
                                  args.micro_batch, args.seq, args.dtype,
                                  gpus_per_node=args.gpus_per_node, kernels=args.kernels)]
    else:
        if args.gpus_per_node is not None and args.gpus_per_node != spec.gpus_per_node:
            raise ValueError("--gpus-per-node (a partly used node) is modeled for training "
                             "only")
        if args.search:
            from .search import search_infer
            batch = args.batch if args.batch is not None else 8 * gpus
            results = search_infer(model, args.system, gpus, batch,
                                   args.prompt, args.gen, args.mode, args.dtype)
        else:
            from .inference import infer
            L = _layout(args, gpus, True)
            batch = args.batch if args.batch is not None else L.dp * L.pp * 8
            results = [infer(model, args.system, L, batch,
                             args.prompt, args.gen, args.mode, args.dtype,
                             kv_block_size=args.kv_block_size,
                             kv_run_blocks=args.kv_run_blocks)]
    shown = results[:args.top] if args.search else results
    if args.json:
        print(json.dumps([r.as_dict() for r in shown] if args.search else shown[0].as_dict(),
                         indent=1))
    else:
        from .report import print_report
        print_report(shown, search=args.search, total=len(results))
    if args.plot:
        from .plot import plot_step
        plot_step(shown[:8], args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0
