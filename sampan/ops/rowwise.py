"""Softmax, log-softmax and standardisation (layer norm without its affine part) over
the last axis as primitives, in eager mode and under jit (the affine layer norm ops are
in layernorm.py, re-exported here).

The composites in composite.py (max, sub, exp, sum, div ...) run as these ops over the
last axis: one pass per row forward, and a gradient that reads only the output,

    softmax:      dx = y * (g - sum(g * y))
    log_softmax:  dx = g - exp(y) * sum(g)
    standardize:  dx = r * (g - mean(g) - y * mean(g * y)),  r = 1/sqrt(var(x) + eps)

instead of the composite's six to fifteen ops keeping their intermediates. The softmax
gradient ops have closed-form gradients; standardize's gradient runs as one op unless
the backward pass records a graph (create_graph), where it is written with primitives,
so second order works for all three. The kernels here are numpy; where numba is, the
row loops of `backends/numba/loops/rowwise.py` run softmax, log-softmax, their gradients
and cross-entropy (float32 rows with mathlib's vectorised exp32, as fused jit kernels do).

jit traces the ops too rather than the composites' primitives: W3's fused softmax,
log-softmax and layer-norm row kernels (several outputs each, kept for the gradient)
took ~45 ms of fused-kernel time per step, the ops with their neighbours' fused
elementwise kernels ~17 ms. Eager and jit then run the same kernels for them.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..tensor import Tensor, apply
from ._util import Sample, randf, rng
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, Spec, defop

_EMPTY = {}


def _half(k):
    """bfloat16/float16 rows computed in float32 and rounded back."""
    def run(*arrays, **attrs):
        d = arrays[0].dtype
        if d.kind != "f" or d.itemsize < 4:
            out = k(*(a.astype(np.float32) for a in arrays), **attrs)
            return tuple(o.astype(d) for o in out) if isinstance(out, tuple) else out.astype(d)
        return k(*arrays, **attrs)
    return run


def _in_f32(kernel, arrays, *attrs):
    """kernel(*arrays, *attrs), bfloat16/float16 rows computed in float32 and rounded back
    (`_half` as a plain function: the numpy kernels below are copied by `sampan deploy`)."""
    d = arrays[0].dtype
    if d.kind != "f" or d.itemsize < 4:
        return kernel(*(a.astype(np.float32) for a in arrays), *attrs).astype(d)
    return kernel(*arrays, *attrs)


def _softmax_rows(x, log):
    if not x.size:   # no rows, or rows of length 0 (np.max has no identity for those)
        return np.empty(x.shape, x.dtype)
    m = np.max(x, axis=-1, keepdims=True)
    z = x - m
    if log:
        return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def _softmax_kernel(x):
    return _in_f32(_softmax_rows, (x,), False)


def _log_softmax_kernel(x):
    return _in_f32(_softmax_rows, (x,), True)


def _softmax_grad_rows(y, g, log):
    if log:
        return g - np.exp(y) * np.sum(g, axis=-1, keepdims=True)
    return y * (g - np.sum(g * y, axis=-1, keepdims=True))


def _softmax_grad_kernel(y, g):
    return _in_f32(_softmax_grad_rows, (y, g), False)


def _log_softmax_grad_kernel(y, g):
    return _in_f32(_softmax_grad_rows, (y, g), True)


def _rule(name):
    def rule(*specs, **attrs):
        from ..errors import DTypeError, ShapeError, op_error
        from ._util import same_dtype
        d = same_dtype(name, *specs)
        if not (d.kind == "f" or d.name == "bfloat16"):
            raise op_error(DTypeError, name, f"dtype {d}", "a floating dtype")
        s = tuple(specs[0].shape)
        if not s or any(tuple(x.shape) != s for x in specs):
            raise op_error(ShapeError, name, f"shapes {[tuple(x.shape) for x in specs]}",
                           "equal shapes of at least one dim (rows along the last axis)")
        return Spec(s, d)
    return rule


def _sm_grad_grad(c, r, y, g):
    # out = y (g - S), S = sum(g y): d/dg = softmax_grad(y, c); d/dy = c (g - S) - g sum(c y)
    from .elementwise import mul, sub
    from .reduce import sum as rsum
    s = rsum(mul(g, y), -1, keepdims=True)
    t = rsum(mul(c, y), -1, keepdims=True)
    return sub(mul(c, sub(g, s)), mul(g, t)), softmax_grad(y, c)


def _lsm_grad_grad(c, r, y, g):
    # out = g - exp(y) sum(g): d/dg = c - sum(c exp(y)); d/dy = -c exp(y) sum(g)
    from .elementwise import exp, mul, neg, sub
    from .reduce import sum as rsum
    p = exp(y)
    return (neg(mul(mul(c, p), rsum(g, -1, keepdims=True))),
            sub(c, rsum(mul(c, p), -1, keepdims=True)))


def _samples(n_in, lo=-2.0, hi=2.0):
    def samples():
        r = rng(90 + n_in)
        return [Sample(tuple(randf(r, 3, 5, low=lo, high=hi) for _ in range(n_in))),
                Sample(tuple(randf(r, 2, 3, 4, low=lo, high=hi) for _ in range(n_in)))]
    return samples


def _y_samples(log):
    def samples():   # valid outputs y (rows of a softmax / log-softmax), any g
        r = rng(95)
        out = []
        for shape in ((3, 5), (2, 3, 4)):
            x = randf(r, *shape)
            e = np.exp(x - x.max(-1, keepdims=True))
            y = e / e.sum(-1, keepdims=True)
            out.append(Sample((np.log(y) if log else y, randf(r, *shape))))
        return out
    return samples


SOFTMAX = defop("softmax", _rule("softmax"), kernel=_softmax_kernel,
                grad=lambda g, y, x: softmax_grad(y, g), saves=(), save_output=True,
                flops=lambda x: 5 * int(np.prod(x.shape)), onnx="Softmax", samples=_samples(1),
                amp="follow")
SOFTMAX_GRAD = defop("softmax_grad", _rule("softmax_grad"), kernel=_softmax_grad_kernel,
                     grad=_sm_grad_grad, flops=lambda y, g: 4 * int(np.prod(y.shape)),
                     onnx=NO_ONNX, samples=_y_samples(False))
LOG_SOFTMAX = defop("log_softmax", _rule("log_softmax"), kernel=_log_softmax_kernel,
                    grad=lambda g, y, x: log_softmax_grad(y, g), saves=(), save_output=True,
                    flops=lambda x: 5 * int(np.prod(x.shape)), onnx="LogSoftmax",
                    samples=_samples(1), amp="float32")
LOG_SOFTMAX_GRAD = defop("log_softmax_grad", _rule("log_softmax_grad"),
                         kernel=_log_softmax_grad_kernel,
                         grad=_lsm_grad_grad, flops=lambda y, g: 4 * int(np.prod(y.shape)),
                         onnx=NO_ONNX, samples=_y_samples(True))


def _standardize_rows(x, eps):
    return _numpy_stats(x, eps)[0]


def _standardize_kernel(x, eps):
    return _in_f32(_standardize_rows, (x,), eps)


def _standardize_grad_kernel(x, g, eps):
    # layer norm's input gradient with w = 1
    return _ln_grad_x_kernel(x, np.ones(x.shape[-1], x.dtype), g, eps)


def _standardize_grad(g, y, x, eps):
    from ..autograd.engine import is_grad_enabled
    if not is_grad_enabled():
        return apply(STANDARDIZE_GRAD, (x, g), {"eps": eps})
    # create_graph: the same formula in primitives, so it is differentiable again
    from .elementwise import add, mul, rsqrt, sub
    from .reduce import mean
    d = sub(x, mean(x, -1, keepdims=True))
    r = rsqrt(add(mean(mul(d, d), -1, keepdims=True), eps))
    yy = mul(d, r)
    gy = mean(mul(g, yy), -1, keepdims=True)
    return mul(r, sub(sub(g, mean(g, -1, keepdims=True)), mul(yy, gy)))


def _eps_samples(n_in):
    def samples():
        r = rng(97 + n_in)
        return [Sample(tuple(randf(r, 3, 6) for _ in range(n_in)), {"eps": 1e-5}),
                Sample(tuple(randf(r, 2, 3, 4) for _ in range(n_in)), {"eps": 0.1})]
    return samples


STANDARDIZE = defop("standardize", _rule("standardize"), kernel=_standardize_kernel,
                    grad=_standardize_grad, saves=(0,),
                    flops=lambda x, eps: 7 * int(np.prod(x.shape)), onnx=NO_ONNX,
                    samples=_eps_samples(1), amp="float32")
STANDARDIZE_GRAD = defop("standardize_grad", _rule("standardize_grad"),
                         kernel=_standardize_grad_kernel, grad=NOT_DIFFERENTIABLE,
                         flops=lambda x, g, eps: 12 * int(np.prod(x.shape)), onnx=NO_ONNX,
                         samples=_eps_samples(2))


def standardize(x: Tensor, eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the last axis (layer norm without affine)."""
    return apply(STANDARDIZE, (x,), {"eps": float(eps)})


