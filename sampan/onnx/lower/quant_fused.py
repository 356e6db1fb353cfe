"""The requantising int8 layers of `ops/quant_fused.py` as ONNX, so that an int8 program
runs int8 in onnxruntime (`Config(runtime="onnxruntime")`) with the reference's numbers:

- `qlinear_dense` / `qdense`: MatMulInteger (the weight transposed to (K, N)) gives the
  exact int32 sums; the int32 bias is added in int32, the sum cast to float32 (one
  rounding, as the reference's int64 -> float32) and multiplied by the float32 multiplier
  xs * ws / ys (computed as `quant_fused.multiplier` does: a constant when the scales are);
  `qlinear_dense` then rounds half to even (Round), adds the zero point, clamps to
  [qmin, qmax] and casts. Every step is the reference's float32 operation, so the bytes are
  its bytes.
- `qlinear_conv2d`: with constant scales, zero weight zero points (what `sampan.quant`
  writes) and x and y of one type, QLinearConv, which requantises as the reference does
  (float32 xs * ws / ys, the int32 bias in the sums, round half to even; the tests check
  the bytes), then a Clip for a folded ReLU/clamp; otherwise ConvInteger for the int32
  sums (per-channel weight zero points taken off with the window sums, which
  onnxruntime's ConvInteger does not take) and the dense layers' finish along axis 1.
- `qdense_dynamic`: the per-row parameters of `quant_fused.row_qparams` (ReduceMin/Max over
  the row with 0, (hi - lo) / 255, 1 for an empty range, rint(-lo / s)), the row quantised
  to uint8, MatMulInteger, minus z * the weight's row sums, times s and w_scale (plus
  the optional bias).

The int32 sums are exact where onnxruntime's integer GEMM is (on x86 without VNNI its
u8 x s8 kernels add pairs of products in int16, which saturates for large weights and
activations together: onnxruntime's own int8 models share that limit).
"""
from __future__ import annotations

import numpy as np

from ._register import register_lowering
from .quant import _conv_attrs, _no_double
from .reduce import reduce

_RANGE = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


def _value(ctx, name):
    """The array of an initializer, or None for a computed value."""
    a = ctx.inits.get(name)
    return None if a is None else np.asarray(a)


def _f32(ctx, name):
    return name if ctx.spec(name).dtype == np.float32 else ctx.cast(name, np.float32)


def _multiplier(ctx, xs, ws, ys, n, axis_shape):
    """float32 (xs * ws) / ys (ys None: xs * ws), shaped `axis_shape` to broadcast."""
    from ...ops.quant_fused import multiplier
    vals = [_value(ctx, v) for v in (xs, ws, ys) if v is not None]
    if all(v is not None for v in vals):
        m = multiplier(vals[0], vals[1], vals[2] if ys is not None else None, n)
        return ctx.const(m.reshape(axis_shape), "mult")
    m = ctx.emit("Mul", [_f32(ctx, xs), _f32(ctx, ws)])
    if ys is not None:
        m = ctx.emit("Div", [m, _f32(ctx, ys)])
    return ctx.emit("Reshape", [m, ctx.ints([-1, 1, 1])]) if len(axis_shape) > 1 else m


def _zero_or_none(ctx, name):
    """None (an omitted input) for a constant all-zero zero point."""
    v = _value(ctx, name)
    return None if v is not None and not np.any(v) else name


def _finish(ctx, acc, bias, mult, yz, qmin, qmax, axis_shape):
    """float32(acc + bias) * mult, then (yz given) rounded, shifted, clamped and cast."""
    b = _value(ctx, bias)
    if b is not None:
        b = ctx.const(b.reshape(axis_shape), "bias")
    else:
        b = bias if len(axis_shape) == 1 else ctx.emit("Reshape", [bias, ctx.ints([-1, 1, 1])])
    v = ctx.emit("Mul", [ctx.cast(ctx.emit("Add", [acc, b]), np.float32), mult])
    if yz is None:
        return v
    dt = np.dtype(ctx.spec(yz).dtype)
    lo, hi = _RANGE[dt]
    lo = lo if qmin is None else max(lo, int(qmin))
    hi = hi if qmax is None else min(hi, int(qmax))
    v = ctx.emit("Round", [v])
    z = _value(ctx, yz)
    if z is None:
        v = ctx.emit("Add", [v, ctx.cast(yz, np.float32)])
    elif int(z):
        v = ctx.emit("Add", [v, ctx.const(np.asarray(int(z), np.float32))])
    v = ctx.emit("Clip", [v, ctx.const(np.asarray(lo, np.float32)),
                          ctx.const(np.asarray(hi, np.float32))])
    return ctx.cast(v, dt)


def _transposed(ctx, w):
    v = _value(ctx, w)
    if v is not None:
        return ctx.const(np.ascontiguousarray(v.T), "wt")
    return ctx.emit("Transpose", [w], perm=[1, 0])


def _dense(ctx, x, xs, xz, w, ws, wz, bias, ys=None, yz=None, qmin=None, qmax=None):
    _no_double(ctx, xs, ws, ys)
    n = ctx.spec(w).shape[0]
    acc = ctx.emit("MatMulInteger", [x, _transposed(ctx, w), _zero_or_none(ctx, xz),
                                     _zero_or_none(ctx, wz)])
    return _finish(ctx, acc, bias, _multiplier(ctx, xs, ws, ys, n, [n]), yz, qmin, qmax,
                   [n])


