"""`profile()`: one session of recording, and the `Profile` that holds what it recorded.

Starting a session turns the recorder's flag on (every instrumented site then records:
jit kernels, autograd, optimisers, data loading, the rec pipeline, user ranges) and
pushes a process-wide dispatch mode that times every eager op on every thread. Ops run
while `sampan.jit` traces are not recorded as ops: the trace's cost is the "compile"
span, and what the program later runs is recorded per kernel. Leaving the block (also on
an exception) pops the mode, turns the flag off and collects every thread's events.

    >>> import sampan, sampan.profiler
    >>> with sampan.profiler.profile() as prof:
    ...     y = sampan.ones(4) + 1
    >>> [e.name for e in prof.events if e.cat == "op"][-1]
    'add'
"""
from __future__ import annotations

import os
import sys
import threading
import weakref

import numpy as np

from ..errors import SampanError
from ..ops import modes
from ..ops.registry import STATE, Spec
from .. import _recorder as recorder
from .._events import Event
from .tables import summarise_loops


class ProfilerError(SampanError, RuntimeError):
    """Misuse of the profiler (a second session inside one, results before the end)."""


_SAMPAN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _user_line() -> str:
    """file:line of the innermost frame outside sampan (for with_stack)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_SAMPAN_DIR):
        f = f.f_back
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}" if f else "?"


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class _Memory:
    """Live bytes of arrays that ops allocated during the session: an allocation is an
    op output owning its buffer (its root array not seen before); its free is the
    buffer's collection (a weakref finalizer). Counter events carry the running total."""

    def __init__(self):
        self.live = 0
        self.next_id = 0
        self.lock = threading.Lock()
        self.finalizers: list = []
        self.seen: dict = {}        # id(root array) -> allocation id, while alive
        self.on = True

    def track(self, op_name: str, arrays, inputs) -> None:
        for a in arrays:
            root = _root(a)
            if (root.base is not None or id(root) in self.seen or root.nbytes == 0
                    or any(_root(i) is root for i in inputs)):
                continue   # a view of an input, foreign memory or counted already
            n = int(root.nbytes)
            with self.lock:
                self.next_id += 1
                aid = self.next_id
                self.seen[id(root)] = aid
                self.live += n
                live = self.live
                ts = recorder.now()     # under the lock: counter order is time order
            recorder.emit("bytes_live", "memory", ts, 0, bytes_live=live,
                          delta=n, op=op_name, alloc=aid)
            self.finalizers.append(weakref.finalize(root, self.free, id(root), aid, n,
                                                    op_name))

    def free(self, key, aid, n, op_name):
        if not self.on:
            return
        with self.lock:
            self.seen.pop(key, None)
            self.live -= n
            live = self.live
            ts = recorder.now()
        recorder.emit("bytes_live", "memory", ts, 0, bytes_live=live, delta=-n,
                      op=op_name, alloc=aid)

    def close(self):
        self.on = False
        for f in self.finalizers:
            f.detach()
        self.finalizers.clear()
        self.seen.clear()


