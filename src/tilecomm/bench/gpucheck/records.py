"""One record format for every phase, the verdict, and the text report.

A record is a dict with ``phase``, ``case`` (an id; the bench's case id where there is one),
``world``, and

* a **check** (``ok``: True, False, or None when skipped or not applicable; ``error``;
  ``ranks_failed``; ``seconds``), or
* a **timing** (``us`` or ``ms``: label -> the slowest rank's median; ``errors``: label ->
  why that label has no time). Labels of tilecomm's own code (:func:`ours`) fail the check
  when they error; baselines never do: they say why they did not run.

Verdicts: ``PASS`` every case ran and passed; ``FAIL`` a check failed, a timing of tilecomm's
own code failed, or a world did not finish; ``INCOMPLETE`` nothing failed but the budget
skipped cases; ``CANNOT RUN`` the preflight found that this machine cannot run the check.
"""

from __future__ import annotations

EXIT = {"PASS": 0, "FAIL": 1, "INCOMPLETE": 2, "CANNOT RUN": 3}


def ours(label: str) -> bool:
    """A timing label of tilecomm's own code (not a baseline, not a bound)."""
    return label.startswith(("tilecomm", "fused", "all_reduce/"))


def skipped(text) -> bool:
    return str(text or "").startswith(("skipped", "n/a"))


def checks(res) -> list[dict]:
    return [r for r in res["records"] if "ok" in r]


def timings(res) -> list[dict]:
    return [r for r in res["records"] if "errors" in r]


def summarize(res: dict) -> None:
    """Adds ``correctness_summary``, ``skipped_cases``, ``timing_failed``, ``verdict``."""
    per: dict = {}
    for c in checks(res):
        if c.get("applicable") is False:
            continue
        k = per.setdefault(c.get("kernel", c["case"]), dict(ok=True, worlds={}, errors=[]))
        wv = k["worlds"].setdefault(str(c["world"]), dict(run=0, passed=0, skipped=0))
        if c["ok"] is None:
            wv["skipped"] += 1
            continue
        wv["run"] += 1
        wv["passed"] += int(bool(c["ok"]))
        if not c["ok"]:
            k["ok"] = False
            k["errors"].append(f"{c['case']}: {c['error']}")
    covered = any(p["name"] == "correctness" for p in res.get("phases", []))
    for k in res.get("kernels", []) if covered else []:     # a kernel no phase checked
        e = per.setdefault(k, dict(ok=False, worlds={}, errors=["no correctness case ran"]))
        if not any(v["run"] + v["skipped"] for v in e["worlds"].values()):
            e["ok"] = False
    res["correctness_summary"] = dict(sorted(per.items()))
    skip = sum(w["skipped"] for k in per.values() for w in k["worlds"].values())
    skip += sum(1 for t in timings(res) for e in t["errors"].values()
                if str(e).startswith("skipped"))
    skip += sum(1 for s in res["worlds"].values() if s.startswith("skipped"))
    res["skipped_cases"] = skip
    res["timing_failed"] = [f"{t['case']} {lab}" for t in timings(res)
                            for lab, e in t["errors"].items() if ours(lab) and not skipped(e)]
    ran = [s for s in res["worlds"].values() if not s.startswith("skipped")]
    ok = all(v["ok"] for v in per.values()) and bool(ran) and \
        all(s == "ok" for s in ran) and not res["timing_failed"]
    res["all_correct"] = ok
    res["verdict"] = "FAIL" if not ok else ("INCOMPLETE" if skip else "PASS")


