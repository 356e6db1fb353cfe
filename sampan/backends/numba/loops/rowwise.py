"""numba row loops of softmax, log-softmax, their gradients and cross-entropy with class
targets (`sampan.ops.rowwise`): one pass per row, float32 rows with mathlib's vectorised
exp32 (as fused jit kernels do), float64 rows with numpy's exp. Half precision computes
in float32 and rounds (the ops' rule); other calls go to the ops' numpy kernels."""
from __future__ import annotations

import numpy as np

from ....ops import rowwise as _r
from ....ops._nb import FASTMATH_IEEE, njit
from ..mathlib import exp32 as _exp32

# FASTMATH_IEEE: reassociation lets LLVM vectorise the row sums and maxima (8x faster
# here); no "finite only" flags, so masked (-inf) entries and NaNs keep IEEE semantics
_FM = FASTMATH_IEEE


def _run_rows(kern, *arrays, **scalars):
    """`kern(rows of each array..., *scalars, out_rows)` into a new array like arrays[0],
    every array viewed as contiguous (rows, last dim)."""
    x = arrays[0]
    out = np.empty(x.shape, x.dtype)
    c = x.shape[-1]
    kern(*(np.ascontiguousarray(a).reshape(-1, c) for a in arrays), *scalars.values(),
         out.reshape(-1, c))
    return out


# Accumulators start from a zero of the row's own type (`zero` below): `x[r, 0] * 0` is
# float64 in numba for float32 x, and the float64 sums made W3's softmax 2x slower.
@njit(inline="always", fastmath=_FM)
def _row_max(x, r):
    # a NaN anywhere still reaches the result: as m here (first element) or through
    # exp(x - m) in the caller's sum; the comparison vectorises where max() did not
    m = x[r, 0]
    for c in range(1, x.shape[1]):
        v = x[r, c]
        m = v if v > m else m
    return m


def _exp_row_fn(expf, zero):
    @njit(inline="always", fastmath=_FM)
    def exp_row(x, r, out):
        """out[r] = e**(x[r] - max(x[r])); returns the max and the sum."""
        m = _row_max(x, r)
        s = zero
        for c in range(x.shape[1]):
            e = expf(x[r, c] - m)
            out[r, c] = e
            s += e
        return m, s
    return exp_row


def _row_kernels(expf, zero):
    exp_row = _exp_row_fn(expf, zero)
    one = zero + 1

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def fwd(x, log, out):
        nr, nc = x.shape
        for r in range(nr):
            m, s = exp_row(x, r, out)
            if log:
                ls = np.log(s)
                for c in range(nc):
                    out[r, c] = (x[r, c] - m) - ls
            else:
                inv = one / s   # a multiply per element, not a division
                for c in range(nc):
                    out[r, c] = out[r, c] * inv

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def bwd(y, g, log, out):
        nr, nc = y.shape
        for r in range(nr):
            s = zero
            if log:
                for c in range(nc):
                    s += g[r, c]
                for c in range(nc):
                    out[r, c] = g[r, c] - expf(y[r, c]) * s
            else:
                for c in range(nc):
                    s += g[r, c] * y[r, c]
                for c in range(nc):
                    out[r, c] = y[r, c] * (g[r, c] - s)
    return fwd, bwd


@njit(inline="always")
def _exp64(x):
    return np.exp(x)


_K = {np.dtype(np.float32): _row_kernels(_exp32, np.float32(0)),
      np.dtype(np.float64): _row_kernels(_exp64, np.float64(0))}


def _softmax_rows(x, log):
    ks = _K.get(x.dtype)
    if ks is not None and x.size:
        return _run_rows(ks[0], x, log=log)
    return _r._softmax_rows(x, log)


def _softmax_grad_rows(y, g, log):
    ks = _K.get(y.dtype)
    if ks is not None and y.size and g.dtype == y.dtype and g.shape == y.shape:
        return _run_rows(ks[1], y, g, log=log)
    return _r._softmax_grad_rows(y, g, log)


def softmax(x):
    return _r._in_f32(_softmax_rows, (x,), False)


def log_softmax(x):
    return _r._in_f32(_softmax_rows, (x,), True)


def softmax_grad(y, g):
    return _r._in_f32(_softmax_grad_rows, (y, g), False)


def log_softmax_grad(y, g):
    return _r._in_f32(_softmax_grad_rows, (y, g), True)


# cross-entropy (see ops/rowwise.py for the formulas)
def _xent_kernels(expf, zero):
    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def fwd(x, t, ignore, out, lse):
        nr, nc = x.shape
        for r in range(nr):
            m = _row_max(x, r)
            s = zero
            for c in range(nc):
                s += expf(x[r, c] - m)
            lse[r] = np.log(s) + m
            out[r] = zero if t[r] == ignore else lse[r] - x[r, t[r]]

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def bwd(x, t, lse, g, h, ignore, out):
        nr, nc = x.shape
        for r in range(nr):
            gr = zero if t[r] == ignore else g[r]
            k = gr + h[r]
            lr = lse[r]
            for c in range(nc):
                out[r, c] = expf(x[r, c] - lr) * k
            if t[r] != ignore:
                out[r, t[r]] -= gr
    return fwd, bwd


_XK = {np.dtype(np.float32): _xent_kernels(_exp32, np.float32(0)),
       np.dtype(np.float64): _xent_kernels(_exp64, np.float64(0))}


def xent(x, t, ignore_index):
    d = x.dtype
    if d.kind != "f" or d.itemsize < 4:
        loss, lse = xent(x.astype(np.float32), t, ignore_index)
        return loss.astype(d), lse.astype(d)
    ks = _XK.get(d)
    if ks is None:
        return _r._xent_kernel(x, t, ignore_index)
    _r._check_targets(x, t, ignore_index)
    out = np.empty(x.shape[0], d)
    lse = np.empty(x.shape[0], d)
    ks[0](np.ascontiguousarray(x), np.ascontiguousarray(t), ignore_index, out, lse)
    return out, lse


def xent_grad(x, t, lse, g, h, ignore_index):
    d = x.dtype
    if d.kind != "f" or d.itemsize < 4:
        f = np.float32
        return xent_grad(x.astype(f), t, lse.astype(f), g.astype(f), h.astype(f),
                         ignore_index).astype(d)
    ks = _XK.get(d)
    if ks is None or g.dtype != d or h.dtype != d or lse.dtype != d:
        return _r._xent_grad_kernel(x, t, lse, g, h, ignore_index)
    _r._check_targets(x, t, ignore_index)   # the loop writes out[r, t[r]] unchecked
    out = np.empty(x.shape, d)
    c = np.ascontiguousarray
    ks[1](c(x), c(t), c(lse), c(g), c(h), ignore_index, out)
    return out


KERNELS = {"softmax": softmax, "log_softmax": log_softmax, "softmax_grad": softmax_grad,
           "log_softmax_grad": log_softmax_grad, "softmax_cross_entropy": xent,
           "softmax_cross_entropy_grad": xent_grad}
