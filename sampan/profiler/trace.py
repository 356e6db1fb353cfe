"""Chrome trace event JSON (the format ui.perfetto.dev and chrome://tracing open).

Spans become complete events ("ph": "X", ts and dur in microseconds since the profile
started), instants "i" events (thread scope), the memory counter "C" events, and each
thread and the process get a name ("M" metadata). Events are written per thread in
time order. The file is written atomically.

    >>> import sampan, sampan.profiler, tempfile, os, json
    >>> with sampan.profiler.profile() as prof:
    ...     _ = sampan.ones(4) + 1
    >>> p = prof.export_chrome_trace(os.path.join(tempfile.mkdtemp(), "t.json"))
    >>> "traceEvents" in json.load(open(p))
    True
"""
from __future__ import annotations

import json

from ..io._atomic import write_file


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    try:
        return v.item()          # numpy scalars
    except AttributeError:
        return str(v)


def chrome_trace(prof) -> dict:
    """The trace as a dict: {"traceEvents": [...], "displayTimeUnit": "ms", ...}."""
    t0, pid = prof.start_ns, prof.pid
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": "sampan"}}]
    tids = sorted({e.tid for e in prof.events} | set(prof.thread_names))
    for i, tid in enumerate(tids):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": prof.thread_names.get(tid, f"thread {tid}")}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                    "args": {"sort_index": i}})
    for e in prof.events:       # sorted by (ts, -dur): in time order on every thread
        ts = (e.ts - t0) / 1e3
        if e.cat == "memory":
            out.append({"ph": "C", "name": "memory", "cat": "memory", "pid": pid,
                        "tid": e.tid, "ts": ts,
                        "args": {"bytes_live": int(e.args.get("bytes_live", 0))}})
        elif e.dur == 0 and e.cat in ("jit", "rec") and e.name != "compile":
            out.append({"ph": "i", "s": "t", "name": e.name, "cat": e.cat, "pid": pid,
                        "tid": e.tid, "ts": ts, "args": _jsonable(e.args)})
        else:
            out.append({"ph": "X", "name": e.name, "cat": e.cat, "pid": pid, "tid": e.tid,
                        "ts": ts, "dur": e.dur / 1e3, "args": _jsonable(e.args)})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"producer": "sampan.profiler", "wall_us": prof.wall_ns / 1e3}}


def write_chrome_trace(prof, path: str) -> str:
    data = json.dumps(chrome_trace(prof), separators=(",", ":")).encode()
    write_file(path, lambda f: f.write(data))
    return path
