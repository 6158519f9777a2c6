"""``tilecomm trace analyze DIR``: which rank is at fault, at which call, and why.

Reads every ``flight-rank{R}.json`` in DIR (``flight.py``) and, per communicator, walks the
sequence numbers up from the oldest one every rank still holds. The first number where the
ranks do not all hold the same completed call is the divergence; there:

* a rank whose call differs from the majority's (collective, dtype, bytes, root, algorithm)
  **arrived at another collective**; a rank that refused its call **rejected** it;
* a rank with a dump but no record at that number **never arrived** (its last call says where
  it is: outside tilecomm in the program's own code, or stuck in an earlier call or a
  send/recv);
* a rank whose record there began after a waiter had already given up on it **arrived late**
  (it was busy in its own code for longer than the timeout);
* a rank without a dump that a waiter saw exit **died** when the waiter saw it inside a
  tilecomm call, else it **exited** (between calls: cleanly or killed, the dumps cannot tell);
  one that did not exit **stalled** (a stopped or hung process cannot answer SIGUSR1); the
  waiters' records name who they were waiting for, and the world size says which dumps are
  missing;
* every other rank's record there says what it was waiting for (ranks and phase) and how it
  ended. A rank that was itself waiting there is never blamed for the others' waits.

Errors are quoted by their first line, without the channel's internal step counters.

:func:`analyze` returns one dict (``--json`` prints it): ``culprits`` (sorted ranks), ``op``,
``seq``, ``explanation`` (one paragraph), ``faults`` (rank -> kind), ``waiting`` (rank -> what
it waited for), ``ranks`` (rank -> its state), ``missing_dumps``, ``group``, ``world_size``.
"""

from __future__ import annotations

import re

from .flight import FORMAT, REJECTED

# What the waiters' errors say of their peers (backends/cpu/channel.py: _raise_timeout and
# describe_peer; hier/: the errors of a call that spans hosts).
_EXITED = re.compile(r"rank\(s\) \[([\d, ]+)\] exited")
#: a peer outside any call: "rank 1 is in no tilecomm call; its last was all_reduce #1"
_OUTSIDE = re.compile(r"rank (\d+) is in no tilecomm call; its last was (\w+ #-?\d+)")
#: a peer inside one: "rank 3 is in all_reduce #2", "rank 1 is in recv #0 from rank 2"
_INSIDE = re.compile(r"rank (\d+) is in ((?:send|recv) #\d+ (?:to|from) rank \d+|\w+ #\d+)")
#: a host step's error names that host's ranks by local number from here on
_LOCALS = re.compile(r"\(local \d+ = rank \d+(?:, local \d+ = rank \d+)*\)")
_LOCAL = re.compile(r"local (\d+) = rank (\d+)")
#: the channel's progress counter, internal: "(step 7)", "is at step 3, no collective posted"
_STEP = re.compile(r" \(step \d+\)")
_AT_STEP = re.compile(r"is at step \d+, no collective posted yet")
#: dump reasons of a rank that was running its own code when it wrote (flight.py)
_ALIVE_REASONS = ("SIGUSR1", "SIGTERM", "comm.dump_flight()")


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
        state = f"failed: {_quote(rec['error'])}"
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


def _quote(text: str | None) -> str:
    """An error as this verdict quotes it: its whole first line (a transport error in it is
    whole too, or cut at a word and marked: hier/rails.py ``first_line``), less the channel's
    progress counters ("(step 7)": internal, and nothing here explains them)."""
    line = _first_line(text)
    return _STEP.sub("", _AT_STEP.sub("has posted no collective yet", line))


def _secs(ns: int) -> str:
    return f"{ns / 1e9:.1f} s"


def _waiter(rec: dict) -> bool:
    """This rank was itself waiting in the call: still waiting, or it recorded whom it waited
    for, or it gave up waiting (a timeout)."""
    return (rec["state"] == "waiting" or bool(rec["wait"])
            or (rec["error"] or "").startswith("CommTimeout"))


