"""Sorting: TopK (k = the whole axis for sort/argsort). TopK is not stable: equal values
may come in another order than numpy's stable sort, so argsort of ties can differ."""
from __future__ import annotations

import numpy as np

from . import register_lowering


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
