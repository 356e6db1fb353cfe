"""Handlers the importer itself relies on: Constant, Identity, Shape, Size."""
from __future__ import annotations

import numpy as np

from . import onnx_op


@onnx_op("Constant", since=1)
def constant(ctx, node):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in node.attrs:
            v = node.attrs[key]
            dtype = {"value_float": np.float32, "value_floats": np.float32,
                     "value_int": np.int64, "value_ints": np.int64}.get(key)
            return ctx.make_static(np.asarray(v, dtype=dtype))
    raise ctx.error(f"needs one of value, value_float(s), value_int(s); got "
                    f"{sorted(node.attrs)} (sparse and string constants are not supported)")


@onnx_op("Identity", since=1)
def identity(ctx, node, x):
    return x


@onnx_op("Shape", since=1)
def shape(ctx, node, x):
    dims = np.array(x.shape, dtype=np.int64)
    if ctx.opset >= 15:
        start, end = node.attr("start", 0), node.attr("end", None)
        dims = dims[start:end]
    return ctx.make_static(dims)


@onnx_op("Size", since=1)
def size(ctx, node, x):
    return ctx.make_static(np.array(int(np.prod(x.shape)), dtype=np.int64))
