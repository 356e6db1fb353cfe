"""(issue 17) Activations, dropouts and small helpers of `sampan.nn.functional`, with
PyTorch's names and signatures (re-exported through `__all__`).

Every activation is a composite of op-table ops (gradients for free, fusable in jit).
``inplace=True`` writes the result into `input` through the Tensor in-place machinery
(as ``x.relu_()``): the version counter is bumped and autograd records the write, so
gradients stay those of the out-of-place function; the in-place form of a leaf that
requires grad is refused, as in PyTorch."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..ops import composite as _C
from ..ops._util import pick
from ..ops.elementwise import (abs as _abs, add, cast, div, eq, expm1, ge, gt, le, log,
                               lt, mul, neg, sigmoid, softplus_op, sub, tanh, where)
from ..ops.reduce import amax, sum
from ..ops.shape import chunk, reshape
from ..tensor import Tensor
from ._losses import (cosine_embedding_loss, ctc_loss, gaussian_nll_loss,  # noqa: F401
                      hinge_embedding_loss, margin_ranking_loss, multi_margin_loss,
                      multilabel_soft_margin_loss, poisson_nll_loss, soft_margin_loss,
                      triplet_margin_loss, triplet_margin_with_distance_loss)

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _apply(fn, x, inplace, name):
    """fn(x), or with `inplace` fn(x) written into x (returns x). fn runs on a copy when x
    needs a gradient: the composite's inner ops may keep x for their own gradients, and the
    write must not change what they read."""
    x = _t(x)
    if not inplace:
        return fn(x)
    from .._tensor_methods import _inplace
    from ..ops.registry import STATE
    from ..ops.shape import clone
    src = clone(x) if (STATE.grad_enabled and x.requires_grad) else x
    return _inplace(x, fn(src), name)


# ---------------------------------------------------------------------- activations
def relu(input, inplace=False):
    """max(x, 0). Example: ``F.relu(x)``; ``F.relu(x, inplace=True)`` writes into x."""
    from ..ops.elementwise import relu as _relu
    return _apply(_relu, input, inplace, "relu_")


def relu_(input):
    """In-place `relu`."""
    return relu(input, True)


def relu6(input, inplace=False):
    """min(max(x, 0), 6); no gradient at 0 and 6 (PyTorch's). Example: ``F.relu6(x)``."""
    return _apply(lambda x: _hardtanh(x, 0.0, 6.0), input, inplace, "relu6_")


def leaky_relu(input, negative_slope=0.01, inplace=False):
    """x if x > 0 else negative_slope * x. Example: ``F.leaky_relu(x, 0.2)``."""
    return _apply(lambda x: _C.leaky_relu(x, negative_slope), input, inplace, "leaky_relu_")


def leaky_relu_(input, negative_slope=0.01):
    """In-place `leaky_relu`."""
    return leaky_relu(input, negative_slope, True)


def _elu(x, alpha, input_scale=1.0):
    pos = gt(x, 0.0)
    # expm1 of x where x <= 0 (0 elsewhere, so no overflow); at x == 0 the gradient comes
    # from the negative branch (alpha * input_scale), as in PyTorch
    neg_x = where(pos, 0.0, x)
    if input_scale != 1.0:
        neg_x = mul(neg_x, input_scale)
    return where(pos, x, mul(expm1(neg_x), alpha))


def elu(input, alpha=1.0, inplace=False):
    """x if x > 0 else alpha * (exp(x) - 1). Example: ``F.elu(x)``."""
    return _apply(lambda x: _elu(x, alpha), input, inplace, "elu_")


def elu_(input, alpha=1.0):
    """In-place `elu`."""
    return elu(input, alpha, True)


def selu(input, inplace=False):
    """scale * elu(x, alpha) with the self-normalising constants. Example: ``F.selu(x)``."""
    return _apply(lambda x: mul(_elu(x, _SELU_ALPHA), _SELU_SCALE), input, inplace, "selu_")


def celu(input, alpha=1.0, inplace=False):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)). Example: ``F.celu(x, 2.0)``."""
    if alpha == 0:
        raise op_error(SampanValueError, "celu", "alpha=0", "a non-zero alpha")
    return _apply(lambda x: _elu(x, alpha, 1.0 / alpha), input, inplace, "celu_")


def _hardtanh(x, min_val, max_val):
    # the gradient passes strictly inside, none at the bounds (PyTorch's hardtanh, unlike
    # its clamp); NaN stays NaN
    return where(le(x, min_val), min_val, where(ge(x, max_val), max_val, x))


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """Clamp to [min_val, max_val]; no gradient at the bounds. Example: ``F.hardtanh(x)``."""
    if min_val > max_val:
        raise op_error(SampanValueError, "hardtanh", f"min_val={min_val}, max_val={max_val}",
                       "min_val <= max_val")
    return _apply(lambda x: _hardtanh(x, min_val, max_val), input, inplace, "hardtanh_")


def hardtanh_(input, min_val=-1.0, max_val=1.0):
    """In-place `hardtanh`."""
    return hardtanh(input, min_val, max_val, True)


def _hardswish(x):
    # written by branch so the gradient at -3 and 3 is PyTorch's (0 and 1: the outer
    # branches own the bounds)
    mid = div(mul(x, add(x, 3.0)), 6.0)
    return where(le(x, -3.0), mul(x, 0.0), where(lt(x, 3.0), mid, x))


def hardswish(input, inplace=False):
    """x * relu6(x + 3) / 6. Example: ``F.hardswish(x)``."""
    return _apply(_hardswish, input, inplace, "hardswish_")


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6; the gradient is 1/6 strictly inside (-3, 3). Example:
    ``F.hardsigmoid(x)``."""
    return _apply(lambda x: div(_hardtanh(add(x, 3.0), 0.0, 6.0), 6.0), input, inplace,
                  "hardsigmoid_")


