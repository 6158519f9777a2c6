"""``tilecomm trace analyze DIR``: which rank is at fault, at which call, and why.

Reads every ``flight-rank{R}.json`` in DIR (``flight.py``) and, per communicator, walks the
sequence numbers up from the oldest one every rank still holds. The first number where the
ranks do not all hold the same completed call is the divergence; there:

* a rank whose call differs from the majority's (collective, dtype, bytes, root, algorithm)
  **arrived at another collective**; a rank that refused its call **rejected** it;
* a rank with a dump but no record at that number **never arrived** (its last call says where
  it is: finished, or stuck in an earlier call or a send/recv);
* a rank without a dump **died** when a waiter saw its process exit, else it **stalled** (a
  stopped or hung process cannot answer SIGUSR1); the waiters' records name who they were
  waiting for, and the world size says which dumps are missing;
* every other rank's record there says what it was waiting for (ranks and phase) and how it
  ended.

:func:`analyze` returns one dict (``--json`` prints it): ``culprits`` (sorted ranks), ``op``,
``seq``, ``explanation`` (one paragraph), ``faults`` (rank -> kind), ``waiting`` (rank -> what
it waited for), ``ranks`` (rank -> its state), ``missing_dumps``, ``group``, ``world_size``.
"""

from __future__ import annotations

import re

from .flight import FORMAT, REJECTED

_EXITED = re.compile(r"rank\(s\) \[([\d, ]+)\] exited")


def load(directory: str) -> dict[int, dict]:
    """The dumps in ``directory`` (file rank -> document)."""
    from . import load_rank_files

    def valid(doc):
        if doc.get("format") != FORMAT:
            return (f"not a tilecomm flight record (format {doc.get('format')!r}, expected "
                    f"{FORMAT!r})")
        return None
    return load_rank_files(directory, "flight-rank", valid,
                           f"run with TILECOMM_DEBUG_DIR={directory}")


def _signature(rec: dict) -> tuple:
    """What every rank must agree on at one sequence number."""
    op = rec["op"]
    nbytes = None if op == "all_to_all_v" else rec["bytes"]   # v: per-rank sizes differ
    root = rec["root"] if op in ("broadcast", "reduce") else None
    return (op, rec["dtype"], nbytes, root, rec["algorithm"])


def _rejected(rec: dict) -> bool:
    """This rank refused its own call (bad argument)."""
    return rec["state"] == "failed" and (rec["error"] or "").startswith(REJECTED)


def _show(rec: dict | None) -> str:
    if rec is None:
        return "no call recorded"
    what = _desc(rec)
    state = rec["state"]
    if state == "waiting" and rec["wait"]:
        state = f"waiting for {_ranks(rec['wait']['ranks'])} ({rec['wait']['phase']})"
    elif state == "failed":
        state = f"failed: {_first_line(rec['error'])}"
    return f"{what}, {state}"


def _desc(rec: dict) -> str:
    """The call itself: ``broadcast #2 (direct, float32, 32 B)``."""
    what = rec["op"] + ("" if rec["seq"] is None else f" #{rec['seq']}")
    if rec["peers"]:
        what += f" with rank {rec['peers'][0]}"
    extra = [x for x in (rec["algorithm"], rec["dtype"]) if x]
    if rec["bytes"] is not None:
        extra.append(f"{rec['bytes']} B")
    if extra:
        what += f" ({', '.join(extra)})"
    return what


def _ranks(ranks) -> str:
    """``rank 1`` or ``ranks 0, 2``."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _first_line(text: str | None) -> str:
    text = (text or "").strip()
    return text.splitlines()[0] if text else ""


def _now_doing(recs: list[dict]) -> dict | None:
    """The call a rank was in when it dumped: its newest open record, else its newest one."""
    if not recs:
        return None
    newest = max(recs, key=lambda r: r["issued_ns"])
    open_ = [r for r in recs if r["state"] in ("issued", "waiting")]
    return max(open_, key=lambda r: r["issued_ns"]) if open_ else newest


def _groups(dumps: dict[int, dict]) -> dict[int, dict[int, dict]]:
    """Communicator id -> its rank -> that rank's part of the dump."""
    out: dict[int, dict[int, dict]] = {}
    for doc in dumps.values():
        for c in doc["comms"]:
            out.setdefault(c["id"], {})[c["rank"]] = dict(c, host=doc["host"], pid=doc["pid"],
                                                          reason=doc["reason"])
    return out


