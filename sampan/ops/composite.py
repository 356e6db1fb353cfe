"""Composite ops: ordinary functions over primitives. They have no gradient rule of
their own (autograd differentiates the primitives) and in compiled mode the fusion
pass earns their speed back.

Each composite lists test samples in `COMPOSITES` so the op harness checks it
like a primitive (forward vs PyTorch, gradcheck, second order)."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..ir.symint import as_float, deciding
from ..tensor import Tensor
from ._util import Sample, pick, randf, rng
from .elementwise import (add, cast, div, erf, exp, gt, log, mul, rsqrt, sigmoid, sub, tanh,
                          where)
from .reduce import amax, mean, sum
from .registry import STATE
from .rowwise import layer_norm_affine, row_ops, log_softmax_last, softmax_last, standardize
from .shape import reshape


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _empty_axis(x, axis):
    """Whether one of the reduced axes has length 0 (known while tracing too, unless
    symbolic): the max that stabilises exp has no value there, as in PyTorch."""
    from ._util import norm_axis
    with deciding():
        return any(x.shape[a] == 0 for a in norm_axis(axis, x.ndim, "logsumexp"))


def _dim(op, dim, axis, default=-1):
    if axis is not None:
        return axis if dim is None else pick(op, "dim", dim, "axis", axis)
    return default if dim is None else dim


def logsumexp(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """log(sum(exp(x))) over `dim` (default -1) computed stably; -inf over an empty axis
    (PyTorch's value). Example: ``sampan.logsumexp(x, dim=1)``."""
    axis = _dim("logsumexp", dim, axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("logsumexp", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    if _empty_axis(x, axis):   # log(0): the sum of no terms, written without a log
        r = add(sum(x, axis, keepdims=True), float("-inf"))
    else:
        m = amax(x, axis, keepdims=True).detach()
        r = add(log(sum(exp(sub(x, m)), axis, keepdims=True)), m)
    return r if keepdim else _squeeze_axis(r, axis)


def _squeeze_axis(r, axis):
    from .shape import squeeze
    return squeeze(r, axis)


def _as_float(x, dtype):
    """softmax's `dtype=`: the input cast first, as PyTorch (to stop a float16 overflow)."""
    x = _t(x)
    if dtype is not None and _dt.as_dtype(dtype) != x.dtype:
        x = cast(x, dtype)
    return x


def softmax(x, dim=None, dtype=None, *, axis=None):
    """exp(x) / sum(exp(x)) along `dim` (default -1), computed stably (the last axis: the
    `softmax` row op, see rowwise.py). An empty axis gives an empty result, as in PyTorch.
    Example: ``sampan.softmax(logits, dim=1)``."""
    if axis is not None:
        axis = axis if dim is None else pick("softmax", "dim", dim, "axis", axis)
    else:
        axis = -1 if dim is None else dim
    if dtype is not None or type(x) is not Tensor:
        x = _as_float(x, dtype)
    if row_ops(x, axis):
        return softmax_last(x)
    if _empty_axis(x, axis):   # no elements: nothing to normalise
        return mul(x, 1.0)
    e = exp(sub(x, amax(x, axis, keepdims=True).detach()))
    return div(e, sum(e, axis, keepdims=True))


def log_softmax(x, dim=None, dtype=None, *, axis=None):
    """x - logsumexp(x) along `dim` (default -1; the last axis: the `log_softmax` row op)."""
    if axis is not None:
        axis = axis if dim is None else pick("log_softmax", "dim", dim, "axis", axis)
    else:
        axis = -1 if dim is None else dim
    if dtype is not None or type(x) is not Tensor:
        x = _as_float(x, dtype)
    if row_ops(x, axis):
        return log_softmax_last(x)
    if _empty_axis(x, axis):
        return mul(x, 1.0)
    return sub(x, logsumexp(x, axis, keepdims=True))


def _correction(op, unbiased, correction):
    if unbiased is not None and correction is not None:
        from ..errors import SampanValueError, op_error
        raise op_error(SampanValueError, op, f"both unbiased={unbiased!r} and "
                       f"correction={correction!r}", "one of unbiased= or correction=")
    if correction is not None:
        return correction
    return 0 if unbiased is False else 1


def _var_args(op, x, dim, unbiased, keepdim, correction, axis, keepdims):
    if isinstance(dim, bool):          # torch.var(x, False): the unbiased flag
        dim, unbiased = None, pick(op, "unbiased", unbiased, "(positional unbiased)", dim)
    dim = _dim(op, dim, axis, None)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick(op, "keepdim", keepdim, "keepdims", keepdims))
    return dim, bool(keepdim), _correction(op, unbiased, correction)


def _var(x, dim, keepdim, correction):
    from ._util import norm_axis
    x = _t(x)
    m = mean(x, dim, keepdims=True)
    d = sub(x, m)
    n = 1
    for a in norm_axis(dim, x.ndim, "var"):
        n *= x.shape[a]
    s = sum(mul(d, d), dim, keepdims=keepdim)
    dof = n - correction
    with deciding():   # a symbolic size: these choices are guards of the traced program
        none_left = dof <= 0
        single = none_left and n <= 1
    if none_left:      # PyTorch: no degrees of freedom left gives NaN (0/0) or inf
        return (mul(s, float("nan")) if single else div(s, 0.0)), m
    return div(s, as_float(dof)), m     # a symbolic size stays one (jit dynamic=)


def var(x, dim=None, unbiased=None, keepdim=None, *, correction=None, axis=None,
        keepdims=None):
    """Variance over `dim` (int, tuple or None: all), with Bessel's correction by default
    as PyTorch (``unbiased=False`` or ``correction=0`` for the population variance).
    Example: ``x.var(dim=0, keepdim=True)``."""
    dim, keepdim, c = _var_args("var", x, dim, unbiased, keepdim, correction, axis, keepdims)
    return _var(x, dim, keepdim, c)[0]


def _sqrt0(v):
    """sqrt whose gradient is 0 where it is 0 (constant values), as in PyTorch, not
    sqrt's 1/0 times var's 0 = NaN."""
    from .elementwise import eq, sqrt
    zero = eq(v, 0.0)
    # sqrt of a safe value, so the branch that is not taken holds no inf
    return where(zero, 0.0, sqrt(where(zero, 1.0, v)))


def std(x, dim=None, unbiased=None, keepdim=None, *, correction=None, axis=None,
        keepdims=None):
    """Standard deviation (sqrt of `var`, same arguments); its gradient is 0 where it is 0.
    Example: ``x.std(dim=1, unbiased=False)``."""
    dim, keepdim, c = _var_args("std", x, dim, unbiased, keepdim, correction, axis, keepdims)
    return _sqrt0(_var(x, dim, keepdim, c)[0])


def _with_mean(x, vm, dim, keepdim):
    """(var, mean) from `_var`'s pair, whose mean kept the reduced dims."""
    v, m = vm
    if not keepdim:
        m = _squeeze_axis(m, dim) if dim is not None else reshape(m, ())
    return v, m


def var_mean(x, dim=None, unbiased=None, keepdim=None, *, correction=None, axis=None,
             keepdims=None):
    """``(var, mean)`` over `dim` in one pass over the data, as ``torch.var_mean``."""
    dim, keepdim, c = _var_args("var_mean", x, dim, unbiased, keepdim, correction, axis,
                                keepdims)
    x = _t(x)
    return _with_mean(x, _var(x, dim, keepdim, c), dim, keepdim)


def std_mean(x, dim=None, unbiased=None, keepdim=None, *, correction=None, axis=None,
             keepdims=None):
    """``(std, mean)`` over `dim`, as ``torch.std_mean``.

    Example::

        >>> s, m = sampan.std_mean(sampan.tensor([1.0, 3.0]))
        >>> round(s.item(), 4), m.item()
        (1.4142, 2.0)
    """
    dim, keepdim, c = _var_args("std_mean", x, dim, unbiased, keepdim, correction, axis,
                                keepdims)
    x = _t(x)
    v, m = _with_mean(x, _var(x, dim, keepdim, c), dim, keepdim)
    return _sqrt0(v), m


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing `normalized_shape` dims, then scale and shift."""
    x = _t(x)
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    weight = None if weight is None else _t(weight)
    bias = None if bias is None else _t(bias)
    if (len(axes) == 1 and row_ops(x, axes[0]) and weight is not None and bias is not None
            and tuple(weight.shape) == tuple(bias.shape) == tuple(x.shape[-1:])
            and weight.dtype == bias.dtype == x.dtype):
        return layer_norm_affine(x, weight, bias, eps)   # one op (rowwise.py)
    if len(axes) == 1 and row_ops(x, axes[0]):   # one row op (rowwise.py)
        y = standardize(x, eps)
    else:
        m = mean(x, axes, keepdims=True)
        d = sub(x, m)
        v = mean(mul(d, d), axes, keepdims=True)
        y = mul(d, rsqrt(add(v, eps)))
    if weight is not None:
        y = mul(y, weight)
    if bias is not None:
        y = add(y, bias)
    return y


def rms_norm(x, normalized_shape, weight=None, eps=1e-6):
    """x / rms(x) over the trailing dims, times weight."""
    x = _t(x)
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y = mul(x, rsqrt(add(mean(mul(x, x), axes, keepdims=True), eps)))
    return y if weight is None else mul(y, weight)


def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Batch normalisation over every dim but the channel dim (1). In training mode the
    running statistics (plain tensors) are updated in place, like PyTorch. `momentum`
    may be a 0-d tensor (e.g. a cumulative average's 1/n, computed in float64)."""
    x = _t(x)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if training or running_mean is None:
        m = mean(x, axes, keepdims=True)
        d = sub(x, m)
        v = mean(mul(d, d), axes, keepdims=True)
        if training and running_mean is not None:
            n = x.numel() // x.shape[1]
            if STATE.tracer is not None or isinstance(momentum, Tensor):
                _update_running(running_mean, running_var, m, v, n, momentum)
            else:
                with _no_grad():
                    rm = running_mean._data
                    rv = running_var._data
                    rm *= 1 - momentum
                    rm += momentum * m._data.reshape(-1).astype(rm.dtype)
                    rv *= 1 - momentum
                    rv += momentum * v._data.reshape(-1).astype(rv.dtype) * n / max(n - 1, 1)
                    running_mean._version += 1
                    running_var._version += 1
    else:
        m = reshape(running_mean, shape)
        v = reshape(running_var, shape)
        d = sub(x, m)
    y = mul(d, rsqrt(add(v, eps)))
    if weight is not None:
        y = mul(y, reshape(weight, shape))
    if bias is not None:
        y = add(y, reshape(bias, shape))
    return y


def _update_running(running_mean, running_var, m, v, n, momentum):
    """The running-statistics update with ops and `copy_` (traceable: the tracer makes the
    buffers graph state), in the eager update's order of rounding."""
    dt = running_mean.dtype
    with _no_grad():
        keep = 1.0 - momentum
        if isinstance(momentum, Tensor):
            keep, momentum = cast(keep, dt), cast(momentum, dt)
        mf = cast(reshape(m, (-1,)), dt)
        vf = cast(reshape(v, (-1,)), running_var.dtype)
        running_mean.copy_(add(mul(running_mean, keep), mul(mf, momentum)))
        with deciding():     # a symbolic batch: the choice is a guard
            denom = max(n - 1, 1)
        running_var.copy_(add(mul(running_var, keep),
                              div(mul(mul(vf, momentum), n), denom)))


def _no_grad():
    from ..autograd.engine import no_grad
    return no_grad()


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)


def gelu(x, approximate="none"):
    """Gaussian error linear unit: exact (erf) or approximate="tanh"."""
    x = _t(x)
    if approximate == "tanh":
        inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), _SQRT_2_PI)
        return mul(mul(x, 0.5), add(tanh(inner), 1.0))
    from .elementwise import gelu_exact
    return gelu_exact(x)


