"""`attention` (ops/attention.py) written back as the chain it fused: each of q, k, v
Reshape to (B, S, heads, d) and Transpose to head-major, q times the scale, MatMul with
k^T, Add the bias, Softmax over the keys, MatMul with v, Transpose and Reshape back to
(B, S, H). A Reshape's 0 keeps the batch and sequence dims, so symbolic ones stay."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering


@register_lowering("attention")
def _attention(ctx, q, k, v, bias=None, *, heads, scale):
    spec = ctx.spec(q)
    h = spec.shape[-1]
    if not isinstance(h, int):
        ctx.fail("the hidden (last) dim must have a fixed size")
    d = h // int(heads)
    split = ctx.ints([0, 0, int(heads), d])

    def heads_of(x, perm):
        return ctx.emit("Transpose", [ctx.emit("Reshape", [x, split])], perm=perm)
    qs = ctx.emit("Mul", [heads_of(q, [0, 2, 1, 3]),
                          ctx.const(np.asarray(scale, spec.dtype), "scale")])
    s = ctx.emit("MatMul", [qs, heads_of(k, [0, 2, 3, 1])])
    if bias is not None:
        s = ctx.emit("Add", [s, bias])
    p = ctx.emit("Softmax", [s], axis=-1)
    o = ctx.emit("Transpose", [ctx.emit("MatMul", [p, heads_of(v, [0, 2, 1, 3])])],
                 perm=[0, 2, 1, 3])
    return ctx.emit("Reshape", [o, ctx.ints([0, 0, h])])