def mish(input, inplace=False):
    """x * tanh(softplus(x)). Example: ``F.mish(x)``."""
    return _apply(lambda x: mul(x, tanh(softplus_op(x))), input, inplace, "mish_")


def silu(input, inplace=False):
    """x * sigmoid(x). Example: ``F.silu(x)``."""
    return _apply(_C.silu, input, inplace, "silu_")


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x), stable. Example: ``F.logsigmoid(x)``."""
    return neg(softplus_op(neg(_t(input))))


def softsign(input):
    """x / (1 + |x|). Example: ``F.softsign(x)``."""
    x = _t(input)
    return div(x, add(_abs(x), 1.0))


def tanhshrink(input):
    """x - tanh(x). Example: ``F.tanhshrink(x)``."""
    x = _t(input)
    return sub(x, tanh(x))


def threshold(input, threshold, value, inplace=False):
    """x if x > threshold else value. Example: ``F.threshold(x, 0.1, 20.0)``."""
    return _apply(lambda x: where(gt(x, threshold), x, value), input, inplace, "threshold_")


def threshold_(input, threshold, value):
    """In-place `threshold`."""
    return globals()["threshold"](input, threshold, value, True)


def hardshrink(input, lambd=0.5):
    """x where |x| > lambd, else 0. Example: ``F.hardshrink(x, 0.5)``."""
    x = _t(input)
    return where(gt(_abs(x), lambd), x, mul(x, 0.0))


def softshrink(input, lambd=0.5):
    """x - lambd above lambd, x + lambd below -lambd, 0 between. Example:
    ``F.softshrink(x)``."""
    if lambd < 0:
        raise op_error(SampanValueError, "softshrink", f"lambd={lambd}", "lambd >= 0")
    x = _t(input)
    return where(gt(x, lambd), sub(x, lambd), where(lt(x, -lambd), add(x, lambd), mul(x, 0.0)))


def glu(input, dim=-1, axis=None):
    """a * sigmoid(b) for the two halves a, b of `input` along `dim`. Example:
    ``F.glu(sampan.randn(2, 6)).shape`` is (2, 3)."""
    x = _t(input)
    d = pick("glu", "dim", None if dim == -1 else dim, "axis", axis, -1)
    if x.ndim == 0 or x.shape[d] % 2:
        raise op_error(ShapeError, "glu", f"input of shape {tuple(x.shape)} with dim={d}",
                       "an even size along dim (it is halved)")
    a, b = chunk(x, 2, d)
    return mul(a, sigmoid(b))


def _softmax_dim(ndim):
    # PyTorch's rule when dim is not given (deprecated there, kept for old code)
    return 0 if ndim in (0, 1, 3) else 1


def softmin(input, dim=None, dtype=None, axis=None):
    """softmax(-x) along `dim`. Example: ``F.softmin(x, dim=1)``."""
    x = _t(input)
    d = pick("softmin", "dim", dim, "axis", axis)
    if dtype is not None:
        x = cast(x, dtype)
    return _C.softmax(neg(x), _softmax_dim(x.ndim) if d is None else d)


def prelu(input, weight):
    """x if x > 0 else weight * x, with one weight per channel (dim 1) or one shared.
    Example: ``F.prelu(x, sampan.full((1,), 0.25))``."""
    x, w = _t(input), _t(weight)
    n = w.numel()
    if n != 1:
        c = x.shape[1] if x.ndim >= 2 else (x.shape[0] if x.ndim == 1 else 1)
        if w.ndim != 1 or n != c:
            raise op_error(ShapeError, "prelu", f"weight of shape {tuple(w.shape)} for input "
                           f"{tuple(x.shape)}", f"1 weight or {c} (one per channel of dim 1)")
        if x.ndim >= 2:
            w = reshape(w, (1, n) + (1,) * (x.ndim - 2))
    elif w.ndim:
        w = reshape(w, ())
    return where(gt(x, 0.0), x, mul(x, w))


# ---------------------------------------------------------------------- dropouts
def _check_p(op, p):
    if not 0.0 <= p <= 1.0:
        raise op_error(SampanValueError, op, f"p={p}", "a probability in [0, 1]")


def dropout(input, p=0.5, training=True, inplace=False, generator=None):
    """Zero elements with probability `p` and scale the rest by 1/(1-p) (training only).

    Example: ``F.dropout(x, 0.1, training=model.training)``"""
    _check_p("dropout", p)
    return _apply(lambda x: _C.dropout(x, p, training, generator), input,
                  inplace and training and p > 0, "dropout_")


def _keep_mask(shape, p, dtype, generator):
    from ..ops.random import uniform
    return cast(gt(uniform(tuple(shape), dtype=dtype, generator=generator), p), dtype)


def _feature_dropout(op, x, p, training, inplace, generator, dims):
    """Channel-wise dropout of inputs with `dims` spatial dims: (N, C, *sp) or (C, *sp)."""
    _check_p(op, p)
    x = _t(x)
    if x.ndim not in (dims + 1, dims + 2):
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       f"(N, C, {dims} spatial dims) or (C, {dims} spatial dims)")
    if not training or p == 0.0:
        return x
    lead = x.ndim - dims
    mask_shape = tuple(x.shape[:lead]) + (1,) * dims

    def fn(t):
        if p == 1.0:
            return mul(t, 0.0)
        return mul(t, mul(_keep_mask(mask_shape, p, t.dtype, generator), 1.0 / (1.0 - p)))
    return _apply(fn, x, inplace, op + "_")


def dropout1d(input, p=0.5, training=True, inplace=False, generator=None):
    """Zero whole channels of (N, C, L) or (C, L) with probability p, scale by 1/(1-p).
    Example: ``F.dropout1d(x, 0.2)``."""
    return _feature_dropout("dropout1d", input, p, training, inplace, generator, 1)


def dropout2d(input, p=0.5, training=True, inplace=False, generator=None):
    """Zero whole channels of (N, C, H, W) or (C, H, W). Example: ``F.dropout2d(x, 0.2)``."""
    return _feature_dropout("dropout2d", input, p, training, inplace, generator, 2)


def dropout3d(input, p=0.5, training=True, inplace=False, generator=None):
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W). Example:
    ``F.dropout3d(x, 0.2)``."""
    return _feature_dropout("dropout3d", input, p, training, inplace, generator, 3)