def silu(x):
    """x * sigmoid(x)."""
    x = _t(x)
    return mul(x, sigmoid(x))


def leaky_relu(x, negative_slope=0.01):
    """x where x > 0, else slope * x."""
    x = _t(x)
    return where(gt(x, 0.0), x, mul(x, negative_slope))


def softplus(x, beta=1.0):
    """log(1 + exp(beta x)) / beta, stable (the `softplus` op, scaled)."""
    from .elementwise import softplus_op
    x = _t(x)
    if beta == 1.0:
        return softplus_op(x)
    return div(softplus_op(mul(x, beta)), beta)


def one_hot(labels, num_classes=-1):
    """int labels -> int64 one-hot vectors, as PyTorch (``num_classes=-1``: the largest
    label + 1). Labels outside [0, num_classes) raise (PyTorch does too; eq against arange
    gave a row of zeros)."""
    from ..errors import DTypeError, SampanIndexError, SampanValueError, op_error
    from .creation import arange
    from .elementwise import eq
    from .shape import unsqueeze
    labels = _t(labels)
    if not _dt.is_integer(labels.dtype):
        raise op_error(DTypeError, "one_hot", f"labels of dtype {labels.dtype}",
                       "integer class ids")
    a = labels._data
    if num_classes == -1:
        if not isinstance(a, np.ndarray):
            raise op_error(SampanValueError, "one_hot", "num_classes=-1 while tracing",
                           "an explicit num_classes (the largest label is not known)")
        num_classes = int(a.max()) + 1 if a.size else 0
    if isinstance(a, np.ndarray) and a.size and (a.min() < 0 or a.max() >= num_classes):
        raise op_error(SampanIndexError, "one_hot", f"class ids in [{a.min()}, {a.max()}]",
                       f"class ids in [0, {num_classes}) for num_classes={num_classes}")
    return cast(eq(unsqueeze(labels, -1), arange(num_classes)), "int64")


