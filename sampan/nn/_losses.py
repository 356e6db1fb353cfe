"""Loss functions of `sampan.nn.functional` (PyTorch's semantics and option names).

Inputs with more than two dims keep the class axis at 1, like PyTorch: logits
(N, C, d1, …) with targets (N, d1, …). `cross_entropy` is the one in `sampan.ops.composite`
(also `sampan.cross_entropy`)."""
from __future__ import annotations

import numpy as np

from ..errors import SampanValueError, ShapeError, op_error
# one cross_entropy for sampan and sampan.nn.functional, with its helpers
from ..ops.composite import REDUCTIONS as _REDUCTIONS
from ..ops.composite import check_reduction as _check_reduction
from ..ops.composite import class_last as _class_last
from ..ops.composite import cross_entropy  # noqa: F401  (re-exported by nn.functional)
from ..ops.composite import nll_parts as _nll_parts
from ..ops.elementwise import (abs as _abs, add, div, exp, gt, log, lt, maximum,
                               mul, neg, softplus_op, sub, where)
from ..ops.reduce import mean, sum
from ..ops.shape import squeeze, unsqueeze
from ..tensor import Tensor


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    return sum(loss) if reduction == "sum" else mean(loss)


def _check_same_shape(op, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise op_error(ShapeError, op, f"input {tuple(a.shape)} and target {tuple(b.shape)}",
                       "equal shapes")


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
