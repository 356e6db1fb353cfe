"""numba row loops of layer norm and standardisation (`sampan.ops.layernorm`,
`sampan.ops.rowwise`): statistics, forward and gradients one pass over the rows each,
in the rows' own float type. Half precision computes in float32 and rounds (the ops'
rule; bfloat16 rows through the same loops over their bits, `rowwise.py`'s `load` /
`store`); other calls go to the ops' numpy kernels."""
from __future__ import annotations

import numpy as np

from ....ops import layernorm as _l
from ....ops import rowwise as _r
from ....ops._nb import njit
from ..mathlib import bf16_load, bf16_store
from .rowwise import _BF16, _FM, _run_rows, _same, bits, is_bf16


def _norm_kernels(ftype, load=_same, store=_same):
    """The row kernels for one float type: statistics, sums and constants all in it
    (float64 sums of float32 rows ran at half the vector width, ~2x slower); `load` /
    `store` as in rowwise.py (bfloat16 bits: float32 inside, each output rounded once;
    the weight gradients' accumulators `dw`, `db` stay float32)."""
    zero = ftype(0)
    one = ftype(1)

    @njit(inline="always", fastmath=_FM)
    def stats(x, r, eps):
        # mean and 1/sqrt(var + eps) of row r, two passes
        nc = x.shape[1]
        inv_n = one / ftype(nc)
        s = zero
        for c in range(nc):
            s += load(x[r, c])
        m = s * inv_n
        q = zero
        for c in range(nc):
            d = load(x[r, c]) - m
            q += d * d
        return m, one / np.sqrt(q * inv_n + eps)

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def std_fwd(x, eps, out):
        for r in range(x.shape[0]):
            m, rs = stats(x, r, eps)
            for c in range(x.shape[1]):
                out[r, c] = store((load(x[r, c]) - m) * rs)

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def ln_fwd(x, w, b, eps, out):
        for r in range(x.shape[0]):
            m, rs = stats(x, r, eps)
            for c in range(x.shape[1]):
                out[r, c] = store((load(x[r, c]) - m) * rs * load(w[c]) + load(b[c]))

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def ln_bwd_x(x, w, g, eps, out):
        nc = x.shape[1]
        inv_n = one / ftype(nc)
        for r in range(x.shape[0]):
            m, rs = stats(x, r, eps)
            sg = zero
            sgy = zero
            for c in range(nc):
                gc = load(g[r, c]) * load(w[c])
                sg += gc
                sgy += gc * ((load(x[r, c]) - m) * rs)
            mg = sg * inv_n
            mgy = sgy * inv_n
            for c in range(nc):
                y = (load(x[r, c]) - m) * rs
                out[r, c] = store(rs * (load(g[r, c]) * load(w[c]) - mg - y * mgy))

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def ln_bwd_w(x, g, eps, out):
        nc = x.shape[1]
        for c in range(nc):
            out[c] = zero
        for r in range(x.shape[0]):
            m, rs = stats(x, r, eps)
            for c in range(nc):
                out[c] += load(g[r, c]) * ((load(x[r, c]) - m) * rs)

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
    def ln_bwd(x, w, g, eps, out, dw, db):
        # ln_bwd_x, ln_bwd_w and the column sum of g in one pass over the rows, with
        # the same formulas as those kernels (statistics computed once per row)
        nc = x.shape[1]
        inv_n = one / ftype(nc)
        for c in range(nc):
            dw[c] = zero
            db[c] = zero
        for r in range(x.shape[0]):
            m, rs = stats(x, r, eps)
            sg = zero
            sgy = zero
            # the row sums and the column accumulations in two loops: one loop
            # doing both ran 0.46 ms per W3 call, these two 0.39 ms
            for c in range(nc):
                gc = load(g[r, c]) * load(w[c])
                sg += gc
                sgy += gc * ((load(x[r, c]) - m) * rs)
            for c in range(nc):
                gr = load(g[r, c])
                dw[c] += gr * ((load(x[r, c]) - m) * rs)
                db[c] += gr
            mg = sg * inv_n
            mgy = sgy * inv_n
            for c in range(nc):
                y = (load(x[r, c]) - m) * rs
                out[r, c] = store(rs * (load(g[r, c]) * load(w[c]) - mg - y * mgy))
    return std_fwd, ln_fwd, ln_bwd_x, ln_bwd_w, ln_bwd

_NK = {np.dtype(t): _norm_kernels(t) for t in (np.float32, np.float64)}
_NKB = _norm_kernels(np.float32, bf16_load, bf16_store)       # bfloat16 bits


def _standardize_rows(x, eps):
    if x.dtype in _NK and x.size:
        return _run_rows(_NK[x.dtype][0], x, eps=x.dtype.type(eps))
    return _r._standardize_rows(x, eps)


def _f32(eps):
    return np.float32(eps)


