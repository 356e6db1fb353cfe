"""Import handlers for the ONNX quantisation ops, built from sampan ops (round half to
even, clip, cast): QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, ConvInteger.

Quantised values of a type sampan lacks (uint16, int4/uint4, int2/uint2, float8, float4)
travel in their carrier (see `sampan/onnx/emulate.py`); the handlers ask the importer for
the declared ONNX type (`ctx.onnx_type`) where the carrier does not tell it. Scales and
zero points are per tensor (a scalar or one element), per axis (1-D along `axis`), or
blocked (`block_size` > 0: x's rank, `axis` divided into blocks of `block_size`), with
the ONNX reference implementation's arithmetic: x / scale in x's dtype (or `precision`),
rounded half to even, plus the zero point, clipped to the type's range; float8 outputs
round on the float8 grid (`saturate`, default 1) and ignore the zero point as the
reference does.
"""
from __future__ import annotations

import numpy as np

import sampan

from ... import dtypes as _dt
from .. import emulate as _em
from . import onnx_op
from .cast import cast_to, onnx_dtype
from .nn import conv as _conv

_NATIVE_RANGES = {"UINT8": (0, 255), "INT8": (-128, 127), "INT16": (-32768, 32767)}


def _type_name(code):
    from onnx import TensorProto
    return TensorProto.DataType.Name(int(code))


def _axis(ctx, node, x):
    """`axis`, normalised (it matters, and is checked, only for per-axis and blocked)."""
    axis = int(node.attr("axis", 1))
    return axis + x.ndim if axis < 0 else axis


def _broadcast(ctx, v, x, axis, block, what):
    """Scale or zero point `v` shaped to broadcast against `x` (see the module doc)."""
    if v is None:
        return None
    if v.ndim == 0:
        return v
    if not block and v.ndim == 1 and v.shape[0] == 1:
        return sampan.reshape(v, ())
    if not 0 <= axis < x.ndim:
        raise ctx.error(f"axis={axis} is out of range for x of rank {x.ndim}")
    if not block:
        if v.ndim != 1 or v.shape[0] != x.shape[axis]:
            raise ctx.error(f"{what} has shape {list(v.shape)}; expected a scalar or 1-D of "
                            f"length {x.shape[axis]} (x's axis {axis}) for per-axis "
                            "quantisation (or block_size > 0 for blocked)")
        dims = [1] * x.ndim
        dims[axis] = x.shape[axis]
        return sampan.reshape(v, dims)
    if block < 0:
        raise ctx.error(f"block_size={block}; expected >= 0")
    n = x.shape[axis]
    nb = -(-n // block)
    want = list(x.shape)
    want[axis] = nb
    if list(v.shape) != want:
        raise ctx.error(f"{what} has shape {list(v.shape)}; blocked quantisation of x "
                        f"{list(x.shape)} with block_size={block} on axis {axis} wants "
                        f"{want}")
    rep = sampan.unsqueeze(v, axis + 1)
    big = list(rep.shape)
    big[axis + 1] = block
    rep = sampan.expand(rep, *big)
    full = list(x.shape)
    full[axis] = nb * block
    rep = sampan.reshape(rep, full)
    if nb * block != n:
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(0, n)
        rep = rep[tuple(idx)]
    return rep


def _code(ctx, k, t):
    """The ONNX type of the node's input `k`: as the importer knows it, else (a value of a
    sampan dtype whose type no value_info states) from the tensor's dtype."""
    return ctx.onnx_type(k) or _em.onnx_code(t.dtype)


def _float(t, dtype=np.float32):
    return t if t.dtype == dtype else sampan.cast(t, dtype)


# ---------------------------------------------------------------------- QuantizeLinear
@onnx_op("QuantizeLinear", since=10)
def quantize_linear(ctx, node, x, scale, zp=None):
    axis = _axis(ctx, node, x)
    block = int(node.attr("block_size", 0))
    out_code = int(node.attr("output_dtype", 0))
    zp_code = _code(ctx, 2, zp) if zp is not None else 0
    if out_code and zp_code and out_code != zp_code:
        raise ctx.error(f"output_dtype={_type_name(out_code)} disagrees with the zero "
                        f"point's type {_type_name(zp_code)}")
    from onnx import TensorProto
    code = out_code or zp_code or TensorProto.UINT8
    name = _type_name(code)
    precision = int(node.attr("precision", 0))
    saturate = bool(node.attr("saturate", 1))
    s = _broadcast(ctx, scale, x, axis, block, "y_scale")
    z = _broadcast(ctx, zp, x, axis, block, "y_zero_point")
    if precision:
        pd = onnx_dtype(ctx, precision, "precision")
        q = _float(x, pd) / _float(s, pd)
    else:
        q = x / s
    f = _em.fmt(code)
    if name in _NATIVE_RANGES or (f is not None and not f.is_float):
        lo, hi = _NATIVE_RANGES.get(name) or (f.lo, f.hi)
        r = sampan.cast(sampan.round(q), np.int64)
        if z is not None:
            r = r + sampan.cast(z, np.int64)
        r = sampan.clip(r, lo, hi)
        return sampan.cast(r, onnx_dtype(ctx, code) if f is None else f.carrier)
    if f is not None and f.is_float:
        if f.name == "FLOAT4E2M1" and z is not None:
            q = q + _float(z, q.dtype)
        return cast_to(ctx, q, code, saturate)
    raise ctx.error(f"the quantised type {name} is not one QuantizeLinear produces (uint8, "
                    "int8, uint16, int16, int4, uint4, int2, uint2, float8, float4)")


# ---------------------------------------------------------------------- DequantizeLinear
@onnx_op("DequantizeLinear", since=10)
def dequantize_linear(ctx, node, x, scale, zp=None):
    axis = _axis(ctx, node, x)
    block = int(node.attr("block_size", 0))
    out_code = int(node.attr("output_dtype", 0))
    f = _em.fmt(_code(ctx, 0, x))
    dx = _float(x)
    if zp is not None and not (f is not None and f.is_float):
        dx = dx - _float(_broadcast(ctx, zp, x, axis, block, "x_zero_point"))
    y = dx * _broadcast(ctx, scale, x, axis, block, "x_scale")
    want = onnx_dtype(ctx, out_code, "output_dtype") if out_code else scale.dtype
    return _float(y, want)


@onnx_op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx, node, x):
    """uint8 with the range of x stretched to hold 0 (the reference's arithmetic)."""
    x = _float(x)
    zero = sampan.zeros((), dtype=np.float32)
    hi = sampan.maximum(sampan.max(x), zero)
    lo = sampan.minimum(sampan.min(x), zero)
    span = sampan.where(hi == lo, 1.0, hi - lo)
    scale = span / 255.0
    zp = sampan.round(sampan.clip(0.0 - lo / scale, 0.0, 255.0))
    y = sampan.clip(sampan.round(x / scale) + zp, 0.0, 255.0)
    return (sampan.cast(y, np.uint8), scale, sampan.cast(zp, np.uint8))


