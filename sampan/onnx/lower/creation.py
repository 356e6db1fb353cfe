"""Creation and random ops: Range, Trilu, RandomNormal/RandomUniform (onnxruntime's own
generator: the same distribution, not sampan's stream; the key input is not read)."""
from __future__ import annotations

import numpy as np

from ...dtypes import as_dtype
from ._register import register_lowering


@register_lowering("arange")
def _arange(ctx, *, start, stop, step, dtype):
    dt = as_dtype(dtype)
    n = len(np.arange(start, stop, step, dtype=dt)) if not any(
        isinstance(v, str) for v in (start, stop, step)) else None
    if n is not None:
        return ctx.emit("Identity", [ctx.const(np.arange(start, stop, step, dtype=dt))])
    return ctx.emit("Range", [ctx.scalar(start, dt), ctx.scalar(stop, dt),
                              ctx.scalar(step, dt)])


def _tri(upper):
    def lower(ctx, x, *, diagonal=0):
        return ctx.emit("Trilu", [x, ctx.scalar(int(diagonal), np.int64)], upper=int(upper))
    return lower


register_lowering("tril")(_tri(False))
register_lowering("triu")(_tri(True))


@register_lowering("normal")
def _normal(ctx, key, *, shape, mean, std, dtype):
    if any(isinstance(d, str) for d in shape):
        like = ctx.emit("Expand", [ctx.scalar(0, np.float32), ctx.ints(shape)])
        return ctx.emit("RandomNormalLike", [like], mean=float(mean), scale=float(std),
                        dtype=ctx.onnx_dtype(dtype))
    return ctx.emit("RandomNormal", [], shape=list(shape), mean=float(mean), scale=float(std),
                    dtype=ctx.onnx_dtype(dtype))


@register_lowering("uniform")
def _uniform(ctx, key, *, shape, low, high, dtype):
    if any(isinstance(d, str) for d in shape):
        like = ctx.emit("Expand", [ctx.scalar(0, np.float32), ctx.ints(shape)])
        return ctx.emit("RandomUniformLike", [like], low=float(low), high=float(high),
                        dtype=ctx.onnx_dtype(dtype))
    return ctx.emit("RandomUniform", [], shape=list(shape), low=float(low), high=float(high),
                    dtype=ctx.onnx_dtype(dtype))


@register_lowering("randint")
def _randint(ctx, key, *, shape, low, high, dtype):
    if any(isinstance(d, str) for d in shape):
        ctx.fail("randint of symbolic shape")
    u = ctx.emit("RandomUniform", [], shape=list(shape), low=float(low), high=float(high),
                 dtype=ctx.onnx_dtype(np.float64))
    # float64 keeps every integer below 2**53 exactly; high itself has probability 0
    r = ctx.emit("Min", [ctx.emit("Floor", [u]), ctx.scalar(float(high) - 1, np.float64)])
    return ctx.cast(r, dtype)
