"""instance_norm, local_response_norm and embedding_bag: composites of reductions,
pads, gathers and one matmul, so autograd and jit need nothing of their own.

embedding_bag computes its bags with ops from the `offsets` tensor (a (bags, n)
membership mask from comparisons of positions with the offsets), never from numpy
values read while tracing: a jitted bag function stays right for any offsets of the
traced shape. The mask costs bags * n entries, fine for the batch sizes it serves.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor
from ._util import Sample, randf, rng


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


# ---------------------------------------------------------------------- instance_norm
def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """Normalise each (sample, channel) over its spatial dims (PyTorch's F.instance_norm).
    With use_input_stats and running statistics, these are updated in place with the
    batch average of the per-instance mean and unbiased variance; without
    use_input_stats the running statistics normalise.

    Example: ``F.instance_norm(sampan.randn(2, 3, 5)).shape`` is (2, 3, 5)"""
    from .composite import _update_running
    from .elementwise import add, mul, rsqrt, sub
    from .reduce import mean
    from .shape import reshape
    op = "instance_norm"
    x = _t(input)
    if x.ndim < 3:
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "(N, C, *spatial) input with at least one spatial dim")
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a floating dtype")
    c = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            raise op_error(ShapeError, op, f"{name} of shape {tuple(t.shape)} for input "
                           f"{tuple(x.shape)}", f"({c},)")
    shape = (1, c) + (1,) * (x.ndim - 2)
    axes = tuple(range(2, x.ndim))
    if use_input_stats:
        m = mean(x, axes, keepdims=True)
        d = sub(x, m)
        v = mean(mul(d, d), axes, keepdims=True)
        if running_mean is not None and running_var is not None and momentum:
            n = int(np.prod(x.shape[2:]))
            _update_running(running_mean, running_var, mean(m.detach(), 0),
                            mean(v.detach(), 0), n, momentum)
    else:
        if running_mean is None or running_var is None:
            raise op_error(SampanValueError, op, "use_input_stats=False without running "
                           "statistics", "running_mean and running_var")
        d = sub(x, reshape(running_mean, shape))
        v = reshape(running_var, shape)
    y = mul(d, rsqrt(add(v, eps)))
    if weight is not None:
        y = mul(y, reshape(weight, shape))
    if bias is not None:
        y = add(y, reshape(bias, shape))
    return y


# ---------------------------------------------------------------------- local_response_norm
def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    """x / (k + alpha * mean of x² over `size` neighbouring channels) ** beta, the
    window zero-padded at the channel ends as PyTorch's (size // 2 before).

    Example: ``F.local_response_norm(sampan.randn(1, 5, 3, 3), 3).shape`` is (1, 5, 3, 3)"""
    from .elementwise import add, div, mul
    from .elementwise import pow as _pow
    from .shape import narrow, pad
    op = "local_response_norm"
    x = _t(input)
    if x.ndim < 3:
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "(N, C, *) input with at least 3 dims")
    if int(size) < 1:
        raise op_error(SampanValueError, op, f"size={size}", "size >= 1")
    size = int(size)
    c = x.shape[1]
    sq = mul(x, x)
    pairs = ((0, 0), (size // 2, (size - 1) // 2)) + ((0, 0),) * (x.ndim - 2)
    p = pad(sq, pairs)
    acc = None
    for i in range(size):
        s = narrow(p, 1, i, c)
        acc = s if acc is None else add(acc, s)
    den = _pow(add(mul(acc, alpha / size), k), beta)
    return div(x, den)


# ---------------------------------------------------------------------- embedding_bag
_BAG_MODES = ("sum", "mean", "max")


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2,
                  scale_grad_by_freq=False, mode="mean", sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """Sums, means or maxima of bags of embedding rows (PyTorch's F.embedding_bag):
    a 2-d `input` has one bag a row; a 1-d one is split at `offsets` (bag starts; with
    include_last_offset the last entry ends the last bag). Entries equal to padding_idx
    are left out (also of the mean's count); an empty bag gives zeros. per_sample_weights
    (mode "sum") scale each entry's row.

    Example::

        >>> w = sampan.randn(10, 3)
        >>> F.embedding_bag(sampan.tensor([1, 2, 4, 5, 4]), w, sampan.tensor([0, 2])).shape
        (2, 3)
    """
    from .creation import arange
    from .elementwise import cast, div, ge, gt, logical_and, lt, maximum, mul, ne, where
    from .index import index_select
    from .linalg import matmul
    from .reduce import amax
    from .reduce import sum as _sum
    from .shape import concat, reshape, unsqueeze
    op = "embedding_bag"
    ids, w = _t(input), _t(weight)
    if mode not in _BAG_MODES:
        raise op_error(SampanValueError, op, f"mode={mode!r}", f"one of {_BAG_MODES}")
    if max_norm is not None or scale_grad_by_freq:
        raise op_error(SampanValueError, op, "max_norm or scale_grad_by_freq",
                       "neither (not implemented in sampan)")
    if ids.dtype.kind not in "iu":
        raise op_error(DTypeError, op, f"input dtype {ids.dtype}", "integer ids")
    if w.ndim != 2 or not _dt.is_floating(w.dtype):
        raise op_error(ShapeError, op, f"weight {w.dtype}{list(w.shape)}",
                       "a 2-d floating weight (num_embeddings, dim)")
    if per_sample_weights is not None:
        per_sample_weights = _t(per_sample_weights)
        if mode != "sum" or tuple(per_sample_weights.shape) != tuple(ids.shape):
            raise op_error(SampanValueError, op, f"per_sample_weights of shape "
                           f"{tuple(per_sample_weights.shape)} with mode={mode!r}",
                           f"mode='sum' and weights shaped like the input {tuple(ids.shape)}")
    if ids.ndim == 2:
        if offsets is not None:
            raise op_error(SampanValueError, op, "offsets with a 2-d input",
                           "offsets only with a 1-d input (a 2-d input has a bag per row)")
        b, length = ids.shape
        starts = Tensor(np.arange(b, dtype=np.int64) * length)
        ends = Tensor(np.arange(1, b + 1, dtype=np.int64) * length)
        ids = reshape(ids, (b * length,))
        if per_sample_weights is not None:
            per_sample_weights = reshape(per_sample_weights, (b * length,))
    elif ids.ndim == 1:
        if offsets is None:
            raise op_error(SampanValueError, op, "a 1-d input without offsets",
                           "offsets (the start of each bag) with a 1-d input")
        off = cast(_t(offsets), "int64")
        if off.ndim != 1 or off.shape[0] < (2 if include_last_offset else 1):
            raise op_error(ShapeError, op, f"offsets of shape {tuple(off.shape)}",
                           "a 1-d offsets tensor with an entry per bag (one more with "
                           "include_last_offset)")
        m = ids.shape[0]
        if include_last_offset:
            starts, ends = off[:-1], off[1:]
        else:
            starts = off
            ends = concat([off[1:], Tensor(np.array([m], np.int64))], 0)
    else:
        raise op_error(ShapeError, op, f"input of shape {tuple(ids.shape)}",
                       "a 1-d input with offsets or a 2-d input")
    m = ids.shape[0]
    pos = unsqueeze(arange(m, dtype="int64"), 0)                     # (1, M)
    member = logical_and(ge(pos, unsqueeze(starts, 1)), lt(pos, unsqueeze(ends, 1)))
    if padding_idx is not None:
        member = logical_and(member, unsqueeze(ne(ids, int(padding_idx) % w.shape[0]), 0))
    rows = index_select(w, ids, 0)                                    # (M, D)
    mask = cast(member, w.dtype)                                      # (B, M)
    if mode == "max":
        big = where(unsqueeze(member, 2), unsqueeze(rows, 0), float("-inf"))
        out = amax(big, 1)
        return where(unsqueeze(gt(_sum(mask, 1), 0.0), 1), out, 0.0)
    if per_sample_weights is not None:
        mask = mul(mask, unsqueeze(cast(per_sample_weights, w.dtype), 0))
    out = matmul(mask, rows)
    if mode == "mean":
        out = div(out, unsqueeze(maximum(_sum(cast(member, w.dtype), 1), 1.0), 1))
    return out


def _bag(mode):
    def fn(ids, w, offsets=None, per_sample_weights=None, **attrs):
        return embedding_bag(ids, w, offsets, mode=mode, per_sample_weights=per_sample_weights,
                             **attrs)
    return fn


def _register():
    from .composite import COMPOSITES
    ids = np.array([1, 2, 4, 5, 4, 3, 2, 0])
    COMPOSITES["embedding_bag_sum"] = (_bag("sum"), lambda: [
        Sample((ids, randf(rng(140), 6, 3), np.array([0, 3, 3, 6]), randf(rng(141), 8)),
               {"padding_idx": 2})])
    COMPOSITES["embedding_bag_mean"] = (_bag("mean"), lambda: [
        Sample((ids, randf(rng(142), 6, 3), np.array([0, 2, 5, 8])),
               {"include_last_offset": True})])
    COMPOSITES["embedding_bag_max"] = (_bag("max"), lambda: [
        Sample((ids.reshape(2, 4), randf(rng(143), 6, 3)), {})])
    COMPOSITES["instance_norm"] = (instance_norm, lambda: [
        Sample((randf(rng(144), 2, 3, 4), None, None, randf(rng(145), 3), randf(rng(146), 3)),
               {})])
    COMPOSITES["local_response_norm"] = (local_response_norm, lambda: [
        Sample((randf(rng(147), 1, 5, 2, 3),), {"size": 3, "alpha": 0.1, "beta": 0.6, "k": 2.0}),
        Sample((randf(rng(148), 2, 4, 3),), {"size": 2})])


_register()
