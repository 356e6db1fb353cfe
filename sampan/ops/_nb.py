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


_MATHLIB_HASH = []


def mathlib_hash() -> str:
    """sha256 (hex) of `backends/numba/mathlib.py`'s source, computed once: every cached
    kernel that inlines its functions is keyed on it (numba's own caches through the
    locator below, generated fused kernels in `kernelgen.load_kernel`)."""
    if not _MATHLIB_HASH:
        import hashlib
        import os
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with open(os.path.join(pkg, "backends", "numba", "mathlib.py"), "rb") as f:
            _MATHLIB_HASH.append(hashlib.sha256(f.read()).hexdigest())
    return _MATHLIB_HASH[0]


def _stamp_mathlib_into_caches():
    """numba checks a cached function against its own source file only, but sampan's
    kernels inline mathlib's float32 functions (exp32, erf32, ...): after a change to
    mathlib, caches an older sampan left in __pycache__ (pip leaves numba's files behind)
    would still hold the old formulas. For sampan's files, a locator before each of
    numba's source-file locators adds mathlib's source hash to the stamp numba
    compares. numba's locator list is internal: if it changes shape, nothing is done."""
    import os
    try:
        from numba.core import caching
        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
        classes = impl._locator_classes
        mixin = caching._SourceFileBackedLocatorMixin
    except (ImportError, AttributeError):  # pragma: no cover - another numba layout
        return
    if any(getattr(c, "_sampan", False) for c in classes):
        return
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    extra = mathlib_hash()

    def covering(base):
        class Locator(base):
            _sampan = True

            @classmethod
            def from_function(cls, py_func, py_file):
                if not os.path.abspath(py_file).startswith(pkg + os.sep):
                    return None
                return super().from_function(py_func, py_file)

            def get_source_stamp(self):
                return (super().get_source_stamp(), extra)
        Locator.__name__ = f"Sampan{base.__name__}"
        return Locator
    classes[:] = [c for b in classes
                  for c in ((covering(b), b) if issubclass(b, mixin) else (b,))]


if HAVE_NUMBA:
    _stamp_mathlib_into_caches()


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