def dropout(x, p=0.5, training=True, generator=None):
    """Zero each element with probability p and scale the rest by 1/(1-p)."""
    from .random import uniform
    x = _t(x)
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return mul(x, 0.0)
    keep = gt(uniform(tuple(x.shape), dtype=x.dtype, generator=generator), p)
    return where(keep, mul(x, 1.0 / (1.0 - p)), mul(x, 0.0))


# ---------------------------------------------------------------------- cross-entropy
# One cross_entropy (sampan.cross_entropy is sampan.nn.functional.cross_entropy), with
# PyTorch's convention: classes on dim 1 of (N, C) or (N, C, d1, …). There were two, and
# the top-level one took classes on the last axis: on an (N, C, L) input they silently
# differed. Class-index targets without label smoothing run as the row op
# (rowwise.softmax_cross_entropy) over the rows of the classes-last input.
REDUCTIONS = ("none", "mean", "sum")


def check_reduction(op, reduction, allowed=REDUCTIONS):
    if reduction not in allowed:
        from ..errors import SampanValueError, op_error
        raise op_error(SampanValueError, op, f"reduction={reduction!r}",
                       " or ".join(repr(r) for r in allowed))


def class_last(x):
    """(N, C, d1, …) -> (N, d1, …, C); 1-d and 2-d inputs are returned as they are."""
    if x.ndim <= 2:
        return x
    from .shape import permute
    return permute(x, (0,) + tuple(range(2, x.ndim)) + (1,))


