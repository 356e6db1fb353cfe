"""Gathers and scatters: Gather, GatherElements, ScatterElements (with reduction), index_add
as a ScatterND-free ScatterElements over expanded indices, nonzero, masked_select."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering
from .elementwise import as_dtype


def _i64(ctx, i):
    return as_dtype(ctx, i, np.int64)


@register_lowering("index_select")
def _index_select(ctx, x, idx, *, axis):
    return ctx.emit("Gather", [x, _i64(ctx, idx)], axis=int(axis))


@register_lowering("rows_gather")
def _rows_gather(ctx, x, idx):
    return ctx.emit("Gather", [x, _i64(ctx, idx)], axis=0)


@register_lowering("take_along_axis")
def _take_along(ctx, x, idx, *, axis):
    # torch.gather's reading: the index may be smaller than x on the other axes (it reads
    # their leading part), which GatherElements allows too
    ax = axis % len(ctx.spec(x).shape)
    idx = _i64(ctx, idx)
    return ctx.emit("GatherElements", [x, idx], axis=ax)


@register_lowering("scatter")
def _scatter(ctx, x, idx, src, *, axis):
    src = as_dtype(ctx, _fit_src(ctx, src, idx), ctx.out_dtype)
    return ctx.emit("ScatterElements", [x, _i64(ctx, idx), src], axis=int(axis))


@register_lowering("scatter_add")
def _scatter_add(ctx, x, idx, src, *, axis):
    src = as_dtype(ctx, _fit_src(ctx, src, idx), ctx.out_dtype)
    return ctx.emit("ScatterElements", [x, _i64(ctx, idx), src], axis=int(axis),
                    reduction="add")


def _fit_src(ctx, src, idx):
    """src cut to the index's shape (torch's scatter reads only that corner of src)."""
    ss, ids = ctx.spec(src).shape, ctx.spec(idx).shape
    if tuple(ss) == tuple(ids):
        return src
    n = len(ids)
    return ctx.emit("Slice", [src, ctx.ints([0] * n), ctx.ints(list(ids)),
                              ctx.ints(list(range(n)))])


_REDUCE = {"sum": ("add", 0.0), "prod": ("mul", 1.0), "amax": ("max", -np.inf),
           "amin": ("min", np.inf)}


@register_lowering("scatter_reduce")
def _scatter_reduce(ctx, x, idx, src, *, axis, reduce, include_self=True):
    dt = ctx.out_dtype
    src = as_dtype(ctx, _fit_src(ctx, src, idx), dt)
    idx = _i64(ctx, idx)
    if reduce == "mean":
        ones = ctx.emit("Expand", [ctx.scalar(1, dt), ctx.emit("Shape", [src])])
        base = x
        cnt0 = ctx.emit("Expand", [ctx.scalar(1 if include_self else 0, dt),
                                   ctx.emit("Shape", [x])])
        if not include_self:
            zeros = ctx.emit("Expand", [ctx.scalar(0, dt), ctx.emit("Shape", [src])])
            base = ctx.emit("ScatterElements", [x, idx, zeros], axis=int(axis))
        total = ctx.emit("ScatterElements", [base, idx, src], axis=int(axis), reduction="add")
        cnt = ctx.emit("ScatterElements", [cnt0, idx, ones], axis=int(axis), reduction="add")
        cnt = ctx.emit("Max", [cnt, ctx.scalar(1, dt)])
        if dt.kind in "iu":     # sampan's integer mean rounds down, as floor division
            from .elementwise import _floor_divide
            ctx.specs[total] = ctx.specs[cnt] = ctx.out[0]
            return _floor_divide(ctx, total, cnt)
        return ctx.emit("Div", [total, cnt])
    if reduce not in _REDUCE:
        ctx.fail(f"scatter_reduce with reduce={reduce!r}")
    red, ident = _REDUCE[reduce]
    base = x
    if not include_self:
        fill = ctx.emit("Expand", [ctx.scalar(_ident(ident, dt), dt),
                                   ctx.emit("Shape", [src])])
        base = ctx.emit("ScatterElements", [x, idx, fill], axis=int(axis))
    return ctx.emit("ScatterElements", [base, idx, src], axis=int(axis), reduction=red)


def _ident(v, dt):
    if dt.kind in "iu" and not np.isfinite(v):
        info = np.iinfo(dt)
        return info.min if v < 0 else info.max
    return v


@register_lowering("index_add")
def _index_add(ctx, x, idx, src, *, axis):
    # y[..., idx[j], ...] += src[..., j, ...]: the index spread over src's shape
    ss = ctx.spec(src).shape
    nd = len(ss)
    ax = axis % nd
    shape = [1] * nd
    shape[ax] = -1
    i = ctx.emit("Reshape", [_i64(ctx, idx), ctx.ints(shape)])
    i = ctx.emit("Expand", [i, ctx.emit("Shape", [src])])
    return ctx.emit("ScatterElements", [x, i, as_dtype(ctx, src, ctx.out_dtype)], axis=ax,
                    reduction="add")


@register_lowering("rows_scatter_add")
def _rows_scatter_add(ctx, g, idx, *, n):
    gs = ctx.spec(g)
    if any(isinstance(d, str) for d in gs.shape[1:]):
        ctx.fail("rows_scatter_add with symbolic row width")
    zeros = ctx.const(np.zeros((n,) + tuple(gs.shape[1:]), gs.dtype), "zeros")
    ctx.specs[zeros] = type(gs)((n,) + tuple(gs.shape[1:]), gs.dtype)
    return _index_add(ctx, zeros, idx, g, axis=0)


@register_lowering("nonzero")
def _nonzero(ctx, x):
    return ctx.emit("Transpose", [ctx.emit("NonZero", [x])], perm=[1, 0])


@register_lowering("masked_select")
def _masked_select(ctx, x, mask):
    xs, ms = ctx.spec(x).shape, ctx.spec(mask).shape
    if tuple(xs) != tuple(ms):
        shape = ctx.emit("Shape", [ctx.emit("Add", [ctx.cast(mask, ctx.spec(x).dtype), x])])
        x = ctx.emit("Expand", [x, shape])
        mask = ctx.emit("Expand", [mask, shape])
    return ctx.emit("Compress", [ctx.emit("Reshape", [x, ctx.ints([-1])]),
                                 ctx.emit("Reshape", [mask, ctx.ints([-1])])], axis=0)


@register_lowering("unique")
def _unique(ctx, x, *, sorted=True, dim=None):
    if dim is None:
        y, _, inv, cnt = ctx.emit("Unique", [x], n_out=4, sorted=int(sorted))
        inv = ctx.emit("Reshape", [inv, ctx.emit("Shape", [x])])
        return y, inv, cnt
    y, _, inv, cnt = ctx.emit("Unique", [x], n_out=4, sorted=int(sorted), axis=int(dim))
    return y, inv, cnt


@register_lowering("masked_scatter")
def _masked_scatter(ctx, x, mask, source):
    """Where the mask is set, the next element of source in order: its running count."""
    shape = ctx.emit("Shape", [x])
    m = ctx.emit("Expand", [mask, shape])
    flat = ctx.emit("Reshape", [m, ctx.ints([-1])])
    pos = ctx.emit("Sub", [ctx.emit("CumSum", [ctx.cast(flat, np.int64),
                                               ctx.scalar(0, np.int64)]),
                           ctx.scalar(1, np.int64)])
    pos = ctx.emit("Max", [pos, ctx.scalar(0, np.int64)])
    src = ctx.emit("Reshape", [as_dtype(ctx, source, ctx.out_dtype), ctx.ints([-1])])
    vals = ctx.emit("Reshape", [ctx.emit("Gather", [src, pos], axis=0), shape])
    return ctx.emit("Where", [m, vals, x])


@register_lowering("histc")
def _histc(ctx, x, *, bins, min, max):
    """Counts per bin: each value's bin index (out-of-range values into one extra bin,
    cut off after) scattered as ones into zeros."""
    dt = ctx.spec(x).dtype
    v = ctx.emit("Reshape", [ctx.cast(x, np.float64), ctx.ints([-1])])
    if min == max:     # the data's own range (widened by one if it is a single value)
        lo = ctx.emit("ReduceMin", [v], keepdims=0)
        hi = ctx.emit("ReduceMax", [v], keepdims=0)
        same = ctx.emit("Equal", [lo, hi])
        one = ctx.scalar(1.0, np.float64)
        lo = ctx.emit("Where", [same, ctx.emit("Sub", [lo, one]), lo])
        hi = ctx.emit("Where", [same, ctx.emit("Add", [hi, one]), hi])
    else:
        lo, hi = ctx.scalar(float(min), np.float64), ctx.scalar(float(max), np.float64)
    scale = ctx.emit("Div", [ctx.scalar(float(bins), np.float64), ctx.emit("Sub", [hi, lo])])
    i = ctx.emit("Floor", [ctx.emit("Mul", [ctx.emit("Sub", [v, lo]), scale])])
    i = ctx.emit("Min", [i, ctx.scalar(float(bins - 1), np.float64)])   # the top edge
    inside = ctx.emit("And", [ctx.emit("GreaterOrEqual", [v, lo]),
                              ctx.emit("LessOrEqual", [v, hi])])
    i = ctx.cast(ctx.emit("Where", [inside, i, ctx.scalar(float(bins), np.float64)]), np.int64)
    ones = ctx.emit("Expand", [ctx.scalar(1, dt), ctx.emit("Shape", [i])])
    zeros = ctx.const(np.zeros(bins + 1, dt), "zeros")
    counts = ctx.emit("ScatterElements", [zeros, i, ones], axis=0, reduction="add")
    return ctx.emit("Slice", [counts, ctx.ints([0]), ctx.ints([bins])])
