"""numpy's own OpenBLAS, called from inside numba kernels: `sgemm` on addresses and strides.

numba's ``np.dot`` needs scipy's BLAS; sampan's core depends on numpy alone, and numpy's
Linux wheels carry an OpenBLAS of their own (``numpy.libs/libscipy_openblas64_*.so``,
ILP64). `find()` locates it among the process's loaded libraries (``/proc/self/maps``)
and returns a `Blas` holding the addresses of ``cblas_sgemm`` and
``openblas_set_num_threads_local``; a kernel receives those addresses as int64 arguments
and calls them through `sgemm` / `set_threads_local` below (intrinsics: an indirect call
through the address, so the kernel stays cacheable: no ctypes object is baked into it).

A kernel that calls sgemm from numba's worker threads sets the calling thread's OpenBLAS
thread count to 1 first and restores it after (``set_threads_local``): OpenBLAS would
otherwise split each small product over its own pool from inside numba's, which measured
~1.5x slower at W8's attention. Where numpy's BLAS is not OpenBLAS (an MKL or Accelerate
build) or has no thread-local count, `find()` returns None and callers keep their loops.

Example::

    >>> b = find()
    >>> b is None or b.ilp64 in (True, False)
    True
"""
from __future__ import annotations

import ctypes
import os
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112      # CBLAS enums

# (sgemm symbol, ILP64) in the order tried: numpy >= 2's scipy-openblas, numpy 1.x's
# openblas64_, a plain LP64 OpenBLAS
_SGEMM = (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("cblas_sgemm", False))
_LOCAL = ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_")


class Blas(NamedTuple):
    path: str
    sgemm: int            # address of cblas_sgemm
    set_local: int        # address of openblas_set_num_threads_local
    ilp64: bool           # 64-bit integer arguments


_FOUND: list = []


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
                addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                return Blas(path, addr, ctypes.cast(local, ctypes.c_void_p).value, ilp64)
    return None


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


@intrinsic
def set_threads_local(typingctx, addr, n):
    """openblas_set_num_threads_local(n) at `addr` for the calling thread; returns the
    count it had."""
    if addr != types.int64 or n != types.int64:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(i32, [i32])
        fp = builder.inttoptr(args[0], fnty.as_pointer())
        r = builder.call(fp, [builder.trunc(args[1], i32)])
        return builder.sext(r, ir.IntType(64))
    return types.int64(types.int64, types.int64), codegen
