"""Loss functions of `sampan.nn.functional` (PyTorch's semantics and option names).

Inputs with more than two dims keep the class axis at 1, like PyTorch: logits
(N, C, d1, …) with targets (N, d1, …)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import SampanValueError, ShapeError, op_error
from ..ops.composite import log_softmax
from ..ops.elementwise import (abs as _abs, add, cast, div, exp, gt, log, lt, maximum,
                               mul, ne, neg, softplus_op, sub, where)
from ..ops.index import index_select, take_along_axis
from ..ops.reduce import mean, sum
from ..ops.shape import permute, reshape, squeeze, unsqueeze
from ..tensor import Tensor

_REDUCTIONS = ("none", "mean", "sum")


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _check_reduction(op, reduction, allowed=_REDUCTIONS):
    if reduction not in allowed:
        raise op_error(SampanValueError, op, f"reduction={reduction!r}",
                       " or ".join(repr(r) for r in allowed))


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    return sum(loss) if reduction == "sum" else mean(loss)


def _class_last(x):
    """(N, C, d1, …) -> (N, d1, …, C); 1-d and 2-d inputs are returned as they are."""
    if x.ndim <= 2:
        return x
    return permute(x, (0,) + tuple(range(2, x.ndim)) + (1,))


def _check_same_shape(op, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise op_error(ShapeError, op, f"input {tuple(a.shape)} and target {tuple(b.shape)}",
                       "equal shapes")


def _nll_parts(op, lsm, target, weight, ignore_index):
    """Per-element -w[y] * lsm[y] (0 where ignored) and the per-element weights."""
    c = lsm.shape[-1]
    if tuple(target.shape) != tuple(lsm.shape[:-1]):
        raise op_error(ShapeError, op, f"class-index target of shape {tuple(target.shape)} "
                       f"for input with classes last {tuple(lsm.shape)}",
                       f"a target of shape {tuple(lsm.shape[:-1])}")
    if not _dt.is_integer(target.dtype):
        target = cast(target, "int64")
    a = target._data
    if isinstance(a, np.ndarray) and a.size:
        bad = (a != ignore_index) & ((a < 0) | (a >= c))
        if bad.any():
            raise op_error(SampanValueError, op, f"target value {a[bad].flat[0]}",
                           f"class indices in [0, {c}) or ignore_index={ignore_index}")
    valid = ne(target, ignore_index)
    safe = where(valid, target, 0)
    picked = neg(squeeze(take_along_axis(lsm, unsqueeze(safe, -1), -1), -1))
    if weight is not None:
        w = reshape(index_select(_t(weight), reshape(safe, (-1,)), 0), tuple(safe.shape))
        w = where(valid, cast(w, lsm.dtype), 0.0)
    else:
        w = cast(valid, lsm.dtype)
    return mul(picked, w), w, valid


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """Negative log-likelihood of class indices given log-probabilities (N, C, …).

    Example::

        >>> F.nll_loss(F.log_softmax(sampan.randn(3, 5), 1), sampan.tensor([1, 0, 4]))
    """
    _check_reduction("nll_loss", reduction)
    input, target = _t(input), _t(target)
    squeeze_out = input.ndim == 1
    if squeeze_out:
        input, target = unsqueeze(input, 0), unsqueeze(target, 0)
    loss, w, _ = _nll_parts("nll_loss", _class_last(input), target, weight, ignore_index)
    if reduction == "none":
        return squeeze(loss, 0) if squeeze_out else loss
    if reduction == "sum":
        return sum(loss)
    return div(sum(loss), sum(w))


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    """Softmax cross-entropy from logits (N, C, …) and class indices (N, …) or class
    probabilities (N, C, …), with class `weight`, `ignore_index` (index targets) and
    `label_smoothing`, exactly as PyTorch defines them.

    Example::

        >>> F.cross_entropy(sampan.randn(3, 5), sampan.tensor([1, 0, 4]), label_smoothing=0.1)
    """
    _check_reduction("cross_entropy", reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise op_error(SampanValueError, "cross_entropy", f"label_smoothing={label_smoothing}",
                       "a value in [0, 1]")
    input, target = _t(input), _t(target)
    squeeze_out = input.ndim == 1
    if squeeze_out:
        input, target = unsqueeze(input, 0), unsqueeze(target, 0)
    x = _class_last(input)
    c = x.shape[-1]
    lsm = log_softmax(x, -1)
    eps = float(label_smoothing)
    if _dt.is_floating(target.dtype):  # class probabilities
        _check_same_shape("cross_entropy", input, target)
        p = _class_last(cast(target, lsm.dtype))
        if eps:
            p = add(mul(p, 1.0 - eps), eps / c)
        t = mul(lsm, p)
        if weight is not None:
            t = mul(t, cast(_t(weight), lsm.dtype))
        loss = neg(sum(t, -1))
        if reduction == "none":
            return squeeze(loss, 0) if squeeze_out else loss
        return sum(loss) if reduction == "sum" else mean(loss)
    nll, w, valid = _nll_parts("cross_entropy", lsm, target, weight, ignore_index)
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


def mse_loss(input, target, reduction="mean"):
    """Mean squared error. Example: ``F.mse_loss(pred, y)``."""
    _check_reduction("mse_loss", reduction)
    input, target = _t(input), _t(target)
    _check_same_shape("mse_loss", input, target)
    d = sub(input, target)
    return _reduce(mul(d, d), reduction)


def l1_loss(input, target, reduction="mean"):
    """Mean absolute error. Example: ``F.l1_loss(pred, y)``."""
    _check_reduction("l1_loss", reduction)
    input, target = _t(input), _t(target)
    _check_same_shape("l1_loss", input, target)
    return _reduce(_abs(sub(input, target)), reduction)


def smooth_l1_loss(input, target, reduction="mean", beta=1.0):
    """0.5 d²/beta where |d| < beta, else |d| - beta/2 (L1 when beta == 0).

    Example: ``F.smooth_l1_loss(pred, y, beta=0.5)``"""
    _check_reduction("smooth_l1_loss", reduction)
    input, target = _t(input), _t(target)
    _check_same_shape("smooth_l1_loss", input, target)
    d = _abs(sub(input, target))
    if beta == 0.0:
        return _reduce(d, reduction)
    loss = where(lt(d, beta), div(mul(mul(d, d), 0.5), beta), sub(d, 0.5 * beta))
    return _reduce(loss, reduction)


def huber_loss(input, target, reduction="mean", delta=1.0):
    """0.5 d² where |d| < delta, else delta (|d| - delta/2). Example: ``F.huber_loss(p, y)``."""
    _check_reduction("huber_loss", reduction)
    input, target = _t(input), _t(target)
    _check_same_shape("huber_loss", input, target)
    d = _abs(sub(input, target))
    loss = where(lt(d, delta), mul(mul(d, d), 0.5), mul(sub(d, 0.5 * delta), delta))
    return _reduce(loss, reduction)


def binary_cross_entropy(input, target, weight=None, reduction="mean"):
    """-(y log p + (1-y) log(1-p)) from probabilities `p`; logs clamped at -100 like
    PyTorch. Example: ``F.binary_cross_entropy(sampan.sigmoid(z), y)``."""
    _check_reduction("binary_cross_entropy", reduction)
    input, target = _t(input), _t(target)
    _check_same_shape("binary_cross_entropy", input, target)
    a = input._data
    if isinstance(a, np.ndarray) and a.size and (a.min() < 0 or a.max() > 1):
        raise op_error(SampanValueError, "binary_cross_entropy",
                       f"input values in [{a.min()}, {a.max()}]",
                       "probabilities in [0, 1] (use binary_cross_entropy_with_logits "
                       "for logits)")
    b = target._data
    if isinstance(b, np.ndarray) and b.size and not ((b >= 0) & (b <= 1)).all():
        # PyTorch refuses these too: the loss would be unbounded below
        raise op_error(SampanValueError, "binary_cross_entropy",
                       f"target values in [{b.min()}, {b.max()}]", "targets in [0, 1]")
    with np.errstate(divide="ignore"):
        lp = maximum(log(input), -100.0)
        lq = maximum(log(sub(1.0, input)), -100.0)
    loss = neg(add(mul(target, lp), mul(sub(1.0, target), lq)))
    if weight is not None:
        loss = mul(loss, weight)
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean",
                                     pos_weight=None):
    """Sigmoid + binary cross-entropy in one stable expression; `pos_weight` scales the
    positive term (per class, broadcast over the last dim).

    Example: ``F.binary_cross_entropy_with_logits(z, y, pos_weight=sampan.tensor([3.0]))``"""
    _check_reduction("binary_cross_entropy_with_logits", reduction)
    x, y = _t(input), _t(target)
    _check_same_shape("binary_cross_entropy_with_logits", x, y)
    # log(1 + e^-x) as the softplus op: stable, and its gradient -sigmoid(-x) is exact to
    # every order (the max/abs composite had no curvature at x == 0)
    softplus_neg = softplus_op(neg(x))
    if pos_weight is not None:
        lw = add(mul(sub(pos_weight, 1.0), y), 1.0)
        loss = add(mul(sub(1.0, y), x), mul(lw, softplus_neg))
    else:
        loss = add(mul(sub(1.0, y), x), softplus_neg)
    if weight is not None:
        loss = mul(loss, weight)
    return _reduce(loss, reduction)


def kl_div(input, target, reduction="mean", log_target=False):
    """KL(target || model) with `input` holding the model's log-probabilities:
    target * (log target - input). 'batchmean' divides the sum by the batch size.

    Example: ``F.kl_div(F.log_softmax(z, -1), p, reduction="batchmean")``"""
    _check_reduction("kl_div", reduction, _REDUCTIONS + ("batchmean",))
    input, target = _t(input), _t(target)
    if log_target:
        loss = mul(exp(target), sub(target, input))
    else:
        pos = gt(target, 0.0)
        xlogx = where(pos, mul(target, log(where(pos, target, 1.0))), 0.0)
        loss = sub(xlogx, mul(target, input))
    if reduction == "batchmean":
        return div(sum(loss), float(input.shape[0]) if input.ndim else 1.0)
    return _reduce(loss, reduction)