class Profile:
    """What one `profile()` block recorded; see the module docstring."""

    def __init__(self, record_shapes=True, profile_memory=True, with_stack=False):
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.events: list[Event] = []
        self.thread_names: dict[int, str] = {}
        self.start_ns = self.end_ns = 0
        self.pid = os.getpid()
        self._memory = None
        self._running = False

    # ------------------------------------------------------------------ session
    def __enter__(self):
        if recorder.ACTIVE:
            raise ProfilerError("profile: a profiling session is already active; "
                                "nested sessions are not supported (end the outer one first)")
        self._memory = _Memory() if self.profile_memory else None
        recorder.start()
        self._running = True
        self.start_ns = recorder.now()
        modes.push_mode(self._op_mode, process_wide=True)
        return self

    def __exit__(self, *exc):
        try:
            modes.pop_mode(self._op_mode, process_wide=True)
        finally:
            self.end_ns = recorder.now()
            bufs = recorder.stop()
            self._running = False
            if self._memory is not None:
                self._memory.close()
            events = []
            for tid, tname, buf in bufs:
                # an ended thread's ident is reused by a later one: one lane, both names
                old = self.thread_names.get(tid)
                self.thread_names[tid] = tname if old in (None, tname) else f"{old} / {tname}"
                events.extend(buf)
            # parents before the children they enclose: by start, the longer first
            events.sort(key=lambda e: (e.ts, -e.dur))
            summarise_loops(events)
            self.events = events
        return False

    def _op_mode(self, op, inputs, attrs, call_next):
        if STATE.tracer is not None:      # tracing: the program's kernels are recorded later
            return call_next(op, inputs, attrs)
        t0 = recorder.now()
        out = call_next(op, inputs, attrs)
        t1 = recorder.now()
        outs = out if isinstance(out, tuple) else (out,)
        args = {}
        try:
            ins = [t._data for t in inputs]
            res = [t._data for t in outs]
        except AttributeError:             # an op returning something else: time only
            ins, res = [], []
        if self.record_shapes:
            args["shapes"] = [list(a.shape) for a in ins]
            args["dtypes"] = [str(a.dtype) for a in ins]
        flops = 0
        if op.flops is not None:
            try:
                flops = int(op.flops(*[Spec(a.shape, a.dtype) for a in ins], **attrs))
            except Exception:  # noqa: BLE001 - a formula needing what eager lacks: unknown
                flops = 0
        args["flops"] = flops
        args["bytes"] = sum(a.nbytes for a in ins) + sum(a.nbytes for a in res)
        if self.with_stack:
            args["src"] = _user_line()
        recorder.emit(op.name, "op", t0, t1 - t0, **args)
        if self._memory is not None and res:
            self._memory.track(op.name, res, ins)
        return out

    def _done(self, what):
        if self._running:
            raise ProfilerError(f"profile.{what}: the profiling block has not ended yet; "
                                f"call it after the `with` block")

    # ------------------------------------------------------------------ outputs
    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    def export_chrome_trace(self, path: str) -> str:
        """Write the Chrome trace / Perfetto JSON to `path` (opens in ui.perfetto.dev)."""
        self._done("export_chrome_trace")
        from .trace import write_chrome_trace
        return write_chrome_trace(self, path)

    def key_averages(self, group_by_input_shape: bool = False):
        """Per-name totals: calls, total/self time, FLOPs, GFLOP/s (an `EventTable`)."""
        self._done("key_averages")
        from .tables import key_averages
        return key_averages(self, group_by_input_shape)

    def memory_timeline(self):
        """Live bytes over time, the peak and the ops whose arrays make up the peak."""
        self._done("memory_timeline")
        from .memory import memory_timeline
        return memory_timeline(self)

    def advise(self):
        """Findings about this profile, each with its evidence and a fix (the advisor)."""
        self._done("advise")
        from . import advisor
        return advisor.advise(self)


def profile(record_shapes: bool = True, profile_memory: bool = True,
            with_stack: bool = False) -> Profile:
    """A profiling session: ``with sampan.profiler.profile() as prof: ...``.

    >>> import sampan, sampan.profiler
    >>> with sampan.profiler.profile() as prof:
    ...     _ = sampan.ones(8) * 2
    >>> prof.key_averages().table(row_limit=3).splitlines()[0].split()[0]
    'name'
    """
    return Profile(record_shapes, profile_memory, with_stack)


class record:
    """A user range on the timeline: a context manager or a decorator.

    >>> import sampan.profiler
    >>> with sampan.profiler.record("load"):
    ...     pass
    >>> @sampan.profiler.record("step")
    ... def step(): return 1
    """
    __slots__ = ("name", "args", "_spans")

    def __init__(self, name: str, **args):
        self.name, self.args = str(name), args
        self._spans: list = []      # one per entry: the same object may be entered nested

    def __enter__(self):
        s = recorder.span(self.name, "user", **self.args)
        self._spans.append(s)
        return s.__enter__()

    def __exit__(self, *exc):
        return self._spans.pop().__exit__(*exc)

    def __call__(self, fn):
        import functools
        name, args = self.name, self.args

        @functools.wraps(fn)
        def wrapped(*a, **k):
            if not recorder.ACTIVE:
                return fn(*a, **k)
            with recorder.span(name, "user", **args):
                return fn(*a, **k)
        return wrapped
