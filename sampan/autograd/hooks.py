"""The handle every hook registration returns (tensor hooks, layer hooks)."""
from __future__ import annotations

import itertools


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