_ALPHA_PRIME = 1.7580993408473766   # -SELU's scale * alpha: where SELU saturates, negated


def _alpha_dropout(op, x, p, training, inplace, generator, feature):
    _check_p(op, p)
    x = _t(x)
    if feature and x.ndim < 2:
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "(N, C, ...) with at least 2 dims")
    if not training or p == 0.0 or x.numel() == 0:
        return x
    mask_shape = (tuple(x.shape[:2]) + (1,) * (x.ndim - 2)) if feature else tuple(x.shape)

    def fn(t):
        if p == 1.0:
            return mul(t, 0.0)
        # kept values: a * x + b; dropped: the SELU saturation value, moved by the same
        # affine map, so mean 0 / variance 1 inputs keep mean 0 and variance 1
        a = 1.0 / math.sqrt((_ALPHA_PRIME ** 2 * p + 1.0) * (1.0 - p))
        keep = _keep_mask(mask_shape, p, t.dtype, generator)
        b = add(mul(sub(keep, 1.0), _ALPHA_PRIME * a), _ALPHA_PRIME * a * p)
        return add(mul(t, mul(keep, a)), b)
    return _apply(fn, x, inplace, op + "_")


def alpha_dropout(input, p=0.5, training=False, inplace=False, generator=None):
    """Dropout for SELU networks: dropped values take SELU's saturation value and the
    result is rescaled so mean and variance are kept. Note PyTorch's default
    ``training=False``. Example: ``F.alpha_dropout(x, 0.2, training=True)``."""
    return _alpha_dropout("alpha_dropout", input, p, training, inplace, generator, False)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False, generator=None):
    """`alpha_dropout` of whole channels of (N, C, ...). Example:
    ``F.feature_alpha_dropout(x, 0.2, training=True)``."""
    return _alpha_dropout("feature_alpha_dropout", input, p, training, inplace, generator,
                          True)


