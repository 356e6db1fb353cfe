"""Dispatch modes: code that sees every op before it runs (the profiler, autocast).

Eager dispatch (`sampan.tensor.apply`) checks one flag, `HOOKS.active`; only while some
mode is pushed does an op go through `dispatch`, which calls the process-wide modes
(the profiler records every thread) and then this thread's own modes (autocast is per
thread, as in PyTorch), each as ``mode(op, inputs, attrs, call_next)``. A mode may change
the inputs (cast them), time the call, or both; it must call ``call_next`` exactly once
and return its result. Ops a mode runs itself (a cast) are dispatched from the top again.
Under `sampan.jit` modes run before the tracer, so a cast a mode inserts is traced.

A mode that casts inputs (autocast) also answers `as_inputs_of`: how it would cast an
operand that PyTorch passes to the op itself and sampan's frontends join to the op's
result with another op (the bias of a convolution or of linear), so that operand follows
the op's policy too. It is the mode's `cast_inputs(op, tensors)` attribute.
"""
from __future__ import annotations

import threading

from .registry import STATE


class _Hooks:
    __slots__ = ("active", "process_modes", "thread_modes_in_use")

    def __init__(self):
        self.active = False             # the one flag the hot path reads
        self.process_modes = ()         # modes for every thread (the profiler)
        self.thread_modes_in_use = 0    # threads with a mode of their own pushed


HOOKS = _Hooks()
_TLS = threading.local()
_LOCK = threading.RLock()   # re-entered when a dying thread's _Counted is collected


class _Counted:
    """Lives in a thread's locals while the thread has modes of its own pushed. A thread
    that ends so (its mode's owner never popped it: a backward raised and the thread
    stopped) must stop counting as a thread with a mode, or every op of the process
    would go through `dispatch` for good: the thread's locals are dropped, and this
    with them."""
    __slots__ = ("armed",)

    def __init__(self):
        self.armed = True

    def __del__(self):
        if self.armed:
            with _LOCK:
                HOOKS.thread_modes_in_use -= 1
                _refresh()


def _refresh():
    HOOKS.active = bool(HOOKS.process_modes) or HOOKS.thread_modes_in_use > 0


def push_mode(mode, *, process_wide: bool = False) -> None:
    """Add `mode` innermost-last: process-wide modes run before every thread's own."""
    with _LOCK:
        if process_wide:
            HOOKS.process_modes = HOOKS.process_modes + (mode,)
        else:
            mine = getattr(_TLS, "modes", ())
            if not mine:
                HOOKS.thread_modes_in_use += 1
                _TLS.counted = _Counted()
            _TLS.modes = mine + (mode,)
        _refresh()


def pop_mode(mode, *, process_wide: bool = False) -> None:
    """Remove `mode` (pushed with the same `process_wide`); a mode not pushed is an error."""
    with _LOCK:
        if process_wide:
            modes = HOOKS.process_modes
        else:
            modes = getattr(_TLS, "modes", ())
        if mode not in modes:
            raise RuntimeError(f"pop_mode: {mode!r} is not pushed")
        i = len(modes) - 1 - modes[::-1].index(mode)
        rest = modes[:i] + modes[i + 1:]
        if process_wide:
            HOOKS.process_modes = rest
        else:
            _TLS.modes = rest
            if not rest:
                HOOKS.thread_modes_in_use -= 1
                _TLS.counted.armed = False
                _TLS.counted = None
        _refresh()


def thread_modes() -> tuple:
    """The modes this thread pushed (outermost first)."""
    return getattr(_TLS, "modes", ())


def dispatch(op, inputs, attrs):
    """Run `op` through every active mode, then the plain dispatch."""
    chain = HOOKS.process_modes + getattr(_TLS, "modes", ())
    return _call(chain, 0, op, inputs, attrs)


def _call(chain, i, op, inputs, attrs):
    if i == len(chain):
        from ..tensor import apply
        st = STATE
        prev, st.hooked = st.hooked, True
        try:
            return apply(op, inputs, attrs)
        finally:
            st.hooked = prev
    return chain[i](op, inputs, attrs,
                    lambda o, ins, at: _call(chain, i + 1, o, ins, at))


def as_inputs_of(op, *tensors):
    """`tensors` cast as the active modes cast `op`'s own inputs (autocast: the op's
    `OpDef.amp` policy), for an operand that is an input of the op in PyTorch and that a
    frontend adds to the op's result: a convolution's or linear's bias computes in the
    autocast dtype as the op does, not promoted back to float32. Without a mode that
    casts, the tensors come back as they are."""
    if HOOKS.active:
        for mode in HOOKS.process_modes + getattr(_TLS, "modes", ()):
            cast = getattr(mode, "cast_inputs", None)
            if cast is not None:
                tensors = tuple(cast(op, tensors))
    return tensors
