"""What the advisor's rules share: the `Finding` they report, the view of a profile
they read (its events grouped by category and by thread), the span arithmetic over it,
and the registry of rules (`RULES`, in the order the rule modules register them)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


# the categories of a training thread's own work (not loading, not waiting)
_WORK = ("op", "kernel", "backward", "optim")


@dataclass
class Finding:
    """One thing to change: `rule` (its name), a one-line `title`, the `evidence` (numbers
    read from the trace), the `fix` and the `share` of the profiled time at stake."""
    rule: str
    title: str
    evidence: dict = field(default_factory=dict)
    fix: str = ""
    share: float = 0.0     # of the profiled time at stake; `advise` lists the largest first

    def __str__(self):
        ev = ", ".join(f"{k}={_fmt(v)}" for k, v in self.evidence.items())
        return f"[{self.rule}] {self.title}\n  evidence: {ev}\n  fix: {self.fix}"


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


# ------------------------------------------------------------------------ the trace view
class _View:
    """The events of a profile, grouped the ways the rules read them."""

    def __init__(self, prof):
        evs = prof.events if hasattr(prof, "events") else list(prof)
        self.events = [e for e in evs if e.cat != "memory"]
        self.by_cat = defaultdict(list)
        self.by_tid = defaultdict(list)
        for e in self.events:
            self.by_cat[e.cat].append(e)
            self.by_tid[e.tid].append(e)
        wall = getattr(prof, "wall_ns", 0) or 0
        if self.events and wall <= 0:
            wall = max(e.end for e in self.events) - min(e.ts for e in self.events)
        self.wall_ns = max(int(wall), 1)


def _union_ns(spans) -> int:
    """Length of the union of (start, end) intervals."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _merged(spans) -> list:
    """Sorted, disjoint [start, end] intervals covering the (start, end) spans."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _sig(x, digits=4) -> float:
    return float(f"{x:.{digits}g}")


def _ms(ns) -> float:
    return round(ns / 1e6, 3)


def _inside(e, merged) -> bool:
    """Whether event `e` lies within one of the sorted [start, end] intervals."""
    for s, t in merged:
        if s <= e.ts and e.end <= t:
            return True
        if s > e.ts:
            break
    return False


def _by_tid(events):
    d = defaultdict(list)
    for e in events:
        d[e.tid].append(e)
    for es in d.values():
        es.sort(key=lambda e: e.ts)
    return d


RULES: list = []


def _rule(fn):
    RULES.append(fn)
    return fn