# ---------------------------------------------------------------------- helpers
def normalize(input, p=2.0, dim=1, eps=1e-12, axis=None):
    """x / max(||x||_p, eps) along `dim` (p may be inf); a zero vector has gradient 1/eps
    (PyTorch's value: the norm's gradient is taken as 0 at 0, not 1/0 * 0 = NaN).

    Example: ``F.normalize(sampan.randn(4, 3), dim=1)``"""
    from ..ops.elementwise import clamp, pow as _pow
    x = _t(input)
    d = pick("normalize", "dim", None if dim == 1 else dim, "axis", axis, 1)
    p = float(p)
    if math.isinf(p):
        norm = amax(_abs(x), d, keepdims=True) if p > 0 else _C_amin(_abs(x), d)
    else:
        s = sum(_pow(_abs(x), p), d, keepdims=True)
        zero = eq(s, 0.0)
        norm = where(zero, 0.0, _pow(where(zero, 1.0, s), 1.0 / p))   # a safe root
    return div(x, clamp(norm, min=eps))   # clamp: at norm == eps the norm keeps the gradient


def _C_amin(x, d):
    from ..ops.reduce import amin
    return amin(x, d, keepdims=True)


def one_hot(tensor, num_classes=-1):
    """int64 one-hot vectors of integer class ids (``num_classes=-1``: max id + 1), as
    PyTorch. Example: ``F.one_hot(sampan.tensor([2, 0]), 3)``."""
    return _C.one_hot(tensor, num_classes)