@register_lowering("qlinear_dense")
def _qlinear_dense(ctx, x, xs, xz, w, ws, wz, bias, ys, yz, *, qmin=None, qmax=None):
    return _dense(ctx, x, xs, xz, w, ws, wz, bias, ys, yz, qmin, qmax)


@register_lowering("qdense")
def _qdense(ctx, x, xs, xz, w, ws, wz, bias):
    return _dense(ctx, x, xs, xz, w, ws, wz, bias)


@register_lowering("qlinear_conv2d")
def _qlinear_conv2d(ctx, x, xs, xz, w, ws, wz, bias, ys, yz, *, stride, padding, dilation,
                    groups, qmin=None, qmax=None):
    _no_double(ctx, xs, ws, ys)
    o = ctx.spec(w).shape[0]
    shape = [o, 1, 1]
    wzv = _value(ctx, wz)
    same = ctx.spec(x).dtype == ctx.spec(yz).dtype   # onnxruntime's QLinearConv types
    if same and wzv is not None and not np.any(wzv) and all(
            _value(ctx, v) is not None for v in (xs, ws, ys, yz)):
        return _qlinear_conv(ctx, x, xs, xz, w, ws, wz, bias, ys, yz, qmin, qmax,
                             _conv_attrs(ctx, w, stride, padding, dilation, groups))
    attrs = _conv_attrs(ctx, w, stride, padding, dilation, groups)
    xz = _zero_or_none(ctx, xz)
    acc = ctx.emit("ConvInteger", [x, w, xz], **attrs)
    if _zero_or_none(ctx, wz) is not None:
        acc = _less_weight_zero(ctx, acc, x, xz, w, wz, groups, attrs)
    return _finish(ctx, acc, bias, _multiplier(ctx, xs, ws, ys, o, shape), yz, qmin, qmax,
                   shape)


def _less_weight_zero(ctx, acc, x, xz, w, wz, groups, attrs):
    """acc - wz[o] * (the window sums of x - xz): onnxruntime's ConvInteger takes no
    per-channel weight zero point; the window sums are a ConvInteger by ones per group."""
    o, cg, kh, kw = ctx.spec(w).shape
    ones = ctx.const(np.ones((groups, cg, kh, kw), np.int8), "ones")
    win = ctx.emit("ConvInteger", [x, ones, xz], **dict(attrs, kernel_shape=[kh, kw]))
    if groups > 1:
        win = ctx.emit("Gather", [win, ctx.const(np.arange(o, dtype=np.int64) // (o // groups),
                                                 "group_of")], axis=1)
    z = ctx.emit("Reshape", [ctx.cast(wz, np.int32), ctx.ints([-1, 1, 1])])
    return ctx.emit("Sub", [acc, ctx.emit("Mul", [z, win])])


def _qlinear_conv(ctx, x, xs, xz, w, ws, wz, bias, ys, yz, qmin, qmax, attrs):
    """QLinearConv, its bias inside, then a Clip for a [qmin, qmax] narrower than the type."""
    y = ctx.emit("QLinearConv", [x, xs, xz, w, ws, wz, ys, yz, bias], **attrs)
    dt = np.dtype(ctx.spec(yz).dtype)
    lo, hi = _RANGE[dt]
    qlo = lo if qmin is None else max(lo, int(qmin))
    qhi = hi if qmax is None else min(hi, int(qmax))
    if (qlo, qhi) == (lo, hi):
        return y
    return ctx.emit("Clip", [y, ctx.const(np.asarray(qlo, dt)), ctx.const(np.asarray(qhi, dt))])


@register_lowering("qdense_dynamic")
def _qdense_dynamic(ctx, x, w, w_scale, bias=None):
    zero = ctx.const(np.asarray(0, np.float32))
    lo = ctx.emit("Min", [reduce(ctx, "ReduceMin", x, [1], True), zero])
    hi = ctx.emit("Max", [reduce(ctx, "ReduceMax", x, [1], True), zero])
    s = ctx.emit("Div", [ctx.emit("Sub", [hi, lo]), ctx.const(np.asarray(255, np.float32))])
    s = ctx.emit("Where", [ctx.emit("Greater", [s, zero]), s,
                           ctx.const(np.asarray(1, np.float32))])
    c0, c255 = zero, ctx.const(np.asarray(255, np.float32))
    z = ctx.emit("Clip", [ctx.emit("Round", [ctx.emit("Div", [ctx.emit("Neg", [lo]), s])]),
                          c0, c255])
    q = ctx.emit("Clip", [ctx.emit("Add", [ctx.emit("Round", [ctx.emit("Div", [x, s])]), z]),
                          c0, c255])
    acc = ctx.emit("MatMulInteger", [ctx.cast(q, np.uint8), _transposed(ctx, w)])
    wv = _value(ctx, w)
    if wv is not None:
        rows = ctx.const(wv.astype(np.int32).sum(1, dtype=np.int32).reshape(1, -1), "wsum")
    else:
        rows = ctx.emit("Unsqueeze", [reduce(ctx, "ReduceSum", ctx.cast(w, np.int32), [1],
                                             False), ctx.ints([0])])
    acc = ctx.emit("Sub", [acc, ctx.emit("Mul", [ctx.cast(z, np.int32), rows])])
    y = ctx.emit("Mul", [ctx.emit("Mul", [ctx.cast(acc, np.float32), s]), w_scale])
    return y if bias is None else ctx.emit("Add", [y, bias])
