"""The memory timeline of a profile: live bytes over time, the peak, and the ops whose
arrays were alive at the peak.

It counts the arrays that eager ops allocated during the session (an op output owning
its buffer) until they were freed; arrays that existed before the session (parameters,
inputs) are not in it, so the figure is what the profiled code added.

    >>> import sampan, sampan.profiler
    >>> with sampan.profiler.profile() as prof:
    ...     a = sampan.ones(256) * 2     # 1 KiB, kept
    >>> prof.memory_timeline().peak_bytes >= 1024
    True
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MemoryTimeline:
    """times_ns (since the profile's start) and bytes_live after each change; the peak,
    when it was reached, and {op: bytes} of the allocations alive at the peak."""
    times_ns: list = field(default_factory=list)
    bytes_live: list = field(default_factory=list)
    peak_bytes: int = 0
    peak_ns: int = 0
    peak_ops: dict = field(default_factory=dict)
    allocated_bytes: int = 0
    allocations: int = 0

    def top_ops(self, n: int = 5) -> list:
        """The `n` ops with the most bytes alive at the peak, as (op, bytes)."""
        return sorted(self.peak_ops.items(), key=lambda kv: -kv[1])[:n]

    def __str__(self):
        ops = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in self.top_ops())
        return (f"memory: peak {fmt_bytes(self.peak_bytes)} at {self.peak_ns / 1e6:.3f} ms "
                f"({ops or 'nothing allocated'}); {self.allocations} allocations, "
                f"{fmt_bytes(self.allocated_bytes)} in all")


def fmt_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def memory_timeline(prof) -> MemoryTimeline:
    tl = MemoryTimeline()
    live: dict = {}            # allocation id -> (op, bytes), at the current point
    peak_live: dict = {}
    for e in prof.events:
        if e.cat != "memory":
            continue
        a = e.args
        d = int(a.get("delta", 0))
        if d > 0:
            live[a.get("alloc")] = (a.get("op", "?"), d)
            tl.allocations += 1
            tl.allocated_bytes += d
        else:
            live.pop(a.get("alloc"), None)
        b = int(a.get("bytes_live", 0))
        tl.times_ns.append(e.ts - prof.start_ns)
        tl.bytes_live.append(b)
        if b > tl.peak_bytes:
            tl.peak_bytes, tl.peak_ns = b, e.ts - prof.start_ns
            peak_live = dict(live)
    for op, n in peak_live.values():
        tl.peak_ops[op] = tl.peak_ops.get(op, 0) + n
    return tl
