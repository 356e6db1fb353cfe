"""Sorting: TopK (k = the whole axis for sort/argsort). TopK is not stable: equal values
may come in another order than numpy's stable sort, so argsort of ties can differ."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering


def _k_of(ctx, x, axis, k=None):
    if k is not None:
        return ctx.ints([k])
    d = ctx.spec(x).shape[axis]
    if isinstance(d, int):
        return ctx.ints([d])
    nd = len(ctx.spec(x).shape)
    a = axis % nd
    return ctx.emit("Shape", [x], start=a, end=a + 1)


@register_lowering("topk")
def _topk(ctx, x, *, k, axis, largest=True, sorted=True):
    v, i = ctx.emit("TopK", [x, _k_of(ctx, x, axis, k)], n_out=2, axis=int(axis),
                    largest=int(largest), sorted=1)
    return v, i


@register_lowering("sort")
def _sort(ctx, x, *, axis, descending=False):
    return ctx.emit("TopK", [x, _k_of(ctx, x, axis)], n_out=2, axis=int(axis),
                    largest=int(descending), sorted=1)


@register_lowering("argsort")
def _argsort(ctx, x, *, axis, descending=False):
    _, i = ctx.emit("TopK", [x, _k_of(ctx, x, axis)], n_out=2, axis=int(axis),
                    largest=int(descending), sorted=1)
    return ctx.emit("Identity", [i]) if np.dtype(ctx.out_dtype) == np.int64 else \
        ctx.cast(i, ctx.out_dtype)


@register_lowering("kthvalue")
def _kthvalue(ctx, x, *, k, axis, keepdim=False):
    """The k-th smallest: the last of TopK's k smallest."""
    v, i = ctx.emit("TopK", [x, ctx.ints([k])], n_out=2, axis=int(axis), largest=0, sorted=1)
    sl = [ctx.ints([k - 1]), ctx.ints([k]), ctx.ints([int(axis)])]
    v = ctx.emit("Slice", [v, *sl])
    i = ctx.emit("Slice", [i, *sl])
    if not keepdim:
        v = ctx.emit("Squeeze", [v, ctx.ints([int(axis)])])
        i = ctx.emit("Squeeze", [i, ctx.ints([int(axis)])])
    return v, i


@register_lowering("searchsorted")
def _searchsorted(ctx, seq, vals, *, right=False):
    """How many of the sorted sequence are below (at most, with `right`) each value."""
    one_d = len(ctx.spec(seq).shape) == 1
    s = ctx.emit("Unsqueeze", [seq, ctx.ints([0 if one_d else -2])])
    v = ctx.emit("Unsqueeze", [vals, ctx.ints([-1])])
    hit = ctx.emit("LessOrEqual" if right else "Less", [s, v])
    n = ctx.emit("ReduceSum", [ctx.cast(hit, np.int64), ctx.ints([-1])], keepdims=0)
    return n
