"""The sampan error family.

Every error an op raises names the op, what it got, what it expected and the
user's own source line (the first stack frame outside the sampan package).
"""
from __future__ import annotations

import os
import sys

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


class SampanError(Exception):
    """Base class of every error sampan raises on purpose."""


class ShapeError(SampanError, ValueError):
    """An op got tensors whose shapes it cannot take."""


class DynamicShapeError(ShapeError):
    """A call's sizes disagree with the symbolic dims, or a program is not the same for
    every size of a dim marked dynamic (`sampan.jit.dynamic.DynamicShapeError` is this
    class)."""


class DTypeError(SampanError, TypeError):
    """An op got a dtype it cannot take."""


class DeviceError(SampanError, RuntimeError):
    """A device is unavailable or tensors live on different devices."""


class SampanValueError(SampanError, ValueError):
    """An argument has a value an op cannot take."""


class SampanIndexError(SampanError, IndexError):
    """An index (or class id) is out of range for the dim it indexes."""


class AutogradError(SampanError, RuntimeError):
    """Backward cannot run (e.g. a saved tensor was modified in place)."""


class TracingError(SampanError):
    """The traced Python code needs a value that only exists when it runs (raised by
    `sampan.jit`'s tracer and by the IR's traced values; `sampan.jit.TracingError` is this
    class)."""


def user_frame(skip_internal: bool = True):
    """Return (filename, lineno, line) of the innermost frame outside sampan."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if skip_internal and fn.startswith("<sampan-jit-"):
            # code jit generated: the user's line is the traced op's, which the line's
            # trailing comment names (`v3 = ...  # %3: ... = mul(%1, %2)  # model.py:12`)
            loc = _traced_loc(fn, f.f_lineno)
            if loc is not None:
                return loc
        elif not os.path.abspath(fn).startswith(_PKG_DIR) or not skip_internal:
            return fn, f.f_lineno
        f = f.f_back
    return "<unknown>", 0


def _traced_loc(fn, lineno):
    """(file, line) that a line of jit-generated code names in its comment, or None."""
    import linecache
    import re
    m = re.search(r"#\s*([^\s#]+):(\d+)\s*$", linecache.getline(fn, lineno))
    return (m.group(1), int(m.group(2))) if m else None


def user_location() -> str:
    """The user's `file:line` as a string, for messages and IR comments."""
    fn, ln = user_frame()
    return f"{os.path.basename(fn)}:{ln}"


def op_error(cls, op: str, got: str, expected: str, hint: str = "") -> SampanError:
    """Build an error that names the op, what it got, what it expected and the user line."""
    fn, ln = user_frame()
    msg = f"{op}: got {got}; expected {expected}"
    if hint:
        msg += f". {hint}"
    msg += f"\n  at {fn}:{ln}"
    return cls(msg)
