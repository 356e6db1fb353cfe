"""ONNX lowerings, one function per sampan op, registered into the op table.

An op's `onnx` field is either an ONNX op type (a string: the ONNX op takes the same
inputs, in the same order, and no attributes) or a lowering function registered here::

    @register_lowering("sum")
    def _sum(ctx, x, *, axes, keepdims):
        return ctx.emit("ReduceSum", [x, ctx.ints(axes)], keepdims=int(keepdims))

A lowering gets the export context (`sampan.onnx.lower.context.Ctx`: `emit` a node, `const` /
`ints` / `scalar` for initializers, `spec` of an input, `opset`, `fail`) and the ONNX
names of the node's inputs, with the node's attributes as keywords; it returns the ONNX
name of each output. Lowerings never import onnx: the context builds the protos.
The families live in the modules imported at the bottom.

Ops left `NO_ONNX`, and why: gradients and training helpers (`*_grad`, `triu_scatter`,
`max_pool2d_gather`, `ctc_loss_posterior`; `getitem_grad` and `rows_scatter_add` are
lowered: in-place writes through views and embeddings use them forward); ops ONNX has no op
or exact formula for (`lgamma`, `polygamma`, `erfinv`, `poisson`, the linalg
decompositions, solve and inverse: ONNX has only `Det`); ops whose output size is a
data value (`bincount`, `repeat_interleave`, `unique_consecutive`); `mode`, `ctc_loss`,
`adaptive_max_pool2d_indices` (not written yet).
"""
from __future__ import annotations

from ._register import register_lowering  # noqa: F401  (the families' decorator)
from . import (conv, creation, elementwise, fused, index, layout, matmul, reduce,  # noqa: E402,F401
               quant, quant_fused, rowwise, shape, sort)
from . import attention  # noqa: E402,F401  (issue 31: the fused self-attention)
