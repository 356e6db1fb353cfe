"""`key_averages()`: per-name totals of a profile, and their table.

Self time is a span's duration minus the spans nested directly inside it on the same
thread (children start and end within their parent), so the self times of one thread
add up to at most the time it was recorded. Instants and memory counters are not
spans and are left out. "% wall" is self time against the profile's wall time.

    >>> import sampan, sampan.profiler
    >>> with sampan.profiler.profile() as prof:
    ...     _ = sampan.ones(8) * 2
    >>> row = prof.key_averages().row("mul")
    >>> row.calls, row.self_ns <= row.total_ns
    (1, True)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SampanValueError

SPAN_CATS = ("op", "backward", "kernel", "jit", "optim", "data", "rec", "collective",
             "serving", "user", "control")


@dataclass
class Row:
    """Totals for one event name (and category, and input shapes when grouped so)."""
    name: str
    cat: str
    shapes: str = ""
    calls: int = 0
    total_ns: int = 0
    self_ns: int = 0
    flops: int = 0
    bytes: int = 0
    wall_ns: int = 1
    tids: set = field(default_factory=set)

    @property
    def avg_ns(self) -> float:
        return self.total_ns / self.calls if self.calls else 0.0

    @property
    def gflops(self) -> float:
        """Achieved GFLOP/s over the events' total time (0 without FLOPs)."""
        return self.flops / self.total_ns if self.total_ns and self.flops else 0.0

    @property
    def share(self) -> float:
        """Self time as a fraction of the profile's wall time."""
        return self.self_ns / self.wall_ns if self.wall_ns else 0.0


def self_times(events) -> dict:
    """id(event) -> self ns for every span (a parent's self time less its direct
    children's durations), nesting taken per thread; `events` sorted by (ts, -dur)."""
    out = {}
    stacks: dict = {}
    for e in events:
        if e.cat not in SPAN_CATS:
            continue
        st = stacks.setdefault(e.tid, [])
        end = e.ts + e.dur
        while st and not (st[-1].ts <= e.ts and end <= st[-1].ts + st[-1].dur):
            st.pop()
        out[id(e)] = e.dur
        if st:
            out[id(st[-1])] -= e.dur
        st.append(e)
    return out


def summarise_loops(events) -> None:
    """Add to each eager loop's "control" span (see `sampan._events`) the per-op summary of
    the op and kernel events it encloses on its thread: ``args["ops"] = {name: {"calls",
    "total_ns", "self_ns"}}``; `events` sorted by (ts, -dur). The events stay as they are
    (nested under the span), so the tables and the advisor read them as before."""
    selfs = None
    stacks: dict = {}
    for e in events:
        if e.cat not in SPAN_CATS:
            continue
        st = stacks.setdefault(e.tid, [])
        while st and not (st[-1].ts <= e.ts and e.end <= st[-1].end):
            st.pop()
        if e.cat == "control":
            e.args.setdefault("ops", {})
            st.append(e)
        elif st and e.cat in ("op", "kernel"):
            if selfs is None:
                selfs = self_times(events)
            for loop in st:
                row = loop.args["ops"].setdefault(e.name, {"calls": 0, "total_ns": 0,
                                                           "self_ns": 0})
                row["calls"] += 1
                row["total_ns"] += e.dur
                row["self_ns"] += selfs[id(e)]


class EventTable:
    """The rows of `key_averages`; `table()` formats them, `row(name)` looks one up."""

    SORT_KEYS = {"self_time": "self_ns", "total_time": "total_ns", "calls": "calls",
                 "flops": "flops", "gflops": "gflops", "avg_time": "avg_ns", "name": "name",
                 # torch.profiler's spellings
                 "self_cpu_time_total": "self_ns", "cpu_time_total": "total_ns",
                 "count": "calls"}

    def __init__(self, rows: list[Row], wall_ns: int):
        self.rows = rows
        self.wall_ns = wall_ns

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)

    def row(self, name: str, cat: str | None = None) -> Row:
        for r in self.rows:
            if r.name == name and (cat is None or r.cat == cat):
                return r
        raise KeyError(name)

    def sorted(self, sort_by: str = "self_time") -> list[Row]:
        key = self.SORT_KEYS.get(sort_by)
        if key is None:
            raise SampanValueError(f"key_averages.table: sort_by={sort_by!r}; expected one "
                                   f"of {sorted(self.SORT_KEYS)}")
        rev = key != "name"
        return sorted(self.rows, key=lambda r: getattr(r, key), reverse=rev)

    def table(self, sort_by: str = "self_time", row_limit: int = 20) -> str:
        """A text table: name, category, calls, total/self/avg time, FLOPs, GFLOP/s and
        share of the wall time, sorted by `sort_by` (self_time, total_time, calls,
        flops, gflops, avg_time, name)."""
        rows = self.sorted(sort_by)
        shown = rows[:row_limit] if row_limit and row_limit > 0 else rows
        shapes = any(r.shapes for r in shown)
        head = ["name", "cat", "calls", "total ms", "self ms", "avg us", "MFLOP", "GFLOP/s",
                "% wall"] + (["shapes"] if shapes else [])
        lines = []
        for r in shown:
            cells = [r.name[:40], r.cat, str(r.calls), f"{r.total_ns / 1e6:.3f}",
                     f"{r.self_ns / 1e6:.3f}", f"{r.avg_ns / 1e3:.1f}",
                     f"{r.flops / 1e6:.2f}" if r.flops else "-",
                     f"{r.gflops:.2f}" if r.flops else "-", f"{100 * r.share:.1f}"]
            lines.append(cells + ([r.shapes[:60]] if shapes else []))
        widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h)
                  for i, h in enumerate(head)]

        def fmt(cells):
            return "  ".join(c.ljust(w) if i in (0, 1) or i == 9 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
        out = [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(c) for c in lines]
        hidden = len(rows) - len(shown)
        total_self = sum(r.self_ns for r in rows)
        out.append(f"{len(rows)} rows{f' ({hidden} not shown)' if hidden else ''}; "
                   f"self time {total_self / 1e6:.3f} ms over a wall time of "
                   f"{self.wall_ns / 1e6:.3f} ms")
        return "\n".join(out)

    def __str__(self):
        return self.table()


def key_averages(prof, group_by_input_shape: bool = False) -> EventTable:
    wall = max(prof.wall_ns, 1)
    selfs = self_times(prof.events)
    rows: dict = {}
    for e in prof.events:
        s = selfs.get(id(e))
        if s is None:
            continue
        shapes = str(e.args.get("shapes", "")) if group_by_input_shape else ""
        key = (e.name, e.cat, shapes)
        r = rows.get(key)
        if r is None:
            r = rows[key] = Row(e.name, e.cat, shapes, wall_ns=wall)
        r.calls += 1
        r.total_ns += e.dur
        r.self_ns += s
        r.flops += int(e.args.get("flops", 0) or 0)
        r.bytes += int(e.args.get("bytes", 0) or 0)
        r.tids.add(e.tid)
    return EventTable(list(rows.values()), wall)
