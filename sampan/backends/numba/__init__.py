"""The numba backend: generated fused CPU kernels (see `kernelgen`).

numba is optional (`pip install 'sampan[jit]'`); without it the fusion pass leaves
graphs unfused and says so once.

Example::

    >>> from sampan.backends import numba as nb
    >>> nb.available(), nb.STATS
"""
from __future__ import annotations

import warnings

_AVAILABLE = None
_WARNED = False

HINT = ("sampan: numba is not installed, so jit runs graphs unfused (one numpy call per "
        "op); install it for fused kernels: pip install 'sampan[jit]'")


class FusionUnavailableWarning(UserWarning):
    """numba is missing: compiled graphs run unfused."""


def available() -> bool:
    """Whether numba imports (checked once per process)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        try:
            import numba  # noqa: F401
            import llvmlite  # noqa: F401
            _AVAILABLE = True
        except ImportError:
            _AVAILABLE = False
    return _AVAILABLE


def warn_unavailable() -> None:
    """Warn, once per process, that fusion is off for lack of numba."""
    global _WARNED
    if not _WARNED:
        _WARNED = True
        warnings.warn(HINT, FusionUnavailableWarning, stacklevel=3)


def __getattr__(name):
    if name in ("STATS", "bind", "kernel_source", "cache_dir", "reset_stats"):
        from . import kernelgen
        return getattr(kernelgen, name)
    raise AttributeError(name)
