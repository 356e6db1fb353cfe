"""The event schema every part of the profiler shares (the advisor and the trace read it).
A low utility beside `sampan._recorder`; `sampan.profiler.events` is this same module.

One `Event` is one thing that happened on one thread: a span (`dur` > 0 or 0 for a
very short one), an instant (`dur` 0) or a counter sample (cat "memory", `dur` 0).
Times are `time.perf_counter_ns()` nanoseconds, one clock for every thread; `tid` is
`threading.get_ident()`. Extend only by adding fields or categories.

Categories and the names/args each carries:

- "op": an eager op (name = op name); args shapes, dtypes (with record_shapes), flops
  (from the op table), bytes (inputs + outputs).
- "backward": one autograd node run backward (name = "<op>_backward", args op); and
  one "backward" span around each whole walk (args nodes).
- "kernel": one node or fused kernel of a jitted program; args ir (the IR line), src
  (the user's file:line), flops, bytes, program (the jitted function's name).
- "jit": "compile" (args fn, signature), "cache_hit" / "cache_miss" (signature cache;
  instants, args fn, and for a miss signature, reason, traces); "run" (a span around
  one call of a compiled program, enclosing its "kernel" events; args program);
  "profiling_variant" (making a program's per-kernel recording executor, once).
- "optim": one optimiser step (name = "<Optimizer>.step").
- "data": "fetch" (a worker fetching a batch), "collate", "wait" (the consumer waiting
  on the loader's queue).
- "rec": "split", "pull", "push", "prefetch_wait", "cache" (args hits, misses),
  "snapshot_export".
- "collective": reserved for data-parallel collectives (issue 23).
- "serving": one request of `sampan serve` on the event-loop thread, "request" (args
  model, id, status, batch) holding "read", "decode", "queue", "compute" (args batch),
  "answer", "encode"; and "batch" on a worker thread (args model, requests, rows).
  Concurrent requests' spans overlap on the loop thread.
- "control": one eager `while_loop` / `scan` (name = the construct), a span enclosing the
  events of the ops its body ran; args iterations, and (added when the profile ends)
  ops: {op name: {"calls", "total_ns", "self_ns"}} over the enclosed op and kernel
  events, nested loops included. (A compiled loop is one "kernel" event instead.)
- "user": a range from `sampan.profiler.record("name")`.
- "memory": a counter sample; args bytes_live, delta, op (the op that allocated the
  array, also on its free), alloc (an id pairing an allocation with its free).
"""
from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("op", "backward", "kernel", "jit", "optim", "data", "rec", "collective",
              "serving", "user", "memory", "control")


@dataclass(slots=True)
class Event:
    """One recorded event; see the module docstring for the categories.

    >>> Event("add", "op", ts=0, dur=1000, tid=1, args={}).end
    1000
    """
    name: str
    cat: str
    ts: int                  # ns, time.perf_counter_ns()
    dur: int                 # ns; 0 for instants and counters
    tid: int                 # threading.get_ident()
    args: dict = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.ts + self.dur
