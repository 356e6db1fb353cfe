"""Row ops over the last axis: Softmax, LogSoftmax, LayerNormalization (standardize is a
layer norm without scale and shift)."""
from __future__ import annotations

import numpy as np

from . import register_lowering


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