def class_targets(op, x, target, ignore_index):
    """Check class-index targets against classes-last input `x`; returns them as ints."""
    from ..errors import SampanValueError, ShapeError, op_error
    if tuple(target.shape) != tuple(x.shape[:-1]):
        raise op_error(ShapeError, op, f"class-index target of shape {tuple(target.shape)} "
                       f"for input with classes last {tuple(x.shape)}",
                       f"a target of shape {tuple(x.shape[:-1])}")
    if not _dt.is_integer(target.dtype):
        target = cast(target, "int64")
    a = target._data
    c = x.shape[-1]
    # concrete (not traced): check the values; min and max first, the common case
    if isinstance(a, np.ndarray) and a.size and not (a.min() >= 0 and a.max() < c):
        bad = (a != ignore_index) & ((a < 0) | (a >= c))
        if bad.any():
            raise op_error(SampanValueError, op, f"target value {a[bad].flat[0]}",
                           f"class indices in [0, {c}) or ignore_index={ignore_index}")
    return target


def nll_parts(op, lsm, target, weight, ignore_index):
    """Per-element -w[y] * lsm[y] (0 where ignored), the per-element weights and the mask,
    for classes-last log-probabilities `lsm`."""
    from .elementwise import ne, neg
    from .index import take_along_axis
    from .shape import squeeze, unsqueeze
    target = class_targets(op, lsm, target, ignore_index)
    valid = ne(target, ignore_index)
    safe = where(valid, target, 0)
    picked = neg(squeeze(take_along_axis(lsm, unsqueeze(safe, -1), -1), -1))
    w = _target_weights(weight, safe, valid, lsm.dtype)
    return mul(picked, w), w, valid


