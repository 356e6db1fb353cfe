"""Optional numba for eager kernels whose numpy form is slow (a scatter, a branchy select).

numba is the `jit` extra: without it `njit` returns the function unchanged and callers
take their numpy path (`HAVE_NUMBA` says which). Kernels here are plain loops written
for one op each; the generated kernels of fused graphs live in `backends/numba`.
"""
from __future__ import annotations

try:
    from numba import njit
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised by the no-numba CI variant
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f
