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


# ---------------------------------------------------------------------- issue 17 losses
def _lengths(v, what, n):
    """Lengths given as a tensor, a sequence or an int, as an int64 tensor of shape (n,)."""
    from ..ops.elementwise import cast
    v = v if isinstance(v, Tensor) else Tensor(np.asarray(v, dtype=np.int64).reshape(-1))
    if v.ndim == 0:
        from ..ops.shape import reshape
        v = reshape(v, (1,))
    if not np.issubdtype(v.dtype, np.integer):
        raise op_error(SampanValueError, "ctc_loss", f"{what} of dtype {v.dtype}",
                       f"integer {what}")
    if tuple(v.shape) != (n,):
        raise op_error(ShapeError, "ctc_loss", f"{what} of shape {tuple(v.shape)}",
                       f"({n},), one length per sample")
    return cast(v, "int64") if v.dtype != np.int64 else v


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
             zero_infinity=False):
    """Connectionist temporal classification loss of log-probabilities (T, N, C) (or (T, C)
    unbatched) against targets padded (N, S) or concatenated (sum(target_lengths),).
    'mean' divides each sample's loss by its target length, then averages (PyTorch's).

    Example::

        >>> lp = F.log_softmax(sampan.randn(50, 4, 20), -1)
        >>> F.ctc_loss(lp, sampan.randint(1, 20, (4, 10)), [50] * 4, [10, 8, 9, 10])
    """
    from ..ops.elementwise import cast, clamp, eq
    from ..ops.nn_ops import ctc_nll
    from ..ops.shape import reshape
    _check_reduction("ctc_loss", reduction)
    lp, tg = _t(log_probs), _t(targets)
    unbatched = lp.ndim == 2
    if unbatched:
        lp = unsqueeze(lp, 1)
        if tg.ndim == 1:
            tg = unsqueeze(tg, 0)
    if lp.ndim != 3:
        raise op_error(ShapeError, "ctc_loss", f"log_probs of shape {tuple(lp.shape)}",
                       "(T, N, C) or (T, C)")
    n = lp.shape[1]
    il = _lengths(input_lengths, "input_lengths", n)
    tl = _lengths(target_lengths, "target_lengths", n)
    if tg.ndim == 1:   # concatenated targets: pad them to (N, max length)
        a, lens = np.asarray(tg._data), np.asarray(tl._data)
        if not isinstance(tg._data, np.ndarray) or lens.sum() != a.shape[0] or lens.min(
                initial=0) < 0:
            raise op_error(ShapeError, "ctc_loss", f"concatenated targets of shape "
                           f"{tuple(tg.shape)} with target_lengths {lens.tolist()}",
                           "a 1-d targets tensor of length sum(target_lengths)")
        pad = np.zeros((n, int(lens.max(initial=0))), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        for i in range(n):
            pad[i, :lens[i]] = a[starts[i]:starts[i] + lens[i]]
        tg = Tensor(pad)
    nll = ctc_nll(lp, tg, il, tl, blank)
    if zero_infinity:
        nll = where(eq(nll, float("inf")), 0.0, nll)
    if reduction == "none":
        return reshape(nll, ()) if unbatched else nll
    if reduction == "sum":
        return sum(nll)
    return mean(div(nll, clamp(cast(tl, nll.dtype), min=1.0)))


def _pdist(a, b, p, eps):
    """PyTorch's pairwise_distance: ||a - b + eps||_p over the last dim."""
    from ..ops.elementwise import pow as _pow, sqrt
    d = add(sub(a, b), eps)
    if p == 2:
        return sqrt(sum(mul(d, d), -1))
    if p == 1:
        return sum(_abs(d), -1)
    if np.isinf(p):
        from ..ops.reduce import amax
        return amax(_abs(d), -1)
    return _pow(sum(_pow(_abs(d), float(p)), -1), 1.0 / p)


def _relu_min0(x):
    from ..ops.elementwise import clamp
    return clamp(x, min=0.0)


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False,
                        reduction="mean"):
    """max(d(a, p) - d(a, n) + margin, 0) with the p-norm distance (`swap`: the smaller of
    d(a, n) and d(p, n)). Example: ``F.triplet_margin_loss(a, p, n, margin=0.5)``."""
    _check_reduction("triplet_margin_loss", reduction)
    a, pos, neg_ = _t(anchor), _t(positive), _t(negative)
    if not (a.ndim == pos.ndim == neg_.ndim) or a.ndim not in (1, 2):
        raise op_error(ShapeError, "triplet_margin_loss", f"anchor {tuple(a.shape)}, positive "
                       f"{tuple(pos.shape)}, negative {tuple(neg_.shape)}",
                       "three tensors of shape (N, D) or (D,)")
    return _triplet(a, pos, neg_, lambda x, y: _pdist(x, y, p, eps), margin, swap, reduction)