def _peer_facts(error: str | None) -> tuple[set[int], dict[int, tuple[str, str | None]]]:
    """What a waiter's error says of its peers, in the communicator's (global) ranks:
    ``(exited, seen)``. ``seen``: rank -> ("outside", its last call) or ("inside", the call it
    is in, None when that is a host's internal step).

    The channel's own words come last in an error; in a host step's error ("the step inside
    host 1 failed (local 0 = rank 2, local 1 = rank 3): ...") they name that host's ranks by
    local number, and their call numbers are the host's. A rank that a host saw "in no tilecomm
    call" may be in the enclosing call still, between host steps (on a rail): not reported."""
    text = error or ""
    local = None
    maps = list(_LOCALS.finditer(text))
    if maps:
        local = {int(a): int(b) for a, b in _LOCAL.findall(maps[-1].group(0))}
        text = text[maps[-1].end():]
    for quoted in (" gave up: ", " reports: "):   # from here on: another rank's own error
        text = text.split(quoted, 1)[0]

    def glob(r: str) -> int | None:
        return int(r) if local is None else local.get(int(r))
    exited = {glob(r) for m in _EXITED.finditer(text) for r in m.group(1).split(",")}
    seen: dict[int, tuple[str, str | None]] = {}
    if local is None:
        for m in _OUTSIDE.finditer(text):
            seen[int(m.group(1))] = ("outside", m.group(2))
    for m in _INSIDE.finditer(text):
        seen[glob(m.group(1))] = ("inside", m.group(2) if local is None else None)
    exited.discard(None)
    seen.pop(None, None)
    return exited, seen


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
                                                          reason=doc["reason"],
                                                          written_ns=doc.get("written_ns"))
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
    chosen = next((res for res in results if res["culprits"]), results[0])
    went_on = _went_on(groups, results, chosen["group"])
    chosen["recovery"] = went_on
    if went_on:
        chosen["explanation"] += " The job went on: " + "; ".join(went_on) + "."
    return chosen


#: records of calls that end or replace a communicator (Communicator.abort / revoke / shrink
#: / grow); their note says who, why, and what came of it
_LIFECYCLE = ("abort", "revoke", "shrink", "grow")


def _went_on(groups: dict[int, dict[int, dict]], results: list[dict], gid) -> list[str]:
    """What the ranks did about a failure: who aborted or revoked which communicator and why,
    who shrank or grew it into what, and how the communicators made after ``gid`` fared."""
    said: list[str] = []
    for g, parts in sorted(groups.items()):
        seen: dict[tuple, list[int]] = {}
        for r, p in sorted(parts.items()):
            for x in p["records"]:
                if x["op"] not in _LIFECYCLE:
                    continue
                if x["op"] in ("abort", "revoke"):
                    key = (x["op"], x.get("note") or "")
                elif x["state"] == "completed":
                    key = (x["op"], (x.get("note") or "").split(";")[0])
                else:
                    key = (x["op"] + " failed", _quote(x["error"]))
                seen.setdefault(key, []).append(r)
        for (op, note), ranks in seen.items():
            if op in ("abort", "revoke"):
                said.append(f"communicator {g} was {op}ed by {note}" if note else
                            f"{_ranks(ranks)} {op}ed communicator {g}")
            else:
                said.append(f"{_ranks(ranks)} called {op} on communicator {g}"
                            + (f" ({note})" if note else ""))
    if not said:
        return []
    for res in results:
        if gid is not None and res["group"] is not None and res["group"] > gid:
            status = ("completed every call it recorded" if not res["culprits"] else
                      f"failed too: rank(s) {res['culprits']} at {res['op']} #{res['seq']}")
            said.append(f"communicator {res['group']} ({res['world_size']} ranks) {status}")
    return said


def _analyze_group(gid: int, parts: dict[int, dict], world_hint: int | None) -> dict:
    world = max([p["world_size"] for p in parts.values()] + [world_hint or 0])
    have = set(parts)
    missing = sorted(set(range(world)) - have)
    all_recs = {r: p["records"] for r, p in parts.items()}
    ordered = {r: {x["seq"]: x for x in recs if x["seq"] is not None}
               for r, recs in all_recs.items()}
    states = {r: _show(_now_doing(all_recs[r])) for r in sorted(have)}
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
        return _divergence(gid, world, s, present, absent, missing, ordered, all_recs, parts,
                           states)
    faults = {r: "died or stalled (no dump)" for r in missing}
    text = (f"no divergence: the ranks with dumps all completed every call up to #{hi}"
            + (f"; rank(s) {missing} left no dump (died or stalled after #{hi})"
               if missing else "; the job is not stuck in a tilecomm call they recorded"))
    return _verdict(missing, None, hi if missing else None, gid, world, missing, {}, states,
                    faults, text)