def _finfo(dtype):
    try:
        return np.finfo(dtype)
    except ValueError:   # bfloat16
        import ml_dtypes
        return ml_dtypes.finfo(dtype)


def gumbel_softmax(logits, tau=1.0, hard=False, eps=1e-10, dim=-1, generator=None):
    """Samples from the Gumbel-softmax distribution: softmax((logits + g) / tau) with
    g ~ Gumbel(0, 1). With `hard`, the result is one-hot (argmax) in the forward pass and
    has the soft sample's gradient (straight-through). Example:
    ``F.gumbel_softmax(logits, tau=0.5, hard=True)``."""
    from ..ops.elementwise import clamp
    from ..ops.random import uniform
    x = _t(logits)
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, "gumbel_softmax", f"logits of dtype {x.dtype}",
                       "floating logits")
    u = uniform(tuple(x.shape), dtype=x.dtype, generator=generator)
    fi = _finfo(x.dtype)
    # -log(E) with E = -log(U) ~ Exp(1); U is kept off 0 and 1 so both logs are finite
    g = neg(log(neg(log(clamp(u, min=float(fi.tiny), max=1.0 - float(fi.epsneg))))))
    y = _C.softmax(div(add(x, g), tau), dim)
    if not hard:
        return y
    from ..ops.reduce import argmax
    from ..ops.shape import unsqueeze
    d = dim % x.ndim
    idx = unsqueeze(argmax(y, d), d)
    from ..ops.creation import arange
    shape = [1] * x.ndim
    shape[d] = x.shape[d]
    y_hard = cast(eq(reshape(arange(x.shape[d]), tuple(shape)), idx), y.dtype)
    return add(sub(y_hard, y.detach()), y)


__all__ = ["relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "elu", "elu_", "selu",
           "celu", "hardtanh", "hardtanh_", "hardswish", "hardsigmoid", "mish", "silu",
           "logsigmoid", "softsign", "tanhshrink", "threshold", "threshold_", "hardshrink",
           "softshrink", "glu", "softmin", "prelu", "dropout", "dropout1d", "dropout2d",
           "dropout3d", "alpha_dropout", "feature_alpha_dropout", "normalize", "one_hot",
           "gumbel_softmax", "ctc_loss", "triplet_margin_loss",
           "triplet_margin_with_distance_loss", "margin_ranking_loss", "hinge_embedding_loss",
           "soft_margin_loss", "cosine_embedding_loss", "multilabel_soft_margin_loss",
           "poisson_nll_loss", "gaussian_nll_loss", "multi_margin_loss"]


def _register_composites():
    """The activations join the op harness (forward and gradients vs PyTorch, float64
    gradcheck, second order, eager == jit) as composites."""
    from ..ops._util import Sample, randf, rng
    from ..ops.composite import COMPOSITES

    def one(seed, *shape, low=-4.0, high=4.0):
        return lambda: [Sample((randf(rng(seed), *shape, low=low, high=high),), {})]
    COMPOSITES.update({
        "nn_hardswish": (hardswish, one(171, 4, 5)),
        "nn_hardsigmoid": (hardsigmoid, one(172, 4, 5)),
        "nn_mish": (mish, one(173, 4, 5)),
        "nn_selu": (selu, one(174, 4, 5)),
        "nn_celu": (lambda x: celu(x, 0.7), one(175, 4, 5)),
        "nn_softsign": (softsign, one(176, 4, 5)),
        "nn_logsigmoid": (logsigmoid, one(177, 4, 5)),
        "nn_softshrink": (softshrink, one(178, 4, 5)),
        "nn_glu": (glu, lambda: [Sample((randf(rng(179), 3, 6),), {"dim": 1})]),
        "nn_prelu": (prelu, lambda: [Sample((randf(rng(180), 2, 3, 4),
                                             randf(rng(181), 3, low=0.1, high=0.5)), {})]),
    })


_register_composites()
