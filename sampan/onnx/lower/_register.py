"""`register_lowering`: the decorator every family module of `sampan.onnx.lower` uses (its
own module, so that the families need not import the package that imports them)."""
from __future__ import annotations

from ...ops.registry import OPS


def register_lowering(op_name: str):
    """Decorator: make `fn(ctx, *inputs, **attrs)` the ONNX mapping of op `op_name`."""
    def deco(fn):
        if op_name not in OPS:
            raise ValueError(f"register_lowering: no op {op_name!r} in the op table")
        OPS[op_name].onnx = fn
        return fn
    return deco