# ---------------------------------------------------------------------- integer linear algebra
def _centered(t, z, per_row_axis=None):
    v = sampan.cast(t, np.int32)
    if z is None:
        return v
    z = sampan.cast(z, np.int32)
    if per_row_axis is not None and z.ndim == 1 and z.shape[0] > 1:
        z = sampan.reshape(z, [z.shape[0]] + [1] * (t.ndim - 1 - per_row_axis))
    return v - z


def _requantize(ctx, acc, mult, y_zp, like, code, round_first):
    """acc (int32) * mult + y_zp, rounded half to even and clipped to y's type."""
    name = _type_name(code)
    lo, hi = _NATIVE_RANGES.get(name) or (None, None)
    if lo is None:
        f = _em.fmt(code)
        if f is None or f.is_float:
            raise ctx.error(f"output type {name}; expected an integer quantised type")
        lo, hi = f.lo, f.hi
    d = _float(acc, np.float64) * _float(mult, np.float64)
    if y_zp is not None:
        d = d + _float(y_zp, np.float64)
    d = sampan.clip(sampan.round(d), lo, hi) if round_first else \
        sampan.round(sampan.clip(d, lo, hi))
    f = _em.fmt(code)
    return sampan.cast(d, like.dtype if y_zp is None else (f.carrier if f else y_zp.dtype))


@onnx_op("QLinearMatMul", since=10)
def qlinear_matmul(ctx, node, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp=None):
    acc = sampan.matmul(_centered(a, a_zp), _centered(b, b_zp))
    mult = a_scale * b_scale / y_scale           # in the scales' dtype, as the reference
    code = _code(ctx, 7, y_zp) if y_zp is not None else _code(ctx, 0, a)
    return _requantize(ctx, acc, mult, y_zp, a, code, round_first=True)