def softmax_grad(y, g):
    """y * (g - sum(g * y, -1)): softmax's input gradient from its output y."""
    return apply(SOFTMAX_GRAD, (y, g), _EMPTY)


def log_softmax_grad(y, g):
    """g - exp(y) * sum(g, -1): log_softmax's input gradient from its output y."""
    return apply(LOG_SOFTMAX_GRAD, (y, g), _EMPTY)


def row_ops(x: Tensor, axis) -> bool:
    """Whether the composites run as these row ops: over the last axis of a floating
    tensor with dims (other axes keep the composite definition). bfloat16 included: its
    rows are computed in float32 and rounded once (the composite rounded every step)."""
    if not x.shape:
        return False
    d = x.dtype
    return axis in (-1, len(x.shape) - 1) and (d.kind == "f" or d == _dt.bfloat16)


def softmax_last(x: Tensor) -> Tensor:
    return apply(SOFTMAX, (x,), _EMPTY)


def log_softmax_last(x: Tensor) -> Tensor:
    return apply(LOG_SOFTMAX, (x,), _EMPTY)


# ---------------------------------------------------------------------- softmax cross-entropy
# Cross-entropy with class-index targets over the rows of (R, C) logits as one op with a
# second output, the row's log-sum-exp (hidden by the frontend), which the gradient reads:
#     lse[r]  = log(sum(exp(x[r])))
#     loss[r] = lse[r] - x[r, t[r]]                       (0 where t[r] == ignore_index)
#     dx[r]   = exp(x[r] - lse[r]) * (g[r] + h[r]) - g[r] * onehot(t[r])
# (g, h: the two outputs' gradients; g counts 0 on ignored rows). The composite
# (log_softmax, ne, where, unsqueeze, take_along_axis, squeeze, neg, where) recorded eight
# ops forward and as many backward and kept the (R, C) log-probabilities; this keeps one
# number per row, and the gradient is one pass with no max or sum to recompute.
def _check_targets(x, t, ignore_index):
    if not t.size or (t.min() >= 0 and t.max() < x.shape[1]):   # the common case: 2 passes
        return
    bad = (t != ignore_index) & ((t < 0) | (t >= x.shape[1]))
    if bad.any():
        from ..errors import ShapeError, op_error
        raise op_error(ShapeError, "softmax_cross_entropy",
                       f"target {int(t[bad][0])} for {x.shape[1]} classes",
                       f"class indices in [0, {x.shape[1]}) or ignore_index={ignore_index}")