def _triplet(a, pos, neg_, dist, margin, swap, reduction):
    from ..ops.elementwise import minimum
    d_pos, d_neg = dist(a, pos), dist(a, neg_)
    if swap:
        d_neg = minimum(d_neg, dist(pos, neg_))
    return _reduce(_relu_min0(add(sub(d_pos, d_neg), margin)), reduction)


def triplet_margin_with_distance_loss(anchor, positive, negative, distance_function=None,
                                      margin=1.0, swap=False, reduction="mean"):
    """`triplet_margin_loss` with any distance function (default: pairwise distance).
    Example: ``F.triplet_margin_with_distance_loss(a, p, n, distance_function=f)``."""
    _check_reduction("triplet_margin_with_distance_loss", reduction)
    dist = distance_function or (lambda x, y: _pdist(x, y, 2, 1e-6))
    return _triplet(_t(anchor), _t(positive), _t(negative), dist, margin, swap, reduction)


def margin_ranking_loss(input1, input2, target, margin=0.0, reduction="mean"):
    """max(0, -y (x1 - x2) + margin) with y = 1 or -1. Example:
    ``F.margin_ranking_loss(x1, x2, y)``."""
    _check_reduction("margin_ranking_loss", reduction)
    x1, x2, y = _t(input1), _t(input2), _t(target)
    if not (x1.ndim == x2.ndim == y.ndim):
        raise op_error(ShapeError, "margin_ranking_loss", f"input1 {tuple(x1.shape)}, input2 "
                       f"{tuple(x2.shape)}, target {tuple(y.shape)}", "equal dims")
    return _reduce(_relu_min0(add(mul(neg(y), sub(x1, x2)), margin)), reduction)


def hinge_embedding_loss(input, target, margin=1.0, reduction="mean"):
    """x where y == 1, max(0, margin - x) where y == -1. Example:
    ``F.hinge_embedding_loss(d, y)``."""
    from ..ops.elementwise import ne
    _check_reduction("hinge_embedding_loss", reduction)
    x, y = _t(input), _t(target)
    zeros = mul(x, 0.0)
    out = add(where(ne(y, 1), _relu_min0(sub(margin, x)), zeros), where(ne(y, -1), x, zeros))
    return _reduce(out, reduction)


def soft_margin_loss(input, target, reduction="mean"):
    """log(1 + exp(-y x)), stable. Example: ``F.soft_margin_loss(x, y)``."""
    _check_reduction("soft_margin_loss", reduction)
    x, y = _t(input), _t(target)
    _check_same_shape("soft_margin_loss", x, y)
    return _reduce(softplus_op(neg(mul(x, y))), reduction)


def cosine_embedding_loss(input1, input2, target, margin=0.0, reduction="mean"):
    """1 - cos(x1, x2) where y == 1, max(0, cos(x1, x2) - margin) where y == -1 (cosine
    over the last dim of (N, D) or (D,), with PyTorch's 1e-12 in the norms). Example:
    ``F.cosine_embedding_loss(x1, x2, y)``."""
    from ..ops.elementwise import sqrt
    _check_reduction("cosine_embedding_loss", reduction)
    x1, x2, y = _t(input1), _t(input2), _t(target)
    if x1.ndim not in (1, 2) or tuple(x1.shape) != tuple(x2.shape) or \
            y.ndim != x1.ndim - 1:
        raise op_error(ShapeError, "cosine_embedding_loss", f"input1 {tuple(x1.shape)}, "
                       f"input2 {tuple(x2.shape)}, target {tuple(y.shape)}",
                       "inputs (N, D) with target (N,), or (D,) with a 0-d target")
    eps = 1e-12
    prod = sum(mul(x1, x2), -1)
    m1 = add(sum(mul(x1, x1), -1), eps)
    m2 = add(sum(mul(x2, x2), -1), eps)
    cos = div(prod, sqrt(mul(m1, m2)))
    zeros = mul(cos, 0.0)
    from ..ops.elementwise import eq
    out = add(where(eq(y, 1), sub(1.0, cos), zeros),
              where(eq(y, -1), _relu_min0(sub(cos, margin)), zeros))
    return _reduce(out, reduction)


def multilabel_soft_margin_loss(input, target, weight=None, reduction="mean"):
    """Per-class binary logistic loss averaged over the classes (last dim), optional
    class `weight`. Example: ``F.multilabel_soft_margin_loss(z, y)``."""
    _check_reduction("multilabel_soft_margin_loss", reduction)
    x, y = _t(input), _t(target)
    _check_same_shape("multilabel_soft_margin_loss", x, y)
    # log(sigmoid(x)) = -softplus(-x), log(sigmoid(-x)) = -softplus(x)
    loss = add(mul(y, softplus_op(neg(x))), mul(sub(1.0, y), softplus_op(x)))
    if weight is not None:
        loss = mul(loss, weight)
    c = x.shape[-1] if x.ndim else 1
    return _reduce(div(sum(loss, -1), float(c)), reduction)


