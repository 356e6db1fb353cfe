"""`inference_mode`: no_grad for code that only evaluates, spelled as in PyTorch.

No tape is recorded inside it (the cost that matters on CPU); unlike PyTorch, tensors
made inside are ordinary tensors (there is no separate "inference tensor" kind), so
using them later under grad mode is allowed."""
from __future__ import annotations

import functools
import threading

from ..ops.registry import STATE


class _Flag(threading.local):
    def __init__(self):
        self.on = False


_FLAG = _Flag()


class inference_mode:
    """Context manager and decorator: run without recording a tape.
    ``inference_mode(False)`` leaves grad mode as it is (as PyTorch).

    Example::

        >>> with sampan.inference_mode():
        ...     y = model(x)            # y has no history
        >>> @sampan.inference_mode()
        ... def predict(x): return model(x)
    """

    def __new__(cls, mode=True):
        if callable(mode) and not isinstance(mode, bool):   # @sampan.inference_mode, bare
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode=True):
        self.mode = bool(mode)

    def __enter__(self):
        self._prev = (STATE.grad_enabled, _FLAG.on)
        if self.mode:
            STATE.grad_enabled = False
        _FLAG.on = self.mode
        return None

    def __exit__(self, *exc):
        STATE.grad_enabled, _FLAG.on = self._prev
        return False

    def __call__(self, func):
        mode = self.mode

        @functools.wraps(func)
        def wrapper(*a, **k):
            with inference_mode(mode):
                return func(*a, **k)
        return wrapper


def is_inference_mode_enabled() -> bool:
    """Whether code runs inside ``sampan.inference_mode()``."""
    return _FLAG.on
