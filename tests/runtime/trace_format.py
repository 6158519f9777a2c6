"""A checker of the Chrome trace event format (the JSON Object Format of the "Trace Event
Format" document that chrome://tracing and Perfetto load), written from that document and
independent of tilecomm's writer: required keys and types per phase type, one name per
process, and complete events on one thread that nest (no partial overlap)."""

from __future__ import annotations

_NUM = (int, float)
EPS_US = 1e-3      # float rounding of ns -> us conversions


def check_trace(doc) -> list[str]:
    """Problems found in the trace document ``doc`` (empty: valid)."""
    errs: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents list"]
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        errs.append(f"displayTimeUnit must be ms or ns, got {doc['displayTimeUnit']!r}")
    names: dict[int, list[str]] = {}
    by_thread: dict[tuple, list[tuple]] = {}
    for i, e in enumerate(doc["traceEvents"]):
        where = f"event {i} ({e.get('name') if isinstance(e, dict) else e!r})"
        if not isinstance(e, dict):
            errs.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if not isinstance(e.get("name"), str):
            errs.append(f"{where}: name must be a string")
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            errs.append(f"{where}: pid and tid must be integers")
        if "args" in e and not isinstance(e["args"], dict):
            errs.append(f"{where}: args must be an object")
        if ph == "X":
            if not isinstance(e.get("ts"), _NUM) or not isinstance(e.get("dur"), _NUM):
                errs.append(f"{where}: X events need numeric ts and dur")
                continue
            if e["dur"] < 0:
                errs.append(f"{where}: negative dur")
            if "cat" in e and not isinstance(e["cat"], str):
                errs.append(f"{where}: cat must be a string")
            by_thread.setdefault((e["pid"], e["tid"]), []).append(
                (e["ts"], e["ts"] + e["dur"], i))
        elif ph == "M":
            if e.get("name") not in ("process_name", "process_labels", "process_sort_index",
                                     "thread_name", "thread_sort_index"):
                errs.append(f"{where}: unknown metadata event")
            key = "sort_index" if e.get("name", "").endswith("sort_index") else "name"
            if key not in e.get("args", {}):
                errs.append(f"{where}: metadata needs args.{key}")
            if e.get("name") == "process_name":
                names.setdefault(e["pid"], []).append(e["args"].get("name"))
        elif ph in ("B", "E", "i", "I", "C", "b", "e", "n", "s", "t", "f"):
            if not isinstance(e.get("ts"), _NUM):
                errs.append(f"{where}: needs a numeric ts")
        else:
            errs.append(f"{where}: unknown phase type {ph!r}")
    for pid, n in names.items():
        if len(n) != 1:
            errs.append(f"pid {pid}: {len(n)} process_name events")
    for key, spans in by_thread.items():
        stack: list[tuple] = []
        for start, end, i in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1][1] - EPS_US:
                stack.pop()
            if stack and end > stack[-1][1] + EPS_US:
                errs.append(f"pid/tid {key}: event {i} overlaps event {stack[-1][2]} without "
                            f"nesting in it")
            stack.append((start, end, i))
    return errs
