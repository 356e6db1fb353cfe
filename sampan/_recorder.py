"""The recorder other subsystems call: one process-wide flag and per-thread buffers.

A low utility (below every floor, as `errors` is): autograd, data, optim, the jit, the
runtime and the Predictor record into it without importing `sampan.profiler`, which sits
on a floor above them; `sampan.profiler.recorder` is this same module.

Every instrumented site is written ``if recorder.ACTIVE: ...`` so that, when nothing is
profiling, the cost is one module attribute read. While a profile is active each thread
appends `Event`s to a list of its own (a plain ``list.append``, atomic under the GIL,
no lock); a thread finds its list through a thread-local that is renewed when a new
session starts, so a buffer left from an earlier session is never written again. The
profile collects every buffer when it stops.

    >>> from sampan.profiler import recorder
    >>> with recorder.span("load", "user", path="x.csv"):
    ...     pass          # records only inside `sampan.profiler.profile()`
"""
from __future__ import annotations

import os
import threading
import time

from ._events import Event

ACTIVE = False          # the one flag every site reads
_GEN = 0                # session number; thread buffers of older sessions are stale
_BUFFERS: list = []     # (tid, thread name, list of Event) of the current session
_LOCK = threading.Lock()
_TLS = threading.local()

now = time.perf_counter_ns
get_ident = threading.get_ident


def _buffer() -> list:
    tls = _TLS
    if getattr(tls, "gen", -1) != _GEN:
        buf: list = []
        with _LOCK:
            _BUFFERS.append((get_ident(), threading.current_thread().name, buf))
        tls.gen, tls.buf = _GEN, buf
    return tls.buf


def emit(name: str, cat: str, ts: int, dur: int = 0, **args) -> None:
    """Record a finished span (or an instant, dur 0) on this thread, if profiling."""
    if ACTIVE:
        _buffer().append(Event(name, cat, ts, dur, get_ident(), args))


def emit_event(ev: Event) -> None:
    """Record an already built event (its tid is kept), if profiling."""
    if ACTIVE:
        _buffer().append(ev)


def instant(name: str, cat: str, **args) -> None:
    """Record an instant event (dur 0) now."""
    if ACTIVE:
        _buffer().append(Event(name, cat, now(), 0, get_ident(), args))


class _Span:
    __slots__ = ("name", "cat", "args", "t0")

    def __init__(self, name, cat, args):
        self.name, self.cat, self.args = name, cat, args

    def __enter__(self):
        self.t0 = now()
        return self

    def __exit__(self, *exc):
        t1 = now()
        if ACTIVE:
            _buffer().append(Event(self.name, self.cat, self.t0, t1 - self.t0, get_ident(),
                                   self.args))
        return False


class _NullSpan:
    """What `span` returns when not profiling: does nothing, records nothing."""
    __slots__ = ()
    args: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


NULL_SPAN = _NullSpan()


def span(name: str, cat: str, **args):
    """A context manager recording one span; `NULL_SPAN` (no cost) when not profiling.
    Args may be added while it runs (``with span(...) as s: s.args["hits"] = 3``)."""
    if ACTIVE:
        return _Span(name, cat, args)
    return NULL_SPAN


# ----------------------------------------------------------------- session control
def start() -> None:
    """Begin a session: fresh buffers, flag on (used by `profile`)."""
    global ACTIVE, _GEN
    with _LOCK:
        _GEN += 1
        _BUFFERS.clear()
        ACTIVE = True


def _after_fork_in_child() -> None:
    """A forked process (a DataLoader process worker) records nothing: its events could
    never reach the profile, and a lock held by another thread at the fork stays held."""
    global ACTIVE, _LOCK, _TLS
    ACTIVE = False
    _LOCK = threading.Lock()
    _TLS = threading.local()
    _BUFFERS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def stop() -> list:
    """End the session: flag off; returns [(tid, thread name, events)] of every thread."""
    global ACTIVE
    with _LOCK:
        ACTIVE = False
        bufs = list(_BUFFERS)
        _BUFFERS.clear()
    return bufs
