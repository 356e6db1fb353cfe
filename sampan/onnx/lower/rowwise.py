"""Row ops over the last axis: Softmax, LogSoftmax, LayerNormalization (standardize is a
layer norm without scale and shift)."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering


@register_lowering("layer_norm_affine")
def _layer_norm(ctx, x, w, b, *, eps):
    return ctx.emit("LayerNormalization", [x, w, b], axis=-1, epsilon=float(eps))


@register_lowering("standardize")
def _standardize(ctx, x, *, eps):
    spec = ctx.spec(x)
    n = spec.shape[-1]
    if not isinstance(n, int):
        ctx.fail("the normalised (last) dim must have a fixed size")
    ones = ctx.const(np.ones(n, spec.dtype), "ones")
    return ctx.emit("LayerNormalization", [x, ones], axis=-1, epsilon=float(eps))


@register_lowering("softmax_cross_entropy")
def _cross_entropy(ctx, x, t, *, ignore_index):
    """Per row: (logsumexp(x) - x[target], 0 where target is ignore_index; logsumexp)."""
    dt = ctx.spec(x).dtype
    m = ctx.emit("ReduceMax", [x, ctx.ints([-1])], keepdims=1)
    s = ctx.emit("ReduceSum", [ctx.emit("Exp", [ctx.emit("Sub", [x, m])]), ctx.ints([-1])],
                 keepdims=1)
    lse = ctx.emit("Add", [ctx.emit("Log", [s]), m])
    t64 = ctx.cast(t, np.int64) if ctx.spec(t).dtype != np.int64 else t
    ignored = ctx.emit("Equal", [t64, ctx.scalar(int(ignore_index), np.int64)])
    safe = ctx.emit("Where", [ignored, ctx.scalar(0, np.int64), t64])
    picked = ctx.emit("GatherElements", [x, ctx.emit("Unsqueeze", [safe, ctx.ints([-1])])],
                      axis=-1)
    lse1 = ctx.emit("Squeeze", [lse, ctx.ints([-1])])
    loss = ctx.emit("Sub", [lse1, ctx.emit("Squeeze", [picked, ctx.ints([-1])])])
    loss = ctx.emit("Where", [ignored, ctx.scalar(0, dt), loss])
    return loss, lse1
