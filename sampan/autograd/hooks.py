"""The handle every hook registration returns (tensor hooks, layer hooks)."""
from __future__ import annotations

import itertools
import threading


class RemovableHandle:
    """Returned by hook registration; `remove()` unregisters the hook.

    `hooks` is the dict the hook sits in, under the handle's `id`.

    Example::

        >>> h = x.register_hook(lambda g: g * 2)
        >>> h.remove()
    """
    _ids = itertools.count()

    def __init__(self, hooks: dict):
        self._hooks = hooks
        self.id = next(RemovableHandle._ids)

    def remove(self):
        self._hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


# leaves with a ready hook: while none exists the engine skips the bookkeeping entirely
READY = {"leaves": 0}
_TL = threading.local()


def register_grad_ready_hook(t, fn) -> RemovableHandle:
    """Call `fn(t)` during an eager backward as soon as leaf `t`'s `.grad` holds every
    contribution of that backward (torch's post-accumulate-grad hook): data-parallel
    training starts a bucket's all-reduce from it while the rest of backward runs.

    Example::

        >>> h = register_grad_ready_hook(w, lambda t: print(t.grad)); h.remove()
    """
    from ..errors import AutogradError
    if not t.requires_grad or t._node is not None:
        raise AutogradError("register_grad_ready_hook: expected a leaf that requires grad")
    hooks = t.__dict__.get("_ready_hooks")
    if hooks is None:
        hooks = t._ready_hooks = _CountedHooks()
    h = RemovableHandle(hooks)
    hooks[h.id] = fn
    return h


class _CountedHooks(dict):
    """A leaf's ready hooks; keeps READY["leaves"] = how many leaves have at least one."""

    def __setitem__(self, k, v):
        if not self:
            READY["leaves"] += 1
        super().__setitem__(k, v)

    def pop(self, k, *default):
        had = bool(self)
        r = super().pop(k, *default)
        if had and not self:
            READY["leaves"] -= 1
        return r


def current_backward():
    """A token for the eager backward now running on this thread (the same object for
    the whole of it, a new one for the next), or None outside a backward: code that
    keeps state across the grad-ready hooks of one backward tells a new backward from
    the one it started in (DataParallel, when an earlier backward raised)."""
    return getattr(_TL, "queue", None)


def queue_callback(fn) -> None:
    """Run `fn()` once the backward now running on this thread has finished (after every
    leaf's `.grad` is written); outside a backward it runs at once.

    Example::

        >>> queue_callback(lambda: print("backward done"))
    """
    q = getattr(_TL, "queue", None)
    if q is None:
        fn()
    else:
        q.append(fn)
