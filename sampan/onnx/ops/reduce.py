"""Import handlers for ONNX's reductions: Reduce{Sum,Mean,Max,Min,Prod,L1,L2,LogSum,
LogSumExp,SumSquare}, ArgMax, ArgMin and CumSum.

`axes` is an attribute until opset 13 (ReduceSum) or 18 (the others) and an input after,
where `noop_with_empty_axes=1` with no axes reduces nothing (the elementwise parts still
apply: ReduceSumSquare squares, ReduceL2 takes |x|, as the ONNX reference does).
Results keep the input's dtype (sampan's integer sums widen to int64, ONNX's do not).
A reduction over an empty set gives ONNX's identity (0, 1, -inf, inf, nan for the mean).
"""
from __future__ import annotations

import numpy as np

import sampan
from . import onnx_op
from .shape import ints, norm_axes, norm_axis


def _sq(x):
    return x * x


# name -> (elementwise before, reduction, elementwise after, value over an empty set)
_KINDS = {
    "ReduceSum": (None, sampan.sum, None, 0),
    "ReduceMean": (None, sampan.mean, None, np.nan),
    "ReduceMax": (None, sampan.amax, None, -np.inf),
    "ReduceMin": (None, sampan.amin, None, np.inf),
    "ReduceProd": (None, sampan.prod, None, 1),
    "ReduceL1": (sampan.abs, sampan.sum, None, 0),
    "ReduceL2": (_sq, sampan.sum, sampan.sqrt, 0),
    "ReduceLogSum": (None, sampan.sum, sampan.log, -np.inf),
    "ReduceLogSumExp": (None, sampan.logsumexp, None, -np.inf),
    "ReduceSumSquare": (_sq, sampan.sum, None, 0),
}


def _empty_value(v, dtype):
    dt = np.dtype(dtype)
    if np.issubdtype(dt, np.integer) and not np.isfinite(v):
        info = np.iinfo(dt)
        return info.min if v < 0 else info.max
    if dt == np.bool_ and not np.isfinite(v):
        return v > 0
    return v


def _reduce(ctx, node, x, axes, noop=0):
    pre, red, post, empty = _KINDS[node.op_type]
    keep = bool(node.attr("keepdims", 1))
    if axes is None or len(ints(axes)) == 0:
        axes = () if noop else tuple(range(x.ndim))
    else:
        axes = tuple(sorted(norm_axes(ctx, axes, x.ndim)))
    dtype = x.dtype
    if any(x.shape[a] == 0 for a in axes):
        shape = [1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes]
        fill = _empty_value(empty, dtype)
        if ctx.foldable(shape, dtype):
            return ctx.make_static(np.full(shape, fill, dtype=dtype))
        return sampan.full(tuple(shape), fill.item() if hasattr(fill, "item") else fill,
                           dtype=dtype)
    y = x if pre is None else pre(x)
    if axes:
        if red is sampan.logsumexp and not sampan.dtypes.is_floating(dtype):
            y = sampan.log(sampan.sum(sampan.exp(sampan.cast(y, sampan.float64)), axis=axes,
                                      keepdims=keep))
        else:
            y = red(y, axis=axes, keepdims=keep)
    if post is not None:
        y = post(sampan.cast(y, sampan.float64) if not sampan.dtypes.is_floating(y.dtype)
                 else y)
    return y if y.dtype == dtype else sampan.cast(y, dtype)


def _attr_axes(ctx, node, x):
    return _reduce(ctx, node, x, node.attr("axes", None))


def _input_axes(ctx, node, x, axes=None):
    axes = None if axes is None else ctx.static(axes, "axes")
    return _reduce(ctx, node, x, axes, node.attr("noop_with_empty_axes", 0))


for _name in _KINDS:
    onnx_op(_name, since=1)(_attr_axes)
    onnx_op(_name, since=13 if _name == "ReduceSum" else 18)(_input_axes)


# ---------------------------------------------------------------------- ArgMax / ArgMin
def _arg(ctx, node, x, fn):
    axis = norm_axis(ctx, node.attr("axis", 0), x.ndim)
    keep = bool(node.attr("keepdims", 1))
    if node.attr("select_last_index", 0):
        # the last of equal extremes: the first in the flipped input, counted back
        i = fn(sampan.flip(x, axis), axis=axis, keepdims=keep)
        return (x.shape[axis] - 1) - i
    return fn(x, axis=axis, keepdims=keep)


@onnx_op("ArgMax", since=1)
def argmax(ctx, node, x):
    return _arg(ctx, node, x, sampan.argmax)


@onnx_op("ArgMin", since=1)
def argmin(ctx, node, x):
    return _arg(ctx, node, x, sampan.argmin)


# ---------------------------------------------------------------------- CumSum
@onnx_op("CumSum", since=11)
def cumsum(ctx, node, x, axis):
    return scan(ctx, node, x, axis, sampan.cumsum, 0.0)


def scan(ctx, node, x, axis, fn, identity):
    """CumSum / CumProd: `fn` along the static `axis`, with `reverse` and `exclusive`
    (shifted by one along the axis, `identity` first: what comes strictly before)."""
    a = np.asarray(ctx.static(axis, "axis")).reshape(-1)
    if a.size != 1:
        raise ctx.error(f"axis holds {a.size} values (expected one)")
    ax = norm_axis(ctx, a[0], x.ndim)
    rev, excl = bool(node.attr("reverse", 0)), bool(node.attr("exclusive", 0))
    y = sampan.flip(x, ax) if rev else x
    if excl:
        n = y.shape[ax]
        pads = [(0, 0)] * y.ndim
        pads[ax] = (1, 0)
        y = sampan.pad(sampan.narrow(y, ax, 0, max(n - 1, 0)), tuple(pads), value=identity)
    y = fn(y, axis=ax)
    if y.dtype != x.dtype:
        y = sampan.cast(y, x.dtype)
    return sampan.flip(y, ax) if rev else y