def _f(v, nd=1):
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def text_report(res: dict) -> str:
    pf = res["preflight"]
    lines = [f"gpu_check ({res['env']['mode']}), {res['wall_s']:.0f} s, "
             f"torch {res['env']['torch']}, triton {res['env']['triton']}",
             f"preflight: {pf['summary']}: {pf['verdict']}"]
    for w in pf.get("warnings", []):
        lines.append(f"  warning: {w}")
    for g in (pf.get("nvidia_smi") or {}).get("gpus", []):
        lines.append("GPU: " + ", ".join(f"{k}={v}" for k, v in g.items()))
    mps = res.get("mps") or {}
    if mps.get("status") == "off":
        lines.append("MPS: not used (ranks do not share a GPU, or --mps off)")
    elif mps:
        lines.append(f"MPS: {mps.get('status')} ({mps.get('reason')})"
                     + (f", {mps['percentage']}% of the GPU per rank"
                        if mps.get("percentage") else ""))
        for d in mps.get("detail", [])[-4:]:
            lines.append(f"  {d}")
    for note in res.get("notes", []):
        lines.append(f"note: {note}")
    if pf.get("verdict") != "ok":
        lines += ["", f"RESULT: {pf['verdict']}"]
        return "\n".join(lines)
    lines.append("")
    lines.append("worlds: " + ", ".join(f"{w}: {s}" for w, s in res["worlds"].items()))
    for w, b in (res.get("cta_budget") or {}).items():
        lines.append(f"  CTA budget w{w}: {b['ctas']} per launch ({b['source']}, "
                     f"{b['sharing']} rank(s) per device)")
    lines.append("phases (budget s / spent s per world):")
    for name, per in (res.get("phase_times") or {}).items():
        lines.append(f"  {name:12s} " + "  ".join(f"w{w}: {v['budget_s']}/{v['spent_s']}"
                                                  for w, v in per.items()))
    lines += ["", "correctness (cases passed / run, per kernel and world):"]
    for k, per in res["correctness_summary"].items():
        cells = "  ".join(f"w{w}: {v['passed']}/{v['run']}" +
                          (f" ({v['skipped']} skipped)" if v["skipped"] else "")
                          for w, v in per["worlds"].items())
        lines.append(f"  {'PASS' if per['ok'] else 'FAIL'} {k:30s} {cells}")
        for e in per["errors"][:3]:
            lines.append(f"       {e}")
    lines += _timing_lines(res)
    from .overlap import text_lines
    lines += text_lines([r for r in res["records"] if r["phase"] == "overlap"])
    lines += _moe_lines(res)
    from .kv import text_lines as kv_lines
    lines += kv_lines([r for r in res["records"] if r["phase"] == "kv"])
    lines += _latency_lines(res)
    prof = res.get("profile")
    if prof:
        lines += ["", f"profile (ncu): {prof.get('status')}"]
        for k in prof.get("kernels", [])[:12]:
            lines.append("  " + ", ".join(f"{a}={b}" for a, b in k.items()))
    lines.append("")
    v = res["verdict"]
    why = {"PASS": "every case ran and passed",
           "FAIL": "failures: " + ", ".join(k for k, p in res["correctness_summary"].items()
                                            if not p["ok"]) +
                   (f"; timing failed: {', '.join(res['timing_failed'][:4])}"
                    if res["timing_failed"] else "") +
                   "; worlds: " + ", ".join(f"{w} {s}" for w, s in res["worlds"].items()
                                            if s != "ok"),
           "INCOMPLETE": f"no failure, but {res['skipped_cases']} cases skipped "
                         f"(budget spent)"}[v]
    lines.append(f"RESULT: {v}: {why} ({len(res.get('kernels', []))} kernels)")
    return "\n".join(lines)


def _timing_lines(res) -> list[str]:
    rows = [t for t in res["records"] if t["phase"] == "timing" and "us" in t]
    if not rows:
        return []
    lines = ["", "timing, float32 sum (us per call: slowest rank, median round; bound: the "
                 "bytes all ranks move through one HBM over the device copy rate, or NVLink "
                 "between GPUs; (x): baseline time / tilecomm time, > 1: tilecomm faster; "
                 "same device: kernels and one HBM, not NVLink):"]
    for t in rows:
        us = t["us"].get("tilecomm")
        base = "  ".join(f"{lab} {v:.1f} ({t.get('speedup', {}).get(lab, 0):.2f}x)"
                         for lab, v in t["us"].items() if lab != "tilecomm")
        frac = t.get("frac_of_bound")
        lines.append(f"  {t['case']:48s} {_f(us):>10s}  bound {_f(t.get('bound_us')):>9s}"
                     f" {(f'{100 * frac:.0f}%' if frac else '-'):>5s}  {base}")
        for lab, e in t["errors"].items():
            if not (lab != "tilecomm" and skipped(e)):
                lines.append(f"  {'':48s} {lab}: {e}")
    reasons = {lab: e for t in rows for lab, e in t["errors"].items()
               if lab != "tilecomm" and skipped(e)}
    for lab, e in reasons.items():
        lines.append(f"  ({lab}: {e})")
    return lines


def _moe_lines(res) -> list[str]:
    rows = [t for t in res["records"] if t["phase"] == "moe" and "ms" in t]
    if not rows:
        return []
    lines = ["", "MoE dispatch/combine (ms, slowest rank; speedup: NCCL layer / tilecomm, "
                 "dispatch + combine):"]
    for t in rows:
        cells = "  ".join(f"{k}: {v:.3f}" for k, v in t["ms"].items())
        sp = t.get("speedup")
        lines.append(f"  {t['case']:52s} {cells}" + (f"  speedup {sp:.2f}x" if sp else ""))
        for lab, e in t["errors"].items():
            lines.append(f"  {'':52s} {lab}: {e}")
    return lines


def _latency_lines(res) -> list[str]:
    lines = []
    for t in res["records"]:
        if t["phase"] == "latency":
            lines += ["", f"8 KB latency, {t['world']} ranks (us per call, slowest rank, "
                          f"{t['iters']} calls):"]
            for k, v in t["us"].items():
                lines.append(f"  {k:48s} {_f(v)}")
            for k, e in t["errors"].items():
                lines.append(f"  {k:48s} {e}")
        if t["phase"] == "graph":
            gv = t.get("us_per_replay_slowest_rank") or t.get("error") or \
                ("ok" if t.get("ok") else "-")
            lines.append(f"  {'all_reduce in a CUDA graph (replay), w' + str(t['world']):48s}"
                         f" {_f(gv)}")
    return lines
