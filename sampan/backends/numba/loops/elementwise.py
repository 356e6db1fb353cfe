"""numba loops of `where`, of sums over leading axes and of float32 <-> bfloat16 casts
(`sampan.ops.elementwise`, `sampan.ops.reduce`): selects, row additions and bit
conversions LLVM vectorises, bit for bit what the ops' numpy kernels compute; other calls
go to those kernels."""
from __future__ import annotations

import math

import numpy as np

from .... import dtypes as _dt
from ....ops import elementwise as _e
from ....ops import reduce as _r
from ....ops._nb import njit, run_flat
from ..mathlib import bf16_store

_FLOATS = {np.dtype(np.float32), np.dtype(np.float64)}
_F32, _BF16 = np.dtype(np.float32), np.dtype(_dt.bfloat16)


@njit(cache=True, nogil=True, error_model="numpy")
def _where_loop(c, a, b, out, full_a, full_b):
    # c repeats every c.size elements of out; a and b are full (out.size) or one value.
    # Both sides are loaded before the select, so LLVM emits a vector blend: numpy's
    # where branches per element and ran 17x slower on random masks here.
    mc = c.size
    av = a[0]
    bv = b[0]
    for r in range(out.size // mc):
        base = r * mc
        if full_a and full_b:
            for j in range(mc):
                x = a[base + j]
                y = b[base + j]
                out[base + j] = x if c[j] else y
        elif full_a:
            for j in range(mc):
                x = a[base + j]
                out[base + j] = x if c[j] else bv
        elif full_b:
            for j in range(mc):
                y = b[base + j]
                out[base + j] = av if c[j] else y
        else:
            for j in range(mc):
                out[base + j] = av if c[j] else bv


def where(c, a, b):
    """np.where through `_where_loop` when the layout allows: a and b of one float dtype,
    each contiguous of the result's shape or a single value, and a contiguous condition
    broadcast only over leading dims."""
    if a.dtype in _FLOATS and b.dtype == a.dtype and c.dtype == np.bool_:
        shape = np.broadcast_shapes(c.shape, a.shape, b.shape)
        n = math.prod(shape)
        full_a, full_b = a.shape == shape, b.shape == shape
        cs = c.shape
        while cs and cs[0] == 1:
            cs = cs[1:]
        if (n and (full_a or a.size == 1) and (full_b or b.size == 1)
                and (not full_a or a.flags.c_contiguous) and (not full_b or b.flags.c_contiguous)
                and c.flags.c_contiguous and c.size and cs == shape[len(shape) - len(cs):]):
            out = np.empty(shape, a.dtype)
            _where_loop(c.reshape(-1), a.reshape(-1), b.reshape(-1), out.reshape(-1),
                        full_a, full_b)
            return out
    return _e._where_kernel(c, a, b)


@njit(cache=True, nogil=True)
def _colsum_loop(a, out):
    # rows added into the output in order, as numpy's reduction over leading axes does
    # (bit-identical), with the column loop vectorised
    nr, nc = a.shape
    for j in range(nc):
        out[j] = a[0, j]
    for i in range(1, nr):
        for j in range(nc):
            out[j] += a[i, j]


def sum_(a, axis=None, keepdims=False):
    """Sums over leading axes (bias and layer-norm gradients) as one pass of row additions:
    numpy's strided reduction ran at about half its speed here."""
    if (a.dtype in _FLOATS and isinstance(axis, tuple) and axis
            and axis == tuple(range(len(axis))) and len(axis) < a.ndim and a.size
            and a.flags.c_contiguous):
        nc = 1
        for d in a.shape[len(axis):]:
            nc *= d
        out = np.empty(a.shape[len(axis):], a.dtype)
        _colsum_loop(a.reshape(-1, nc), out.reshape(-1))
        return out.reshape(_r._red_shape(a, axis, True)) if keepdims else out
    return _r._sum_kernel(a, axis, keepdims)


# float32 -> bfloat16 (what every bf16 GEMM operand under autocast pays) as a loop over
# the bits: ml_dtypes' astype rounds element by element, ~3.5x slower here; the same
# bits: to nearest, ties to even (mathlib's bf16_store), and a NaN as ml_dtypes writes it,
# the quiet NaN of its sign (bf16_store keeps the payload's top bits). Widening
# bfloat16 -> float32 is as fast in ml_dtypes and stays there.
@njit(cache=True, nogil=True, error_model="numpy")
def _to_bf16_loop(a, out):
    for i in range(a.size):
        v = a[i]
        q = bf16_store(v)
        out[i] = (q & np.uint16(0x8000)) | np.uint16(0x7FC0) if v != v else q


def cast(a, dtype):
    if a.dtype == _F32 and a.size and np.dtype(dtype) == _BF16:
        return run_flat(_to_bf16_loop, np.uint16, a).view(_BF16)
    return _e._cast_kernel(a, dtype)


KERNELS = {"where": where, "sum": sum_, "cast": cast}