def poisson_nll_loss(input, target, log_input=True, full=False, eps=1e-8, reduction="mean"):
    """Poisson negative log-likelihood: exp(x) - y x (log_input) or x - y log(x + eps);
    `full` adds Stirling's term for y > 1. Example: ``F.poisson_nll_loss(log_rate, y)``."""
    import math
    from ..ops.elementwise import le
    _check_reduction("poisson_nll_loss", reduction)
    x, y = _t(input), _t(target)
    if log_input:
        loss = sub(exp(x), mul(y, x))
    else:
        loss = sub(x, mul(y, log(add(x, eps))))
    if full:
        safe = where(le(y, 1.0), 2.0, y)   # the term is 0 there; keep its logs finite
        st = add(sub(mul(safe, log(safe)), safe), mul(log(mul(safe, 2 * math.pi)), 0.5))
        loss = add(loss, where(le(y, 1.0), 0.0, st))
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """0.5 (log(var) + (x - y)^2 / var) (+ 0.5 log(2 pi) with `full`); `var` is clamped at
    `eps` with the gradient passing as if unclamped (PyTorch's). `var` may have one value
    per sample (last dim 1 or missing). Example: ``F.gaussian_nll_loss(mu, y, var)``."""
    import math
    from ..ops.elementwise import clamp
    _check_reduction("gaussian_nll_loss", reduction)
    x, y, v = _t(input), _t(target), _t(var)
    if tuple(v.shape) != tuple(x.shape):
        if tuple(x.shape[:-1]) == tuple(v.shape):
            v = unsqueeze(v, -1)
        elif not (tuple(x.shape[:-1]) == tuple(v.shape[:-1]) and v.shape[-1] == 1):
            raise op_error(ShapeError, "gaussian_nll_loss", f"input {tuple(x.shape)} and "
                           f"var {tuple(v.shape)}", "var shaped like input, or with its "
                           "last dim 1 or missing")
    a = v._data
    if isinstance(a, np.ndarray) and a.size and a.min() < 0:
        raise op_error(SampanValueError, "gaussian_nll_loss", f"var with minimum {a.min()}",
                       "non-negative variances")
    v = add(v, sub(clamp(v, min=eps), v).detach())   # clamped value, identity gradient
    d = sub(x, y)
    loss = mul(add(log(v), div(mul(d, d), v)), 0.5)
    if full:
        loss = add(loss, 0.5 * math.log(2 * math.pi))
    return _reduce(loss, reduction)


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, reduction="mean"):
    """Multi-class hinge loss: sum over i != y of max(0, margin - x[y] + x[i])^p / C
    (times weight[y]). Example: ``F.multi_margin_loss(z, labels)``."""
    from ..ops.creation import arange
    from ..ops.elementwise import cast, eq
    from ..ops.index import index_select, take_along_axis
    _check_reduction("multi_margin_loss", reduction)
    if p not in (1, 2):
        raise op_error(SampanValueError, "multi_margin_loss", f"p={p}", "p = 1 or 2")
    x, y = _t(input), _t(target)
    squeeze_out = x.ndim == 1
    if squeeze_out:
        x, y = unsqueeze(x, 0), (unsqueeze(y, 0) if y.ndim == 0 else y)
    if x.ndim != 2 or tuple(y.shape) != (x.shape[0],):
        raise op_error(ShapeError, "multi_margin_loss", f"input {tuple(x.shape)} and target "
                       f"{tuple(y.shape)}", "input (N, C) with target (N,), or (C,) with a "
                       "0-d target")
    c = x.shape[1]
    y = cast(y, "int64")
    b = y._data
    if isinstance(b, np.ndarray) and b.size and (b.min() < 0 or b.max() >= c):
        raise op_error(SampanValueError, "multi_margin_loss", f"target values in "
                       f"[{b.min()}, {b.max()}]", f"class indices in [0, {c})")
    xy = take_along_axis(x, unsqueeze(y, -1), -1)
    m = _relu_min0(add(sub(x, xy), margin))
    if p == 2:
        m = mul(m, m)
    if weight is not None:
        m = mul(m, unsqueeze(index_select(_t(weight), y, 0), -1))
    is_y = eq(unsqueeze(y, -1), arange(c))
    loss = div(sum(where(is_y, 0.0, m), -1), float(c))
    if squeeze_out and reduction == "none":
        return squeeze(loss, 0)
    return _reduce(loss, reduction)
