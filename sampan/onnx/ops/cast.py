"""Import handlers for Cast and CastLike.

`to` names an ONNX TensorProto data type; those sampan has no dtype for (strings,
complex, uint16/32/64, the float8/float4 and int4/int2 families) are an OnnxError that
names the type. `saturate` and `round_mode` only concern the float8 targets, so they are
read and have nothing to do here.
"""
from __future__ import annotations

import sampan

from ... import dtypes as _dt
from . import onnx_op


def onnx_dtype(ctx, code, what="`to`"):
    """The sampan dtype of an ONNX TensorProto data type, or an OnnxError naming it."""
    from onnx import TensorProto, helper
    try:
        name = TensorProto.DataType.Name(int(code))
    except ValueError:
        raise ctx.error(f"{what}={code} is not an ONNX data type") from None
    try:
        np_dtype = helper.tensor_dtype_to_np_dtype(int(code))
        d = _dt.as_dtype(np_dtype)
    except Exception:  # noqa: BLE001 - onnx's or sampan's refusal, restated
        raise ctx.error(f"{what}={name}: sampan has no such dtype (it has "
                        f"{', '.join(_dt.DTYPES)})") from None
    return d


def _check_input(ctx, x):
    if x.dtype not in _dt.DTYPES.values():
        raise ctx.error(f"input of type {x.dtype}, which sampan has no dtype for")


@onnx_op("Cast", since=1)
def cast(ctx, node, x):
    to = node.attr("to")
    if to is None:
        raise ctx.error("needs the `to` attribute")
    if isinstance(to, str):          # opset 1 spelled the type as a string
        from onnx import TensorProto
        try:
            to = TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise ctx.error(f"to={to!r} is not an ONNX data type") from None
    d = onnx_dtype(ctx, to)
    _check_input(ctx, x)
    return x if x.dtype == d else sampan.cast(x, d)


@onnx_op("CastLike", since=15)
def cast_like(ctx, node, x, like):
    _check_input(ctx, x)
    return x if x.dtype == like.dtype else sampan.cast(x, like.dtype)
