"""Reductions: ReduceSum/Mean/Max/Min/Prod (axes an input from opset 18, ReduceSum's from
13), ArgMax/ArgMin, all/any through int32, CumSum."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering
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


def scan(ctx, x, axis, identity, combine):
    """An inclusive scan along a static axis in log2(n) steps (Hillis-Steele): at step k
    each element is combined with the one 2**k before it (the identity before the start).
    ONNX's only scan op is CumSum; the others would need a Scan subgraph."""
    spec = ctx.spec(x)
    nd = len(spec.shape)
    ax = axis % nd
    n = spec.shape[ax]
    if not isinstance(n, int):
        ctx.fail("a scan along a dim of symbolic size")
    y, k = x, 1
    while k < n:
        head = ctx.emit("Slice", [y, ctx.ints([0]), ctx.ints([n - k]), ctx.ints([ax])])
        pads = [0] * (2 * nd)
        pads[ax] = k
        shifted = ctx.emit("Pad", [head, ctx.ints(pads), ctx.scalar(identity, spec.dtype)])
        ctx.specs[shifted] = ctx.specs[y] = spec
        y = combine(ctx, y, shifted)
        k *= 2
    return y if y is not x else ctx.emit("Identity", [x])


@register_lowering("cumprod")
def _cumprod(ctx, x, *, axis):
    return scan(ctx, x, axis, 1, lambda c, a, b: c.emit("Mul", [a, b]))


@register_lowering("logcumsumexp")
def _logcumsumexp(ctx, x, *, axis):
    from .elementwise import _logaddexp
    return scan(ctx, x, axis, -np.inf, _logaddexp(np.e))


def _cum_extreme(largest):
    """cummax / cummin: the scan over (value, index) pairs. The later segment wins when it
    holds a NaN, or when neither does and its value is at least (at most) the earlier's:
    ties take the later position and a NaN takes over, as sampan and PyTorch do."""
    def lower(ctx, x, *, axis):
        spec = ctx.spec(x)
        nd, ax = len(spec.shape), axis % len(spec.shape)
        n = spec.shape[ax]
        if not isinstance(n, int):
            ctx.fail("a scan along a dim of symbolic size")
        dt = spec.dtype
        if dt.kind == "f":
            ident = -np.inf if largest else np.inf
        elif dt.kind == "b":
            ident = not largest
        else:
            ident = np.iinfo(dt).min if largest else np.iinfo(dt).max
        shape = [1] * nd
        shape[ax] = n
        idx = ctx.emit("Expand", [ctx.const(np.arange(n, dtype=np.int64).reshape(shape), "pos"),
                                  ctx.emit("Shape", [x])])
        v, k = x, 1
        cmp = "GreaterOrEqual" if largest else "LessOrEqual"
        vv = v if dt.kind != "b" else ctx.cast(v, np.int8)
        fill = ctx.scalar(int(ident) if dt.kind == "b" else ident, np.int8 if dt.kind == "b"
                          else dt)
        while k < n:
            pads = [0] * (2 * nd)
            pads[ax] = k
            sl = [ctx.ints([0]), ctx.ints([n - k]), ctx.ints([ax])]
            pv = ctx.emit("Pad", [ctx.emit("Slice", [vv, *sl]), ctx.ints(pads), fill])
            pi = ctx.emit("Pad", [ctx.emit("Slice", [idx, *sl]), ctx.ints(pads),
                                  ctx.scalar(0, np.int64)])
            later = ctx.emit(cmp, [vv, pv])
            if dt.kind == "f":
                later = ctx.emit("Or", [ctx.emit("IsNaN", [vv]), ctx.emit(
                    "And", [ctx.emit("Not", [ctx.emit("IsNaN", [pv])]), later])])
            vv = ctx.emit("Where", [later, vv, pv])
            idx = ctx.emit("Where", [later, idx, pi])
            k *= 2
        vals = vv if dt.kind != "b" else ctx.cast(vv, bool)
        return (vals if vals is not x else ctx.emit("Identity", [x])), idx
    return lower


register_lowering("cummax")(_cum_extreme(True))
register_lowering("cummin")(_cum_extreme(False))