def analyze(directory: str) -> dict:
    """The verdict for the dumps in ``directory`` (see the module docstring)."""
    dumps = load(directory)
    world = max(d["world_size"] for d in dumps.values())
    groups = _groups(dumps)
    if not groups:
        missing = sorted(set(range(world)) - set(dumps))
        return _verdict(missing, None, None, None, world, missing, {}, {},
                        {r: "died or stalled (no dump)" for r in missing},
                        "no communicator was recorded in the dumps" +
                        (f"; rank(s) {missing} left no dump" if missing else ""))
    results = [_analyze_group(gid, ranks, world if gid == min(groups) else None)
               for gid, ranks in sorted(groups.items())]
    for res in results:            # the first communicator that diverged
        if res["culprits"]:
            return res
    return results[0]


def _analyze_group(gid: int, parts: dict[int, dict], world_hint: int | None) -> dict:
    world = max([p["world_size"] for p in parts.values()] + [world_hint or 0])
    have = set(parts)
    missing = sorted(set(range(world)) - have)
    all_recs = {r: p["records"] for r, p in parts.items()}
    ordered = {r: {x["seq"]: x for x in recs if x["seq"] is not None}
               for r, recs in all_recs.items()}
    doing = {r: _now_doing(recs) for r, recs in all_recs.items()}
    states = {r: _show(doing[r]) for r in sorted(have)}
    for r in missing:
        states[r] = "no dump"
    seqs = [s for recs in ordered.values() for s in recs]
    if not seqs:
        faults = {r: "died or stalled (no dump)" for r in missing}
        return _verdict(missing, None, None, gid, world, missing, {}, states, faults,
                        "no calls were recorded" + (f"; rank(s) {missing} left no dump (died "
                                                    f"or stalled)" if missing else ""))
    # the oldest number every rank with records still holds (rings drop the oldest)
    lo = max(min(recs) for recs in ordered.values() if recs) if all(ordered.values()) \
        else min(seqs)
    hi = max(seqs)
    for s in range(lo, hi + 1):
        present = {r: ordered[r][s] for r in have if s in ordered[r]}
        absent = sorted(have - set(present))
        sigs = {_signature(x) for x in present.values()}
        if not absent and len(sigs) == 1 and all(x["state"] == "completed"
                                                 for x in present.values()):
            continue         # every rank (and so every missing one too) finished this call
        return _divergence(gid, world, s, present, absent, missing, ordered, doing, states)
    faults = {r: "died or stalled (no dump)" for r in missing}
    text = (f"no divergence: the ranks with dumps all completed every call up to #{hi}"
            + (f"; rank(s) {missing} left no dump (died or stalled after #{hi})"
               if missing else "; the job is not stuck in a tilecomm call they recorded"))
    return _verdict(missing, None, hi if missing else None, gid, world, missing, {}, states,
                    faults, text)