def _divergence(gid, world, s, present, absent, missing, ordered, all_recs, parts,
                states) -> dict:
    faults: dict[int, str] = {}
    notes: list[str] = []
    rejected = sorted(r for r, x in present.items() if _rejected(x))
    for r in rejected:
        faults[r] = "rejected its call"
        notes.append(f"rank {r} rejected its call {_desc(present[r])}: "
                     f"{_quote(present[r]['error'][len(REJECTED):])}")
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
        faults[r] = "never arrived"
        notes.append(f"rank {r} never arrived at #{s}: " + _where(r, s, ordered[r], all_recs[r],
                                                                    parts[r]))
    _late_arrivals(s, present, all_recs, faults, notes)
    waiting: dict[int, str] = {}
    named: set[int] = set()
    exited: set[int] = set()
    seen: dict[int, tuple[str, str | None]] = {}
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
            gone, where = _peer_facts(x["error"])
            exited |= gone
            for q, fact in where.items():
                seen.setdefault(q, fact)
        else:
            text = (text or "was in the call") + ", still waiting when it dumped"
        waiting[r] = text
    named_missing = [r for r in missing if r in named or r in exited]
    blamed_missing = named_missing or (missing if not faults else [])
    # every rank that dumped was told to stop while it waited: torchrun does that to all
    # ranks as soon as one fails, before the waiters can see the failed one
    told_to_stop = all((p.get("reason") or "").startswith("SIGTERM") for p in parts.values())
    for r in blamed_missing:
        faults[r], note = _without_dump(r, s, r in exited, seen.get(r), told_to_stop)
        notes.append(note)
    if not faults and named:
        # everyone present got there and agrees: blame whom they waited for, e.g. a peer that
        # finished but whose data never came; not a rank that was waiting itself (a host's
        # leader waiting on the rail is named by its host peers' waits, but only passes the
        # wait on)
        blamed = sorted(r for r in named if r not in present or not _waiter(present[r]))
        for r in blamed:
            faults[r] = "was waited for"
        if blamed:
            notes.append(f"{_ranks(blamed)} {'was' if len(blamed) == 1 else 'were'} waited "
                         f"for by the others at #{s}")
        else:
            notes.append(f"every rank the others waited for ({_ranks(named)}) was waiting "
                         f"itself: no rank stands out")
    if op is None:
        op = next(iter(present.values()))["op"] if present else None
    paragraphs = [f"{op} #{s}" + (f" (communicator {gid}, {world} ranks)" if gid else
                              f" ({world} ranks)") + ": " + "; ".join(notes)]
    if waiting:
        paragraphs.append("Meanwhile " + "; ".join(f"rank {r} {t}" for r, t in waiting.items()))
    return _verdict(sorted(faults), op, s, gid, world, missing, waiting, states, faults,
                    ". ".join(p.rstrip(".") for p in paragraphs) + ".")


def _where(r: int, s: int, ordered: dict[int, dict], recs: list[dict], part: dict) -> str:
    """Where rank ``r``, which has a dump but no record at #``s``, was instead."""
    last = max(ordered) if ordered else None
    now = _now_doing(recs)
    if now is not None and now["state"] in ("issued", "waiting"):
        where = "its last call was " + (_show(ordered[last]) if last is not None else
                                        "none recorded")
        if now["seq"] is None:
            where += f"; it is now in {_show(now)}"
        return where
    if now is None:
        return "no call recorded"
    if now["state"] == "completed":
        # not in any call of this communicator: a rank that answered SIGUSR1 (or SIGTERM, or
        # dumped itself) was running the program's own code, in Python, which a sleeping or
        # busy rank does too (a signal's handler runs between bytecodes, and interrupts
        # time.sleep); a stopped or hung one could not have written the dump
        reason = part.get("reason") or ""
        since = (f" {_secs(part['written_ns'] - now['ended_ns'])}"
                 if part.get("written_ns") and now["ended_ns"] else "")
        where = ("outside tilecomm, in the program's own code," if
                 reason.startswith(_ALIVE_REASONS) else
                 f"in no call of this communicator (its dump was written for: {reason}),")
        return (f"when it dumped it was {where}{since} after its last call {_desc(now)} "
                f"completed (busy there, or done without calling #{s})")
    return f"its last call was {_show(now)}"


