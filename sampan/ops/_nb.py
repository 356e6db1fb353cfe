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


# fastmath flags that let LLVM reorder float arithmetic (to vectorise sums, maxima and
# polynomials) but not assume finite values: -inf masks and NaN keep IEEE semantics
FASTMATH_IEEE = {"reassoc", "nsz", "arcp", "contract"}


def run_flat(loop, out_dtype, *arrays, **kw):
    """`loop(a0.ravel(), ..., out.ravel())` into a new contiguous array of `arrays[0]`'s
    shape: the calling convention of the one-pass elementwise loops."""
    import numpy as np
    out = np.empty(arrays[0].shape, out_dtype)
    loop(*(np.ascontiguousarray(a).reshape(-1) for a in arrays), out.reshape(-1), **kw)
    return out