def _divergence(gid, world, s, present, absent, missing, ordered, doing, states) -> dict:
    faults: dict[int, str] = {}
    notes: list[str] = []
    rejected = sorted(r for r, x in present.items() if _rejected(x))
    for r in rejected:
        faults[r] = "rejected its call"
        notes.append(f"rank {r} rejected its call {_desc(present[r])}: "
                     f"{_first_line(present[r]['error'][len(REJECTED):])}")
    by_sig: dict[tuple, list[int]] = {}
    for r, x in sorted(present.items()):
        if r not in rejected:
            by_sig.setdefault(_signature(x), []).append(r)
    ref_sig, ref = None, []
    if by_sig:
        # the majority's call is the reference; a tie goes to the group of the lowest rank
        ref_sig, ref = max(by_sig.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
        tie = sum(1 for v in by_sig.values() if len(v) == len(ref)) > 1
        for sig, ranks in by_sig.items():
            if sig == ref_sig:
                continue
            for r in ranks:
                faults[r] = "arrived at another collective"
            notes.append(f"{_ranks(ranks)} called {_desc(present[ranks[0]])} while "
                         f"{_ranks(ref)} called {ref_sig[0]} #{s}"
                         + (" (no majority: rank "f"{ref[0]}'s call is taken as the "
                            "reference)" if tie else ""))
    op = ref_sig[0] if ref_sig else (present[rejected[0]]["op"] if rejected else None)
    for r in absent:
        last = max(ordered[r]) if ordered[r] else None
        faults[r] = "never arrived"
        where = _show(ordered[r][last]) if last is not None else "no call recorded"
        now = doing[r]
        if now is not None and now["seq"] is None and now["state"] in ("issued", "waiting"):
            where += f"; it is now in {_show(now)}"
        notes.append(f"rank {r} never arrived at #{s}: its last call was {where}")
    waiting: dict[int, str] = {}
    named: set[int] = set()
    exited: set[int] = set()
    for r, x in sorted(present.items()):
        if x["state"] == "completed" or r in faults:
            continue
        w = x["wait"]
        text = ""
        if w:
            named.update(w["ranks"])
            text = f"waited for {_ranks(w['ranks'])} ({w['phase']})" if w["ranks"] else ""
        if x["state"] == "failed":
            kind = (x["error"] or "").split(":", 1)[0]
            text += (" and then " if text else "") + f"raised {kind}"
            for m in _EXITED.finditer(x["error"] or ""):
                exited.update(int(v) for v in m.group(1).split(","))
        else:
            text = (text or "was in the call") + ", still waiting when it dumped"
        waiting[r] = text
    named_missing = [r for r in missing if r in named or r in exited]
    blamed_missing = named_missing or (missing if not faults else [])
    for r in blamed_missing:
        if r in exited:
            faults[r] = "died"
            notes.append(f"rank {r} died (its process exited; no dump)")
        else:
            faults[r] = "stalled"
            notes.append(f"rank {r} left no dump: it stalled (stopped, or hung outside Python) "
                         f"or was killed")
    if not faults and named:
        # everyone present got there and agrees: blame whom they waited for and who waited
        # on no one, e.g. a peer that finished but whose data never came
        for r in sorted(named - set(waiting)) or sorted(named):
            faults[r] = "was waited for"
        notes.append(f"{_ranks(faults)} were waited for by the others at #{s}")
    if op is None:
        op = next(iter(present.values()))["op"] if present else None
    parts = [f"{op} #{s}" + (f" (communicator {gid}, {world} ranks)" if gid else
                             f" ({world} ranks)") + ": " + "; ".join(notes)]
    if waiting:
        parts.append("Meanwhile " + "; ".join(f"rank {r} {t}" for r, t in waiting.items()))
    return _verdict(sorted(faults), op, s, gid, world, missing, waiting, states, faults,
                    ". ".join(p.rstrip(".") for p in parts) + ".")


def _verdict(culprits, op, seq, gid, world, missing, waiting, states, faults, text) -> dict:
    return {"culprits": sorted(culprits), "op": op, "seq": seq, "explanation": text,
            "faults": {str(r): k for r, k in sorted(faults.items())},
            "waiting": {str(r): t for r, t in sorted(waiting.items())},
            "ranks": {str(r): t for r, t in sorted(states.items())},
            "missing_dumps": list(missing), "group": gid, "world_size": world}


def report(res: dict) -> str:
    """The verdict as text for a terminal."""
    lines = []
    if res["culprits"]:
        kinds = ", ".join(f"rank {r}: {res['faults'].get(str(r), '?')}"
                          for r in res["culprits"])
        where = f"{res['op']} #{res['seq']}" if res["op"] else "no recorded call"
        lines.append(f"at fault: rank(s) {res['culprits']} at {where} ({kinds})")
    else:
        lines.append("no rank at fault in the records")
    lines.append("")
    lines.append(res["explanation"])
    lines.append("")
    lines.append("what each rank was doing when it dumped:")
    for r, t in res["ranks"].items():
        lines.append(f"  rank {r}: {t}")
    return "\n".join(lines)
