"""One request's time on sampan's profiler timeline (category "serving"), recorded only
inside `sampan.profiler.profile()` (when nothing profiles, a request pays one flag read).

On the event-loop thread, per request, a "request" span (args model, id, status, batch)
holding, in order:

    read      the body arriving (for HTTP: uvicorn's parser feeding it, decompression)
    decode    the codec parsing and checking it (JSON or binary tensors, v1, gRPC)
    queue     waiting in the batcher's queue for a worker to take it into a batch
    compute   its batch running in the model (args batch: requests in it)
    answer    the worker handing the answer back to the loop
    encode    the codec writing the answer

and on each worker thread a "batch" span per batch run (args model, requests, rows).
`read`, `decode` and `encode` are the loop's CPU for the request; `queue`, `compute` and
`answer` its wait. The spans of concurrent requests overlap on the loop thread (a
request waits while others are read): read one request's by its "request" span.

    >>> # with sampan.profiler.profile() as prof: client.infer(...)
    >>> # [e.name for e in prof.events if e.cat == "serving"]
"""
from __future__ import annotations

import time

from .. import _recorder as recorder

_now = time.perf_counter_ns


class Stages:
    """The stage spans of one request, marked as it goes (`mark` ends the current
    stage and starts the next); `emit` records them under the request's span."""
    __slots__ = ("t0", "last", "spans")

    def __init__(self):
        self.t0 = self.last = _now()
        self.spans: list = []

    def mark(self, name):
        t = _now()
        self.spans.append((name, self.last, t - self.last, None))
        self.last = t

    def waited(self, p):
        """The queue, compute and answer stages of `p` (a batcher `Pending`), from its
        perf_counter times, ending now."""
        t = _now()
        if p is not None and p.t_start is not None and p.t_end is not None:
            q0, q1, c1 = int(p.t_enq * 1e9), int(p.t_start * 1e9), int(p.t_end * 1e9)
            self.spans += [("queue", q0, q1 - q0, None),
                           ("compute", q1, c1 - q1, {"batch": p.batch}),
                           ("answer", c1, max(t - c1, 0), None)]
        self.last = t

    def emit(self, model, rid, status, batch):
        t = _now()
        recorder.emit("request", "serving", self.t0, t - self.t0, model=model, id=rid,
                      status=status, batch=batch)
        for name, ts, dur, args in self.spans:
            recorder.emit(name, "serving", ts, dur, **(args or {}))


def batch_span(model, requests, rows, t0, t1):
    """The worker's "batch" span (perf_counter seconds `t0`..`t1`), if profiling."""
    if recorder.ACTIVE:
        recorder.emit("batch", "serving", int(t0 * 1e9), int((t1 - t0) * 1e9), model=model,
                      requests=requests, rows=rows)
