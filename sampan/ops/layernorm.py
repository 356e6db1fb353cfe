"""layer_norm over the last axis with a weight and a bias as one op (and its gradient ops),
one pass over the rows each; the row kernels and helpers it shares with softmax and
standardize are in `rowwise`, which re-exports everything here."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor, apply
from ._nb import HAVE_NUMBA, njit
from ._util import Sample, lead_size, randf, rng
from .registry import NOT_DIFFERENTIABLE, NO_ONNX, Spec, defop
from .rowwise import _FM, _half, _in_f32, _standardize_grad, standardize


# ---------------------------------------------------------------------- layer norm (affine)
# layer_norm over the last axis with a weight and a bias as one op, as PyTorch's
# native_layer_norm: standardize, mul and add recorded three ops and three passes forward,
# and the backward five (standardize_grad, g*w, g*y, and two sums over the rows). Now:
#     y  = (x - mean) * r * w + b,       r = 1/sqrt(var(x) + eps)
#     dx = r * (gw - mean(gw) - xh * mean(gw * xh)),   gw = g * w, xh = (x - mean) * r
#     dw = sum over rows of g * xh,      db = sum over rows of g
# each one pass over the rows (the statistics recomputed from x, nothing saved).
if HAVE_NUMBA:
    def _norm_kernels(ftype):
        """The row kernels for one float type: statistics, sums and constants all in it
        (float64 sums of float32 rows ran at half the vector width, ~2x slower)."""
        zero = ftype(0)
        one = ftype(1)

        @njit(inline="always", fastmath=_FM)
        def stats(x, r, eps):
            # mean and 1/sqrt(var + eps) of row r, two passes
            nc = x.shape[1]
            inv_n = one / ftype(nc)
            s = zero
            for c in range(nc):
                s += x[r, c]
            m = s * inv_n
            q = zero
            for c in range(nc):
                d = x[r, c] - m
                q += d * d
            return m, one / np.sqrt(q * inv_n + eps)

        @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
        def std_fwd(x, eps, out):
            for r in range(x.shape[0]):
                m, rs = stats(x, r, eps)
                for c in range(x.shape[1]):
                    out[r, c] = (x[r, c] - m) * rs

        @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
        def ln_fwd(x, w, b, eps, out):
            for r in range(x.shape[0]):
                m, rs = stats(x, r, eps)
                for c in range(x.shape[1]):
                    out[r, c] = (x[r, c] - m) * rs * w[c] + b[c]

        @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
        def ln_bwd_x(x, w, g, eps, out):
            nc = x.shape[1]
            inv_n = one / ftype(nc)
            for r in range(x.shape[0]):
                m, rs = stats(x, r, eps)
                sg = zero
                sgy = zero
                for c in range(nc):
                    gc = g[r, c] * w[c]
                    sg += gc
                    sgy += gc * ((x[r, c] - m) * rs)
                mg = sg * inv_n
                mgy = sgy * inv_n
                for c in range(nc):
                    y = (x[r, c] - m) * rs
                    out[r, c] = rs * (g[r, c] * w[c] - mg - y * mgy)

        @njit(cache=True, nogil=True, error_model="numpy", fastmath=_FM)
        def ln_bwd_w(x, g, eps, out):
            nc = x.shape[1]
            for c in range(nc):
                out[c] = zero
            for r in range(x.shape[0]):
                m, rs = stats(x, r, eps)
                for c in range(nc):
                    out[c] += g[r, c] * ((x[r, c] - m) * rs)

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
                    gc = g[r, c] * w[c]
                    sg += gc
                    sgy += gc * ((x[r, c] - m) * rs)
                for c in range(nc):
                    gr = g[r, c]
                    dw[c] += gr * ((x[r, c] - m) * rs)
                    db[c] += gr
                mg = sg * inv_n
                mgy = sgy * inv_n
                for c in range(nc):
                    y = (x[r, c] - m) * rs
                    out[r, c] = rs * (g[r, c] * w[c] - mg - y * mgy)
        return std_fwd, ln_fwd, ln_bwd_x, ln_bwd_w, ln_bwd

    _NK = {np.dtype(t): _norm_kernels(t) for t in (np.float32, np.float64)}
else:  # pragma: no cover
    _NK = {}


def _rows(a):
    # an explicit row count: reshape(-1, 0) cannot infer it for rows of length 0
    return np.ascontiguousarray(a).reshape(lead_size(a.shape[:-1]), a.shape[-1])


def _numpy_stats(x, eps):
    """(standardised rows, 1/sqrt(var + eps)) in numpy: the path without numba (and for
    empty inputs: rows of length 0 have no statistics, and none are needed)."""
    if not x.size:
        return np.empty(x.shape, x.dtype), np.ones(x.shape[:-1] + (1,), x.dtype)
    d = x - x.mean(-1, keepdims=True)
    r = 1 / np.sqrt((d * d).mean(-1, keepdims=True) + x.dtype.type(eps))
    return d * r, r


def _ln_rows(x, w, b, eps):
    return _numpy_stats(x, eps)[0] * w + b


def _ln_kernel(x, w, b, eps):
    return _in_f32(_ln_rows, (x, w, b), eps)


def _ln_rows_numba(x, w, b, eps):
    if x.dtype in _NK and x.size:
        out = np.empty(x.shape, x.dtype)
        _NK[x.dtype][1](_rows(x), np.ascontiguousarray(w), np.ascontiguousarray(b),
                        x.dtype.type(eps), out.reshape(-1, x.shape[-1]))
        return out
    return _ln_rows(x, w, b, eps)


def _ln_numba(x, w, b, eps):
    return _in_f32(_ln_rows_numba, (x, w, b), eps)


@_half
def _ln_grad_x_kernel(x, w, g, eps):
    if x.dtype in _NK and x.size and g.shape == x.shape:
        out = np.empty(x.shape, x.dtype)
        _NK[x.dtype][2](_rows(x), np.ascontiguousarray(w), _rows(g), x.dtype.type(eps),
                        out.reshape(-1, x.shape[-1]))
        return out
    if not x.size:
        return np.empty(x.shape, x.dtype)
    y, r = _numpy_stats(x, eps)
    gw = g * w
    return r * (gw - gw.mean(-1, keepdims=True) - y * (gw * y).mean(-1, keepdims=True))


@_half
def _ln_grad_w_kernel(x, g, eps):
    if x.dtype in _NK and x.size and g.shape == x.shape:
        out = np.empty(x.shape[-1], x.dtype)
        _NK[x.dtype][3](_rows(x), _rows(g), x.dtype.type(eps), out)
        return out
    y, _ = _numpy_stats(x, eps)
    return _rows(g * y).sum(0)


@_half
def _ln_grad_all_kernel(x, w, g, eps):
    """(dx, dw, db) of layer_norm_affine in one pass (`ln_bwd`); numpy without numba."""
    c = x.shape[-1]
    if (x.dtype in _NK and x.size and g.shape == x.shape and g.dtype == x.dtype
            and w.dtype == x.dtype):
        out = np.empty(x.shape, x.dtype)
        dw = np.empty(c, x.dtype)
        db = np.empty(c, x.dtype)
        _NK[x.dtype][4](_rows(x), np.ascontiguousarray(w), _rows(g), x.dtype.type(eps),
                        out.reshape(-1, c), dw, db)
        return out, dw, db
    from .reduce import _sum_kernel
    db = _sum_kernel(g, tuple(range(g.ndim - 1))) if g.ndim > 1 else g.copy()
    return (_ln_grad_x_kernel(x, w, g, eps), _ln_grad_w_kernel(x, g, eps), db)


def _ln_rule(name, rows, vecs, out_vec=False):
    """Shape rule: inputs at `rows` are (..., C) of one shape, at `vecs` (C,)."""
    def rule(*specs, eps):
        from ..errors import DTypeError, ShapeError, op_error
        from ._util import same_dtype
        d = same_dtype(name, *specs)
        if not (d.kind == "f" or d.name == "bfloat16"):
            raise op_error(DTypeError, name, f"dtype {d}", "a floating dtype")
        s = tuple(specs[rows[0]].shape)
        if (not s or any(tuple(specs[i].shape) != s for i in rows)
                or any(tuple(specs[i].shape) != s[-1:] for i in vecs)):
            raise op_error(ShapeError, name, f"shapes {[tuple(x.shape) for x in specs]}",
                           "rows (..., C) and weight/bias of shape (C,)")
        return Spec(s[-1:] if out_vec else s, d)
    return rule


def _ln_grad(g, y, x, w, b, eps):
    from ..autograd.engine import is_grad_enabled
    from .reduce import sum as rsum
    lead = tuple(range(len(x.shape) - 1))
    if not is_grad_enabled():
        return apply(LN_GRAD, (x, w, g), {"eps": eps})
    db = rsum(g, lead) if lead else g
    # create_graph: in primitives (standardize is differentiable twice), so that second
    # order works
    from .elementwise import mul
    xh = standardize(x, eps)
    dw = rsum(mul(g, xh), lead) if lead else mul(g, xh)
    return _standardize_grad(mul(g, w), None, x, eps), dw, db


def _ln_samples():
    r = rng(110)
    return [Sample((randf(r, 3, 6), randf(r, 6), randf(r, 6)), {"eps": 1e-5}),
            Sample((randf(r, 2, 3, 4), randf(r, 4), randf(r, 4)), {"eps": 0.1})]


def _ln_gx_samples():
    r = rng(111)
    return [Sample((randf(r, 3, 6), randf(r, 6), randf(r, 3, 6)), {"eps": 1e-5}),
            Sample((randf(r, 2, 3, 4), randf(r, 4), randf(r, 2, 3, 4)), {"eps": 0.1})]


def _ln_gw_samples():
    r = rng(112)
    return [Sample((randf(r, 3, 6), randf(r, 3, 6)), {"eps": 1e-5}),
            Sample((randf(r, 2, 3, 4), randf(r, 2, 3, 4)), {"eps": 0.1})]


LAYER_NORM = defop("layer_norm_affine", _ln_rule("layer_norm_affine", (0,), (1, 2)),
                   kernel=_ln_kernel, kernels={"numba": _ln_numba} if HAVE_NUMBA else {},
                   grad=_ln_grad, saves=(0, 1), onnx="LayerNormalization",
                   flops=lambda x, w, b, eps: 9 * int(np.prod(x.shape)), samples=_ln_samples,
                   amp="float32")
LN_GRAD_X = defop("layer_norm_grad_input", _ln_rule("layer_norm_grad_input", (0, 2), (1,)),
                  kernel=_ln_grad_x_kernel, grad=NOT_DIFFERENTIABLE, onnx=NO_ONNX,
                  flops=lambda x, w, g, eps: 14 * int(np.prod(x.shape)),
                  samples=_ln_gx_samples)
LN_GRAD_W = defop("layer_norm_grad_weight",
                  _ln_rule("layer_norm_grad_weight", (0, 1), (), True),
                  kernel=_ln_grad_w_kernel, grad=NOT_DIFFERENTIABLE, onnx=NO_ONNX,
                  flops=lambda x, g, eps: 9 * int(np.prod(x.shape)), samples=_ln_gw_samples)



def _ln_grad_rule(x, w, g, eps):
    dx = _ln_rule("layer_norm_grad", (0, 2), (1,))(x, w, g, eps=eps)
    return dx, Spec(dx.shape[-1:], dx.dtype), Spec(dx.shape[-1:], dx.dtype)


def _ln_g_samples():
    return [Sample(s.args, s.attrs, diff=()) for s in _ln_gx_samples()]


# the first-order backward: dx, dw and db from one pass (layer_norm_grad_input and
# layer_norm_grad_weight stay for programs saved before it)
LN_GRAD = defop("layer_norm_grad", _ln_grad_rule, kernel=_ln_grad_all_kernel,
                grad=NOT_DIFFERENTIABLE, n_out=3, onnx=NO_ONNX,
                flops=lambda x, w, g, eps: 16 * int(np.prod(x.shape)), samples=_ln_g_samples)


def layer_norm_affine(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """standardize(x, eps) * weight + bias over the last axis, as one op."""
    return apply(LAYER_NORM, (x, weight, bias), {"eps": float(eps)})