def _late_arrivals(s: int, present: dict[int, dict], all_recs: dict[int, list[dict]],
                   faults: dict[int, str], notes: list[str]) -> None:
    """The ranks that came to #``s`` only after a waiter there had given up (timed out) on
    them: they were busy elsewhere (their own code) for longer than the timeout."""
    gave_up = {q: x["ended_ns"] for q, x in present.items()
               if x["state"] == "failed" and x["ended_ns"] and _waiter(x)}
    for r, x in sorted(present.items()):
        if r in faults or r in gave_up:
            continue
        before = [q for q, end in gave_up.items() if end < x["issued_ns"]]
        if not before:
            continue
        # the first that gave up on this rank itself; else (it waited for another rank, which
        # passed the wait on, e.g. across hosts) the first that gave up at all
        mine = [q for q in before if r in ((present[q]["wait"] or {}).get("ranks") or ())]
        first = min(mine or before, key=lambda q: gave_up[q])
        faults[r] = "arrived late"
        note = (f"rank {r} arrived at #{s} {_secs(x['issued_ns'] - gave_up[first])} after "
                f"rank {first} had given up waiting for " + ("it" if mine else "the others"))
        prev = [y for y in all_recs[r] if y["issued_ns"] < x["issued_ns"] and y["ended_ns"]]
        if prev:
            last = max(prev, key=lambda y: y["issued_ns"])
            note += (f": it had been outside tilecomm, in the program's own code, for "
                     f"{_secs(x['issued_ns'] - last['ended_ns'])} since its last call "
                     f"{_desc(last)} completed")
        notes.append(note)


def _without_dump(r: int, s: int, exited: bool, seen: tuple[str, str | None] | None,
                  told_to_stop: bool = False) -> tuple[str, str]:
    """The fault of rank ``r``, which left no dump, and its note: from whether a waiter saw
    its process exit, where the waiters' channel last saw it (``_peer_facts``), and whether
    the ranks that dumped were told to stop (SIGTERM) while they waited."""
    if told_to_stop and not exited and seen is None:
        return "failed", (f"rank {r} left no dump, and every other rank was told to stop "
                          f"(SIGTERM) while it waited for it at #{s}: torchrun does that as "
                          f"soon as one rank fails, so rank {r} most likely failed (exited or "
                          f"crashed; its own output says why)")
    inside = seen is not None and seen[0] == "inside"
    call = (seen[1] or "a tilecomm call (a step inside its host)") if seen else None
    if exited and inside:
        # a call returns, or raises a CommError (which writes a dump), before the function can
        # return: a process that ended in the middle of one was killed or crashed
        return "died", (f"rank {r} died inside {call}: its process ended in the middle of the "
                        f"call (killed or crashed; no dump)")
    if exited:
        # a clean exit after the function returned, or a kill between two calls: both leave no
        # dump, and the waiters see only that the process is gone
        if seen:
            return "exited", (f"rank {r} never arrived at #{s}: its process exited, cleanly or "
                              f"not (it left no dump), after its last call {call}, outside any "
                              f"tilecomm call")
        return "exited", (f"rank {r} exited, cleanly or not (it left no dump; the waiters saw "
                          f"its process gone), before finishing #{s}")
    if inside:
        return "stalled", (f"rank {r} left no dump: the waiters saw it in {call}, where it "
                           f"stalled (stopped, or stuck outside Python)")
    if seen:
        return "stalled", (f"rank {r} left no dump and never arrived at #{s}: the waiters saw "
                           f"it alive outside tilecomm after its last call {call}, and it did "
                           f"not answer the request to dump (a rank running Python code "
                           f"answers tilecomm.launch's SIGUSR1): stopped, stuck outside "
                           f"Python, or never asked")
    return "stalled", (f"rank {r} left no dump: it stalled (stopped, or stuck outside Python), "
                       f"was killed unseen, or was never asked to dump")


def _verdict(culprits, op, seq, gid, world, missing, waiting, states, faults, text) -> dict:
    return {"culprits": sorted(culprits), "op": op, "seq": seq, "explanation": text,
            "recovery": [],
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
