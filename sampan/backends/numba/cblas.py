"""numpy's own OpenBLAS, called from inside numba kernels: `sgemm` on addresses and strides.

numba's ``np.dot`` needs scipy's BLAS; sampan's core depends on numpy alone, and numpy's
Linux wheels carry an OpenBLAS of their own (``numpy.libs/libscipy_openblas64_*.so``,
ILP64). `find()` locates it among the process's loaded libraries (``/proc/self/maps``)
and returns a `Blas` holding the address of ``cblas_sgemm``; a kernel receives it as an
int64 argument and calls it through `sgemm64` / `sgemm32` below (intrinsics: an indirect
call through the address, so the kernel stays cacheable: no ctypes object is baked in).

A kernel that calls sgemm from numba's worker threads runs inside `one_thread()`:
OpenBLAS would otherwise split each small product over its own pool from inside numba's
(~1.5x slower at W8's attention). OpenBLAS's thread count is process-wide
(``openblas_set_num_threads_local`` sets the global count and returns the previous one,
whatever its name says: measured), so `one_thread` sets it once for all the kernels
running at a time, under a lock with a count of them, and the last one out restores it.
Where numpy's BLAS is not OpenBLAS (an MKL or Accelerate build) or lacks that function,
`find()` returns None and callers keep their loops.

Example::

    >>> b = find()
    >>> b is None or b.ilp64 in (True, False)
    True
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112      # CBLAS enums

# (sgemm symbol, ILP64) in the order tried: numpy >= 2's scipy-openblas, numpy 1.x's
# openblas64_, a plain LP64 OpenBLAS
_SGEMM = (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("cblas_sgemm", False))
_LOCAL = ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_")


class Blas(NamedTuple):
    path: str
    sgemm: int            # address of cblas_sgemm
    set_count: object     # openblas_set_num_threads_local (ctypes): set, return previous
    ilp64: bool           # 64-bit integer arguments


_FOUND: list = []
_LOCK = threading.Lock()
_INSIDE = [0, None]       # kernels inside one_thread(), the count to restore


def _loaded_openblas():
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "openblas" in ln.lower() and "/" in ln}
    except OSError:
        return []
    here = os.path.realpath(os.path.join(os.path.dirname(np.__file__), os.pardir))
    # numpy's own copy first (others may be scipy's or torch's)
    return sorted(paths, key=lambda p: not os.path.realpath(p).startswith(here))


def find():
    """numpy's OpenBLAS as a `Blas`, or None where it cannot be called from kernels
    (``SAMPAN_KERNEL_BLAS=0`` also gives None)."""
    if not _FOUND:
        _FOUND.append(None if os.environ.get("SAMPAN_KERNEL_BLAS", "1") == "0" else _find())
    return _FOUND[0]


def _find():
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        local = next((getattr(lib, n) for n in _LOCAL if hasattr(lib, n)), None)
        for name, ilp64 in _SGEMM:
            if local is not None and hasattr(lib, name):
                local.argtypes, local.restype = [ctypes.c_int], ctypes.c_int
                addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                return Blas(path, addr, local, ilp64)
    return None


@contextlib.contextmanager
def one_thread():
    """OpenBLAS at one thread while the block runs (for kernels calling sgemm from many
    threads); the count it had comes back when the last such block still running ends."""
    lib = find()
    with _LOCK:
        if _INSIDE[0] == 0:
            _INSIDE[1] = lib.set_count(1)
        _INSIDE[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _INSIDE[0] -= 1
            if _INSIDE[0] == 0:
                lib.set_count(_INSIDE[1])


def _call_sgemm(ilp64):
    def typer(typingctx, addr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        ints = (addr, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
        if not all(t == types.int64 for t in ints) or alpha != types.float32 \
                or beta != types.float32:
            return None

        def codegen(context, builder, sig, args):
            i32, iw, f32 = ir.IntType(32), ir.IntType(64 if ilp64 else 32), ir.FloatType()
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, iw, iw, iw, f32, ir.IntType(64),
                                                   iw, ir.IntType(64), iw, f32, ir.IntType(64),
                                                   iw])
            fp = builder.inttoptr(args[0], fnty.as_pointer())

            def w(v):
                return v if ilp64 else builder.trunc(v, iw)
            _, ta_, tb_, m_, n_, k_, al, a_, lda_, b_, ldb_, be, c_, ldc_ = args
            builder.call(fp, [ir.Constant(i32, ROW_MAJOR), builder.trunc(ta_, i32),
                              builder.trunc(tb_, i32), w(m_), w(n_), w(k_), al, a_, w(lda_), b_,
                              w(ldb_), be, c_, w(ldc_)])
            return context.get_dummy_value()
        return types.void(*([types.int64] * 6 + [types.float32] + [types.int64] * 4
                            + [types.float32] + [types.int64] * 2)), codegen
    typer.__name__ = f"sgemm{64 if ilp64 else 32}"
    return intrinsic(typer)


sgemm64 = _call_sgemm(True)
"""sgemm64(addr, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc): row-major
C = alpha op(A) op(B) + beta C through the ILP64 cblas_sgemm at `addr` (ints int64,
alpha/beta float32, a/b/c addresses as int64)."""
sgemm32 = _call_sgemm(False)
"""As `sgemm64`, through an LP64 cblas_sgemm (the ints passed as 32 bits)."""


@njit(inline="always")
def sgemm(addr, ilp64, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """`sgemm64` or `sgemm32` as `ilp64` says (`Blas.ilp64`), for kernels built for both."""
    if ilp64:
        sgemm64(addr, np.int64(transa), np.int64(transb), m, n, k, alpha, a, lda, b, ldb,
                beta, c, ldc)
    else:
        sgemm32(addr, np.int64(transa), np.int64(transb), m, n, k, alpha, a, lda, b, ldb,
                beta, c, ldc)