def _xent_kernel(x, t, ignore_index):
    _check_targets(x, t, ignore_index)
    d = x.dtype
    if d.kind != "f" or d.itemsize < 4:
        loss, lse = _xent_kernel(x.astype(np.float32), t, ignore_index)
        return loss.astype(d), lse.astype(d)
    valid = t != ignore_index
    safe = np.where(valid, t, 0)
    m = x.max(-1, keepdims=True)
    lse = (np.log(np.exp(x - m).sum(-1)) + m[:, 0]).astype(d)
    pick = np.take_along_axis(x, safe[:, None], 1)[:, 0]
    return np.where(valid, lse - pick, 0).astype(d), lse


def _xent_grad_kernel(x, t, lse, g, h, ignore_index):
    _check_targets(x, t, ignore_index)
    d = x.dtype
    if d.kind != "f" or d.itemsize < 4:
        f = np.float32
        return _xent_grad_kernel(x.astype(f), t, lse.astype(f), g.astype(f), h.astype(f),
                                 ignore_index).astype(d)
    valid = t != ignore_index
    gr = np.where(valid, g, 0)
    p = np.exp(x - lse[:, None]) * (gr + h)[:, None]
    rows = np.arange(x.shape[0])[valid]
    p[rows, t[valid]] -= gr[valid]
    return p.astype(d)


