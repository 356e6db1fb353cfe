"""Reductions: ReduceSum/Mean/Max/Min/Prod (axes an input from opset 18, ReduceSum's from
13), ArgMax/ArgMin, all/any through int32, CumSum."""
from __future__ import annotations

import numpy as np

from . import register_lowering
from .elementwise import as_dtype


def reduce(ctx, onnx_op, x, axis, keepdims):
    """`onnx_op` over `axis` (None: every axis) of `x`."""
    if axis is None:
        return ctx.emit(onnx_op, [x], keepdims=int(keepdims))
    axes = [int(a) for a in axis]
    if not axes:
        return ctx.emit("Identity", [x])
    if onnx_op == "ReduceSum" or ctx.opset >= 18:
        return ctx.emit(onnx_op, [x, ctx.ints(axes)], keepdims=int(keepdims))
    return ctx.emit(onnx_op, [x], axes=axes, keepdims=int(keepdims))


def _reduction(onnx_op):
    def lower(ctx, x, *, axis=None, keepdims=False):
        y = ctx.out_dtype
        return reduce(ctx, onnx_op, as_dtype(ctx, x, y), axis, keepdims)
    return lower


for _name, _t in [("sum", "ReduceSum"), ("mean", "ReduceMean"), ("max", "ReduceMax"),
                  ("min", "ReduceMin"), ("prod", "ReduceProd")]:
    register_lowering(_name)(_reduction(_t))


def _bool_reduction(onnx_op):
    def lower(ctx, x, *, axis=None, keepdims=False):
        r = reduce(ctx, onnx_op, ctx.cast(x, np.int32), axis, keepdims)
        return ctx.cast(r, bool)
    return lower


register_lowering("all")(_bool_reduction("ReduceMin"))
register_lowering("any")(_bool_reduction("ReduceMax"))


def _arg(onnx_op):
    def lower(ctx, x, *, axis=None, keepdims=False):
        if axis is None:
            flat = ctx.emit("Reshape", [x, ctx.ints([-1])])
            r = ctx.emit(onnx_op, [flat], axis=0, keepdims=0)
            if keepdims:
                r = ctx.emit("Reshape", [r, ctx.ints([1] * len(ctx.spec(x).shape))])
            return r
        return ctx.emit(onnx_op, [x], axis=int(axis), keepdims=int(keepdims))
    return lower


register_lowering("argmax")(_arg("ArgMax"))
register_lowering("argmin")(_arg("ArgMin"))


@register_lowering("cumsum")
def _cumsum(ctx, x, *, axis):
    x = as_dtype(ctx, x, ctx.out_dtype)
    return ctx.emit("CumSum", [x, ctx.scalar(int(axis), np.int64)])