def _vec16(v, c):
    """A bfloat16 vector of length c as its uint16 bits (None if it is not one)."""
    if v.dtype != _BF16 or v.shape != (c,):
        return None
    return np.ascontiguousarray(v).view(np.uint16)


def standardize(x, eps):
    if is_bf16(x):
        out = np.empty(x.shape, _BF16)
        _NKB[0](bits(x), _f32(eps), bits(out))
        return out
    return _r._in_f32(_standardize_rows, (x,), eps)


def _ln_rows(x, w, b, eps):
    if x.dtype in _NK and x.size:
        out = np.empty(x.shape, x.dtype)
        _NK[x.dtype][1](_l._rows(x), np.ascontiguousarray(w), np.ascontiguousarray(b),
                        x.dtype.type(eps), out.reshape(-1, x.shape[-1]))
        return out
    return _l._ln_rows(x, w, b, eps)


def layer_norm_affine(x, w, b, eps):
    c = x.shape[-1] if x.ndim else 0
    if is_bf16(x) and _vec16(w, c) is not None and _vec16(b, c) is not None:
        out = np.empty(x.shape, _BF16)
        _NKB[1](bits(x), _vec16(w, c), _vec16(b, c), _f32(eps), bits(out))
        return out
    return _r._in_f32(_ln_rows, (x, w, b), eps)


def ln_grad_x(x, w, g, eps):
    c = x.shape[-1] if x.ndim else 0
    if is_bf16(x, g) and _vec16(w, c) is not None:
        out = np.empty(x.shape, _BF16)
        _NKB[2](bits(x), _vec16(w, c), bits(g), _f32(eps), bits(out))
        return out
    return _ln_grad_x(x, w, g, eps=eps)


def ln_grad_w(x, g, eps):
    if is_bf16(x, g):
        out = np.empty(x.shape[-1], np.float32)       # float32 sums, rounded once
        _NKB[3](bits(x), bits(g), _f32(eps), out)
        return out.astype(_BF16)
    return _ln_grad_w(x, g, eps=eps)


@_r._half
def _ln_grad_x(x, w, g, eps):
    if x.dtype in _NK and x.size and g.shape == x.shape:
        out = np.empty(x.shape, x.dtype)
        _NK[x.dtype][2](_l._rows(x), np.ascontiguousarray(w), _l._rows(g), x.dtype.type(eps),
                        out.reshape(-1, x.shape[-1]))
        return out
    return _l._ln_grad_x_kernel(x, w, g, eps)


@_r._half
def _ln_grad_w(x, g, eps):
    if x.dtype in _NK and x.size and g.shape == x.shape:
        out = np.empty(x.shape[-1], x.dtype)
        _NK[x.dtype][3](_l._rows(x), _l._rows(g), x.dtype.type(eps), out)
        return out
    return _l._ln_grad_w_kernel(x, g, eps)


def ln_grad(x, w, g, eps):
    """(dx, dw, db) of layer_norm_affine in one pass (`ln_bwd`)."""
    c = x.shape[-1] if x.ndim else 0
    if is_bf16(x, g) and _vec16(w, c) is not None:
        out = np.empty(x.shape, _BF16)
        dw = np.empty(c, np.float32)                    # float32 sums, rounded once
        db = np.empty(c, np.float32)
        _NKB[4](bits(x), _vec16(w, c), bits(g), _f32(eps), bits(out), dw, db)
        return out, dw.astype(_BF16), db.astype(_BF16)
    return _ln_grad(x, w, g, eps=eps)


@_r._half
def _ln_grad(x, w, g, eps):
    c = x.shape[-1]
    if (x.dtype in _NK and x.size and g.shape == x.shape and g.dtype == x.dtype
            and w.dtype == x.dtype):
        out = np.empty(x.shape, x.dtype)
        dw = np.empty(c, x.dtype)
        db = np.empty(c, x.dtype)
        _NK[x.dtype][4](_l._rows(x), np.ascontiguousarray(w), _l._rows(g), x.dtype.type(eps),
                        out.reshape(-1, c), dw, db)
        return out, dw, db
    from ....ops.reduce import _sum_kernel
    db = _sum_kernel(g, tuple(range(g.ndim - 1))) if g.ndim > 1 else g.copy()
    return ln_grad_x(x, w, g, eps), ln_grad_w(x, g, eps), db


def standardize_grad(x, g, eps):
    # layer norm's input gradient with w = 1
    return ln_grad_x(x, np.ones(x.shape[-1], x.dtype), g, eps)


KERNELS = {"standardize": standardize, "standardize_grad": standardize_grad,
           "layer_norm_affine": layer_norm_affine, "layer_norm_grad_input": ln_grad_x,
           "layer_norm_grad_weight": ln_grad_w, "layer_norm_grad": ln_grad}
