"""Import handlers for Cast and CastLike.

`to` names an ONNX TensorProto data type. The types sampan has no dtype for but emulates
(uint16/32/64, int4/uint4/int2/uint2, float8 e4m3fn/e4m3fnuz/e5m2/e5m2fnuz, float4 e2m1:
see `sampan/onnx/emulate.py`) cast into their carrier with ONNX's rule: floats round to
nearest even on the type's grid, with `saturate` (float8 only, default 1) clipping to
+-max (infinities too) where it would otherwise give inf/NaN; integers truncate toward
zero and wrap into the type's range (NaN and infinities give 0), as numpy/ml_dtypes do.
float8 e8m0 (a bare power of two) rounds by `round_mode` ("up" by default, "down",
"nearest"). Strings and complex are an OnnxError naming the type.
"""
from __future__ import annotations

import numpy as np

import sampan

from ... import dtypes as _dt
from .. import emulate as _em
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
                        f"{', '.join(_dt.DTYPES)}, and emulates "
                        f"{', '.join(f.name for f in _em.FORMATS.values())})") from None
    return d


def _check_input(ctx, x):
    if x.dtype not in _dt.DTYPES.values():
        raise ctx.error(f"input of type {x.dtype}, which sampan has no dtype for")


def cast_to(ctx, x, code, saturate=True, round_mode="up"):
    """`x` (a sampan Tensor, maybe a carrier) cast to the ONNX type `code`."""
    f = _em.fmt(code)
    if f is None:
        d = onnx_dtype(ctx, code)
        return x if x.dtype == d else sampan.cast(x, d)
    if f.is_float:
        return _em.round_to(x if x.dtype.kind == "f" else sampan.cast(x, np.float32), f,
                            saturate and f.name.startswith("FLOAT8"), round_mode)
    if x.dtype.kind == "f":
        x = sampan.where(sampan.isfinite(x), sampan.trunc(x), 0.0)
        rule = _oor_rule(f) if f.storage.itemsize == 1 and f.name[-1] in "24" else "wrap"
        # out of range is undefined in ONNX's Cast; the node suite's expected values follow
        # ml_dtypes, which wraps up to 0.6 and gives 0 from 0.7: follow the installed one
        if rule == "saturate":
            x = sampan.clamp(x, float(f.lo), float(f.hi))
        elif rule == "zero":
            x = sampan.where((x < float(f.lo)) | (x > float(f.hi)), 0.0, x)
    elif x.dtype == _dt.bool_:
        x = sampan.cast(x, f.carrier)
    if f.name == "UINT64":
        return sampan.cast(x, f.carrier) if x.dtype != f.carrier else x
    # wrap in int64, then narrow: an int8 carrier cannot take 20 before wrapping
    return sampan.cast(_em.settle(x, f, np.int64), f.carrier)


_OOR: dict = {}


def _oor_rule(f) -> str:
    """What the installed ml_dtypes does with floats out of sub-byte type `f`'s range:
    "wrap", "saturate" or "zero"."""
    if f.name not in _OOR:
        with np.errstate(all="ignore"):
            got = np.array([f.lo - 3.0, f.hi + 3.0], np.float32).astype(f.storage)
        got = got.astype(np.int64).tolist()
        _OOR[f.name] = ("saturate" if got == [f.lo, f.hi] else "zero" if got == [0, 0]
                        else "wrap")
    return _OOR[f.name]


def _saturate(node):
    return bool(node.attr("saturate", 1))


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
    _check_input(ctx, x)
    return cast_to(ctx, x, to, _saturate(node), node.attr("round_mode", "up"))


@onnx_op("CastLike", since=15)
def cast_like(ctx, node, x, like):
    _check_input(ctx, x)
    code = ctx.onnx_type(1)
    if not code:
        return x if x.dtype == like.dtype else sampan.cast(x, like.dtype)
    return cast_to(ctx, x, code, _saturate(node), node.attr("round_mode", "up"))
