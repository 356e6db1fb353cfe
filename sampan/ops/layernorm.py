"""layer_norm over the last axis with a weight and a bias as one op (and its gradient ops),
one pass over the rows each; the row kernels and helpers it shares with softmax and
standardize are in `rowwise`, which re-exports everything here."""
from __future__ import annotations

import numpy as np

from ..tensor import Tensor, apply
from ._util import Sample, lead_size, randf, rng
from .registry import NOT_DIFFERENTIABLE, NO_ONNX, Spec, defop
from .rowwise import _half, _in_f32, _standardize_grad, standardize


# ---------------------------------------------------------------------- layer norm (affine)
# layer_norm over the last axis with a weight and a bias as one op, as PyTorch's
# native_layer_norm: standardize, mul and add recorded three ops and three passes forward,
# and the backward five (standardize_grad, g*w, g*y, and two sums over the rows). Now:
#     y  = (x - mean) * r * w + b,       r = 1/sqrt(var(x) + eps)
#     dx = r * (gw - mean(gw) - xh * mean(gw * xh)),   gw = g * w, xh = (x - mean) * r
#     dw = sum over rows of g * xh,      db = sum over rows of g
# each one pass over the rows (the statistics recomputed from x, nothing saved).
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


@_half
def _ln_grad_x_kernel(x, w, g, eps):
    if not x.size:
        return np.empty(x.shape, x.dtype)
    y, r = _numpy_stats(x, eps)
    gw = g * w
    return r * (gw - gw.mean(-1, keepdims=True) - y * (gw * y).mean(-1, keepdims=True))


@_half
def _ln_grad_w_kernel(x, g, eps):
    y, _ = _numpy_stats(x, eps)
    return _rows(g * y).sum(0)


@_half
def _ln_grad_all_kernel(x, w, g, eps):
    """(dx, dw, db) of layer_norm_affine (one pass where numba is: `ln_bwd` in
    backends/numba/loops/layernorm.py)."""
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
                   kernel=_ln_kernel, grad=_ln_grad, saves=(0, 1), onnx="LayerNormalization",
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