def _target_weights(weight, safe, valid, dtype):
    """weight[target] where the target is not ignored, else 0 (1 without a weight)."""
    if weight is None:
        return cast(valid, dtype)
    from .index import index_select
    w = reshape(index_select(_t(weight), reshape(safe, (-1,)), 0), tuple(safe.shape))
    return where(valid, cast(w, dtype), 0.0)


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    """Softmax cross-entropy of logits (N, C) or (N, C, d1, …) (classes on dim 1, or (C,)
    unbatched) against class indices (N, d1, …) or class probabilities shaped like the
    input, with class `weight`, `ignore_index` (index targets), `reduction` and
    `label_smoothing`, exactly as PyTorch's ``torch.nn.functional.cross_entropy``.

    Example::

        >>> sampan.cross_entropy(sampan.randn(3, 5), sampan.tensor([1, 0, 4]))
    """
    from ..errors import SampanValueError, ShapeError, op_error
    from .elementwise import neg
    from .shape import squeeze, unsqueeze
    op = "cross_entropy"
    check_reduction(op, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise op_error(SampanValueError, op, f"label_smoothing={label_smoothing}",
                       "a value in [0, 1]")
    input, target = _t(input), _t(target)
    if input.ndim == 0:
        raise op_error(ShapeError, op, "a 0-d input", "logits (C,), (N, C) or (N, C, d1, ...)")
    squeeze_out = input.ndim == 1
    if squeeze_out:
        input, target = unsqueeze(input, 0), unsqueeze(target, 0)
    x = class_last(input)
    c = x.shape[-1]
    eps = float(label_smoothing)
    if _dt.is_floating(target.dtype):  # class probabilities
        if tuple(input.shape) != tuple(target.shape):
            raise op_error(ShapeError, op, f"input {tuple(input.shape)} and class-probability "
                           f"target {tuple(target.shape)}", "equal shapes")
        lsm = log_softmax(x, -1)
        p = class_last(cast(target, lsm.dtype))
        if eps:
            p = add(mul(p, 1.0 - eps), eps / c)
        t = mul(lsm, p)
        if weight is not None:
            t = mul(t, cast(_t(weight), lsm.dtype))
        loss = neg(sum(t, -1))
        if reduction == "none":
            return squeeze(loss, 0) if squeeze_out else loss
        return sum(loss) if reduction == "sum" else mean(loss)
    if not eps and row_ops(x, -1):
        # the row op: one pass per row forward, one number per row kept for the gradient
        from .elementwise import ne
        from .rowwise import softmax_cross_entropy
        target = class_targets(op, x, target, ignore_index)
        rows = x if x.ndim == 2 else reshape(x, (-1, c))
        t = target if target.ndim == 1 else reshape(target, (-1,))
        nll = softmax_cross_entropy(rows, t, ignore_index)
        valid = ne(t, ignore_index)
        w = None
        if weight is not None:
            w = _target_weights(weight, where(valid, t, 0), valid, nll.dtype)
            nll = mul(nll, w)
        if reduction == "none":
            nll = nll if target.ndim == 1 else reshape(nll, tuple(target.shape))
            return squeeze(nll, 0) if squeeze_out else nll
        if reduction == "sum":
            return sum(nll)
        return div(sum(nll), sum(w if w is not None else cast(valid, nll.dtype)))
    lsm = log_softmax(x, -1)
    nll, w, valid = nll_parts(op, lsm, target, weight, ignore_index)
    if eps:
        lw = lsm if weight is None else mul(lsm, cast(_t(weight), lsm.dtype))
        smooth = where(valid, neg(sum(lw, -1)), 0.0)
    if reduction == "none":
        loss = add(mul(nll, 1.0 - eps), mul(smooth, eps / c)) if eps else nll
        return squeeze(loss, 0) if squeeze_out else loss
    if reduction == "sum":
        total, smooth_total = sum(nll), (sum(smooth) if eps else None)
    else:
        denom = sum(w)
        total = div(sum(nll), denom)
        smooth_total = div(sum(smooth), denom) if eps else None
    if eps:
        total = add(mul(total, 1.0 - eps), mul(smooth_total, eps / c))
    return total


def _cls_target():
    return np.array([1, 0, 3]).astype(np.int64)


# name -> (function, samples, torch reference name used by the op tests)
COMPOSITES = {
    "softmax": (softmax, lambda: [Sample((randf(rng(60), 3, 5),), {"axis": -1}),
                                  Sample((randf(rng(61), 2, 3, 4),), {"axis": 1})]),
    "log_softmax": (log_softmax, lambda: [Sample((randf(rng(62), 3, 5),), {"axis": -1})]),
    "logsumexp": (logsumexp, lambda: [Sample((randf(rng(63), 3, 5),), {"axis": 1})]),
    "var": (var, lambda: [Sample((randf(rng(64), 3, 5),), {"axis": 1})]),
    "std": (std, lambda: [Sample((randf(rng(65), 3, 5),), {"axis": 0})]),
    "layer_norm": (layer_norm, lambda: [Sample((randf(rng(66), 3, 6), (6,), randf(rng(67), 6),
                                                randf(rng(68), 6)), {})]),
    "rms_norm": (rms_norm, lambda: [Sample((randf(rng(69), 3, 6), (6,), randf(rng(70), 6)),
                                           {})]),
    "batch_norm": (batch_norm, lambda: [Sample((randf(rng(71), 4, 3, 2, 2), None, None,
                                                randf(rng(72), 3), randf(rng(73), 3)),
                                               {"training": True})]),
    "gelu": (gelu, lambda: [Sample((randf(rng(74), 3, 5),), {}),
                            Sample((randf(rng(75), 3, 5),), {"approximate": "tanh"})]),
    "silu": (silu, lambda: [Sample((randf(rng(76), 3, 5),), {})]),
    "leaky_relu": (leaky_relu, lambda: [Sample((randf(rng(77), 3, 5),), {})]),
    "softplus_beta": (softplus, lambda: [Sample((randf(rng(78), 3, 5),), {"beta": 2.0})]),
    "cross_entropy": (cross_entropy, lambda: [
        Sample((randf(rng(79), 3, 5), _cls_target()), {}, diff=(0,)),
        Sample((randf(rng(80), 3, 5), _cls_target()), {"label_smoothing": 0.1}, diff=(0,)),
        Sample((randf(rng(81), 3, 5), np.array([1, -100, 2])), {}, diff=(0,)),
        # classes on dim 1 of (N, C, L), as PyTorch: the row op over the classes-last rows
        Sample((randf(rng(82), 2, 4, 3), np.array([[0, 3, 1], [2, -100, 0]])), {}, diff=(0,)),
        Sample((randf(rng(83), 2, 4, 3), np.array([[0, 3, 1], [2, 1, 0]]),
                randf(rng(84), 4, low=0.5, high=2.0)), {"reduction": "sum"}, diff=(0,)),
        Sample((randf(rng(85), 2, 4, 3), randf(rng(86), 2, 4, 3, low=0.0, high=1.0)),
               {"label_smoothing": 0.2}, diff=(0, 1))]),
}
