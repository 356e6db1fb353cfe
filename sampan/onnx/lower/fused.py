"""The `fused` node (a group of elementwise ops the fusion pass merged): its body lowers
op by op through each op's own mapping."""
from __future__ import annotations

from ...ops.fused import body_attrs
from ._register import register_lowering


@register_lowering("fused")
def _fused(ctx, *xs, body, outputs):
    vals = list(xs)
    for e in body:
        vals.append(ctx.lower(e[0], [vals[i] for i in e[1]], body_attrs(e))[0])
    return [vals[i] for i in outputs]