def _conv_int(ctx, node, x, w, x_zp, w_zp, bias=None):
    """conv of (x - x_zp) and (w - w_zp) exactly: in float64, whose 53-bit mantissa holds
    every int32 accumulation of 8- and 16-bit products that fits int32."""
    if x.ndim < 3:
        raise ctx.error(f"x has shape {list(x.shape)}; expected (N, C, spatial...)")
    xc = _centered(x, x_zp)
    wc = _centered(w, w_zp, per_row_axis=0)
    b = None if bias is None else _float(bias, np.float64)
    y = _conv(ctx, node, _float(xc, np.float64), _float(wc, np.float64), b)
    return sampan.cast(sampan.round(y), np.int32)


@onnx_op("ConvInteger", since=10)
def conv_integer(ctx, node, x, w, x_zp=None, w_zp=None):
    return _conv_int(ctx, node, x, w, x_zp, w_zp)


@onnx_op("QLinearConv", since=10)
def qlinear_conv(ctx, node, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp=None, b=None):
    acc = _conv_int(ctx, node, x, w, x_zp, w_zp, b)
    if w_scale.ndim == 1 and w_scale.shape[0] > 1:
        w_scale = sampan.reshape(w_scale, [1, w_scale.shape[0]] + [1] * (acc.ndim - 2))
    mult = x_scale * w_scale / y_scale
    code = _code(ctx, 7, y_zp) if y_zp is not None else _code(ctx, 0, x)
    if x.dtype not in (_dt.uint8, _dt.int8):
        raise ctx.error(f"x is {x.dtype}; expected uint8 or int8")
    return _requantize(ctx, acc, mult, y_zp, x, code, round_first=False)


# ---------------------------------------------------------------------- BitCast
@onnx_op("BitCast", since=26)
def bitcast(ctx, node, x):
    """Reinterpret the bits of x as `to` (same width). Between integer types (and bool) it
    is two's complement wrap-around, with sampan ops; a float on either side needs a bit
    view, which sampan has no op for: then the input must be known when the graph is
    built (a constant, an initializer, or bound by `sampan.onnx.backend`) and the view is
    numpy's, on the declared storage dtypes."""
    from onnx import helper
    to = node.attr("to")
    if to is None:
        raise ctx.error("needs the `to` attribute")
    src = _em.fmt(_code(ctx, 0, x))
    have = src.storage if src is not None else x.dtype
    dst = _em.fmt(to)
    try:
        want = dst.storage if dst is not None else np.dtype(helper.tensor_dtype_to_np_dtype(to))
    except Exception:  # noqa: BLE001 - onnx's refusal, restated
        raise ctx.error(f"to={to} is not an ONNX data type sampan reads") from None
    if want.itemsize != have.itemsize or _bits(have) != _bits(want):
        raise ctx.error(f"cannot reinterpret {have} as {want}: BitCast needs types of "
                        "the same bit width (and sampan reinterprets no sub-byte ones)")
    if have.kind in "iub" and want.kind in "iu" and not ctx.is_static(x):
        return _int_view(x, want, dst)
    a = ctx.static(x, "BitCast's input (sampan has no bit-view op for floats in data)")
    if src is not None:
        a = _em.to_declared(a, src)
    out = np.array(a, copy=True).view(want)     # (ascontiguousarray makes 0-d 1-d)
    return ctx.make_static(_em.to_carrier(out, dst) if dst is not None else out)


def _int_view(x, want, dst):
    """Integer bits read as another integer type of the same width: wrap into its range
    (64 bits: int64 and uint64's carrier share the bits already)."""
    w = want.itemsize * 8
    v = sampan.cast(x, np.int64) if x.dtype != _dt.int64 else x
    if w < 64:
        v = sampan.mod(v, 2**w) if want.kind == "u" else \
            sampan.mod(v + 2 ** (w - 1), 2**w) - 2 ** (w - 1)
    return sampan.cast(v, dst.carrier if dst is not None else want)


def _bits(dtype):
    f = _em.BY_STORAGE.get(np.dtype(dtype))
    if f is not None and f.name in ("INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1"):
        return 4 if "4" in f.name else 2
    return np.dtype(dtype).itemsize * 8
