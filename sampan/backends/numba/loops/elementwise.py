"""numba loops of `where` and of sums over leading axes (`sampan.ops.elementwise`,
`sampan.ops.reduce`): selects and row additions LLVM vectorises, bit for bit what the
ops' numpy kernels compute; other calls go to those kernels."""
from __future__ import annotations

import math

import numpy as np

from ....ops import elementwise as _e
from ....ops import reduce as _r
from ....ops._nb import njit

_FLOATS = {np.dtype(np.float32), np.dtype(np.float64)}


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


KERNELS = {"where": where, "sum": sum_}