def _xent_rule(x, t, ignore_index):
    from ..errors import DTypeError, ShapeError, op_error
    op = "softmax_cross_entropy"
    if not (x.dtype.kind == "f" or x.dtype.name == "bfloat16"):
        raise op_error(DTypeError, op, f"logits dtype {x.dtype}", "a floating dtype")
    if t.dtype.kind not in "iu":
        raise op_error(DTypeError, op, f"target dtype {t.dtype}", "integer class indices")
    if len(x.shape) != 2 or len(t.shape) != 1 or x.shape[0] != t.shape[0]:
        raise op_error(ShapeError, op, f"logits {tuple(x.shape)}, target {tuple(t.shape)}",
                       "logits (N, C) and target (N,)")
    return Spec((x.shape[0],), x.dtype), Spec((x.shape[0],), x.dtype)


def _xent_grad_rule(x, t, lse, g, h, ignore_index):
    row = _xent_rule(x, t, ignore_index)[0]
    for v in (lse, g, h):
        if tuple(v.shape) != tuple(row.shape) or v.dtype != x.dtype:
            from ..errors import ShapeError, op_error
            raise op_error(ShapeError, "softmax_cross_entropy_grad",
                           f"row values of shape {tuple(v.shape)}, dtype {v.dtype}",
                           f"{tuple(row.shape)} of {x.dtype}")
    return Spec(tuple(x.shape), x.dtype)


def _xent_grad(gs, ys, x, t, ignore_index):
    from ..autograd.engine import is_grad_enabled
    g, h = gs
    if not is_grad_enabled():
        return apply(XENT_GRAD, (x, t, ys[1], g, h), {"ignore_index": ignore_index}), None
    # create_graph: the same gradient in primitives, differentiable again
    from .creation import arange
    from .elementwise import add, cast, eq, mul, ne, sub
    from .shape import unsqueeze
    onehot = cast(eq(unsqueeze(t, -1), arange(x.shape[1])), x.dtype)
    w = mul(g, cast(ne(t, ignore_index), x.dtype))
    p = softmax_last(x)
    return sub(mul(p, unsqueeze(add(w, h), -1)), mul(onehot, unsqueeze(w, -1))), None


def _xent_samples():
    r = rng(99)
    return [Sample((randf(r, 4, 5), np.array([0, 4, 2, -100])), {"ignore_index": -100}),
            Sample((randf(r, 3, 7), np.array([6, 1, 3])), {"ignore_index": 1})]


def _xent_grad_samples():
    out = []
    for s in _xent_samples():
        x, t = s.args
        lse = _xent_kernel(x, t, **s.attrs)[1]
        r = rng(98)
        out.append(Sample((x, t, lse, randf(r, x.shape[0]), randf(r, x.shape[0])), s.attrs))
    return out


XENT = defop("softmax_cross_entropy", _xent_rule, kernel=_xent_kernel, grad=_xent_grad,
             n_out=2, saves=(0, 1), save_output=True,
             flops=lambda x, t, ignore_index: 4 * int(np.prod(x.shape)),
             onnx=NO_ONNX, samples=_xent_samples, nondiff_inputs=(1,), amp="float32")
XENT_GRAD = defop("softmax_cross_entropy_grad", _xent_grad_rule, kernel=_xent_grad_kernel,
                  grad=NOT_DIFFERENTIABLE,
                  flops=lambda x, t, lse, g, h, ignore_index: 4 * int(np.prod(x.shape)),
                  onnx=NO_ONNX, samples=_xent_grad_samples, nondiff_inputs=(1,))


def softmax_cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100) -> Tensor:
    """Per-row cross-entropy of (N, C) logits against (N,) class indices; rows whose
    target is `ignore_index` give 0."""
    return apply(XENT, (logits, target), {"ignore_index": int(ignore_index)})[0]


# the affine layer norm ops are in layernorm.py; their names stay importable here
from .layernorm import (  # noqa: E402,F401
    LAYER_NORM, LN_GRAD, LN_GRAD_W, LN_GRAD_X, _ln_grad_x_kernel, _numpy_stats,
    layer_norm_affine)
