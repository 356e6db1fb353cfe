"""The requantising int8 ops that `fuse_quant` emits (issue 31): one op per int8 layer,
whose kernel finishes the int32 sums itself, so activations stay int8 (or uint8) from one
quantised layer to the next.

    qlinear_dense(x, xs, xz, w, ws, wz, bias, ys, yz, qmin=, qmax=)    -> int8 / uint8
    qdense(x, xs, xz, w, ws, wz, bias)                                -> float32
    qlinear_conv2d(x, xs, xz, w, ws, wz, bias, ys, yz, stride=, padding=, dilation=,
                   groups=, qmin=, qmax=)                             -> int8 / uint8
    qlinear_conv2d_pool(<the same>)        -> the same, then a 2x2 stride-2 max-pool

`w` is the int8 weight, (N, K) for the dense ops (the layout `fuse_quant` stores: the
matmul weight transposed) and (O, C/groups, kh, kw) for the conv; `ws`/`wz` are 0-d or
one per output channel; `bias` is int32, one per output channel, at scale xs * ws (as
onnxruntime's QDQ bias). With acc the exact sum of (x - xz)(w - wz) over K:

    y = saturate(rint(float32(acc + bias) * m) + yz, qmin, qmax),  m = float32(xs * ws / ys)

in float32 and rounded half to even (onnxruntime's QLinearMatMul / QLinearConv); `qdense`
gives float32(acc + bias) * float32(xs * ws). A ReLU or clamp after the layer is folded
into [qmin, qmax] (default: the output type's range): rint is monotonic, so clamping the
float before quantising equals clamping the integer after. `_qref` is the exact numpy
reference; the op table's kernels (the numpy runtime's) are `_qfast`'s float BLAS GEMMs,
exact by a bound on the sums and equal to it bit for bit, their weights prepared once
when a served program binds the node (`bind`); the numba provider's (VNNI, weights packed
once) give the same bytes.
"""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, op_error
from . import _qfast, _qref
from ._util import Sample, rng
from .quant import (_F32, _Q, _cattrs, _conv_check, _conv_flops, _mm_check, _n, _nd,
                    _zp_check)
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, OPS as OPS_BY_NAME, Spec, defop


def multiplier(x_scale, w_scale, y_scale, n):
    """The float32 requantisation multiplier per output channel, xs * ws / ys (y_scale
    None: xs * ws), computed in float32 as onnxruntime does."""
    m = np.float32(x_scale) * np.broadcast_to(np.asarray(w_scale, np.float32).reshape(-1), (n,))
    if y_scale is not None:
        m = m / np.float32(y_scale)
    return np.ascontiguousarray(m, np.float32)


def bounds(y_zero_point, qmin, qmax):
    """[qmin, qmax] within the range of the output type."""
    lo, hi = _Q[np.dtype(y_zero_point.dtype)]
    return max(lo, lo if qmin is None else int(qmin)), min(hi, hi if qmax is None else int(qmax))


def _bias_check(op, bias, n):
    if bias.dtype != np.int32:
        raise op_error(DTypeError, op, f"bias of dtype {bias.dtype}",
                       "an int32 bias (at scale x_scale * w_scale)")
    if tuple(bias.shape) != (n,):
        raise op_error(ShapeError, op, f"bias of shape {tuple(bias.shape)}", f"({n},)")


def _y_check(op, ys, yz, qmin, qmax):
    _zp_check(op, "y", yz, None, ys)
    if yz.dtype not in _Q:
        raise op_error(DTypeError, op, f"y zero point of dtype {yz.dtype}",
                       "int8 or uint8 (the output dtype)")
    lo, hi = bounds(yz, qmin, qmax)
    if lo > hi:
        raise op_error(ShapeError, op, f"qmin={qmin}, qmax={qmax}",
                       f"qmin <= qmax within {_Q[yz.dtype]}")


def _dense_check(op, x, xs, xz, w, ws, wz, bias):
    n = _mm_check(op, x, w, True)
    if w.dtype != np.int8:
        raise op_error(DTypeError, op, f"weight of dtype {w.dtype}", "an int8 weight")
    _zp_check(op, "x", xz, None, xs)
    _zp_check(op, "w", wz, n, ws)
    _bias_check(op, bias, n)
    return n


def _qld_rule(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
              y_zero_point, qmin=None, qmax=None):
    n = _dense_check("qlinear_dense", x, x_scale, x_zero_point, w, w_scale, w_zero_point,
                     bias)
    _y_check("qlinear_dense", y_scale, y_zero_point, qmin, qmax)
    return Spec((x.shape[0], n), y_zero_point.dtype)


def _dense_layer(x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale=None,
                 y_zero_point=None, qmin=None, qmax=None):
    """(Weight, Epilogue) of a dense layer (`_qfast`): what `bind` prepares once."""
    n = w.shape[0]
    if y_zero_point is None:
        ep = _qfast.Epilogue(bias, multiplier(x_scale, w_scale, None, n), 0, 0, 0, np.float32)
    else:
        lo, hi = bounds(y_zero_point, qmin, qmax)
        ep = _qfast.Epilogue(bias, multiplier(x_scale, w_scale, y_scale, n),
                             int(y_zero_point), lo, hi, y_zero_point.dtype)
    return _qfast.Weight(w, w_zero_point), ep


def _dense_run(x, xz, w, wz, wt, ep):
    if not ep.finite:                          # the reference's arithmetic, as it is
        return _qfast.requant_ref(_qref.sums(x, w, xz, wz), ep, -1)
    return _qfast.dense(np.ascontiguousarray(x), xz, wt, ep)


def _qld_kernel(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
                y_zero_point, qmin=None, qmax=None):
    wt, ep = _dense_layer(x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
                          y_zero_point, qmin, qmax)
    return _dense_run(x, int(x_zero_point), w, w_zero_point, wt, ep)


def _qd_rule(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias):
    n = _dense_check("qdense", x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias)
    return Spec((x.shape[0], n), _F32)


def _qd_kernel(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias):
    wt, ep = _dense_layer(x_scale, x_zero_point, w, w_scale, w_zero_point, bias)
    return _dense_run(x, int(x_zero_point), w, w_zero_point, wt, ep)


def _qlc_rule(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
              y_zero_point, stride, padding, dilation, groups, qmin=None, qmax=None):
    op = "qlinear_conv2d"
    shape = _conv_check(op, x, w, stride, padding, dilation, groups)
    if w.dtype != np.int8:
        raise op_error(DTypeError, op, f"weight of dtype {w.dtype}", "an int8 weight")
    _zp_check(op, "x", x_zero_point, None, x_scale)
    _zp_check(op, "w", w_zero_point, w.shape[0], w_scale)
    _bias_check(op, bias, w.shape[0])
    _y_check(op, y_scale, y_zero_point, qmin, qmax)
    return Spec(shape, y_zero_point.dtype)


def _conv_layer(x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
                y_zero_point, groups, qmin=None, qmax=None):
    """(one Weight per group, Epilogue) of a conv layer (`_qfast`)."""
    lo, hi = bounds(y_zero_point, qmin, qmax)
    ep = _qfast.Epilogue(bias, multiplier(x_scale, w_scale, y_scale, w.shape[0]),
                         int(y_zero_point), lo, hi, y_zero_point.dtype)
    return _qfast.conv_weights(w, w_zero_point, groups), ep


def _conv_run(x, xz, w, wz, gw, ep, stride, padding, dilation, groups):
    y = None
    if ep.finite:
        y = _qfast.conv(x, xz, gw, ep, w.shape[2], w.shape[3], stride, padding, dilation)
    if y is None:                   # sums that float32 cannot hold exactly: the reference
        acc = _qref.conv_sums(x, w, xz, wz, stride, padding, dilation, groups)
        y = _qfast.requant_ref(acc, ep, 1)
    return y


def _qlc_kernel(x, x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
                y_zero_point, stride, padding, dilation, groups, qmin=None, qmax=None):
    gw, ep = _conv_layer(x_scale, x_zero_point, w, w_scale, w_zero_point, bias, y_scale,
                         y_zero_point, groups, qmin, qmax)
    return _conv_run(x, int(x_zero_point), w, w_zero_point, gw, ep, stride, padding,
                     dilation, groups)


def bind(node):
    """The numpy runtime's kernel of one node of these ops (`NumpyProvider.bind`): with
    every input but the activation a constant (a served program's), the float weight
    and the epilogue are prepared here, once; else the op's kernel per call."""
    op, attrs = node.op, dict(node.attrs)
    kern = OPS_BY_NAME[op].kernel
    rest = node.inputs[1:]
    if not all(v.is_const for v in rest):
        return lambda *arrays: kern(*arrays, **attrs)
    c = [v.const for v in rest]
    if op == "qdense_dynamic":
        wt = _qfast.Weight(c[0], 0)
        bias = c[2] if len(c) > 2 else None

        def run(x, *_):
            y = _qfast.dynamic(np.ascontiguousarray(x, np.float32), wt, c[1], row_qparams)
            return y if bias is None else with_bias(y, bias)
        return run
    xz = int(c[1])
    if op == "qlinear_conv2d":
        gw, ep = _conv_layer(*c, attrs["groups"], attrs.get("qmin"), attrs.get("qmax"))
        geo = (attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"])
        return lambda x, *_: _conv_run(x, xz, c[2], c[4], gw, ep, *geo)
    wt, ep = _dense_layer(*c, **attrs)
    return lambda x, *_: _dense_run(x, xz, c[2], c[4], wt, ep)


def _f(v):
    return np.asarray(v, np.float32)


def _dense_args(r, m, k, n, unsigned):
    x = r.integers(0, 256, (m, k)).astype(np.uint8) if unsigned else \
        r.integers(-128, 128, (m, k)).astype(np.int8)
    xz = np.array(131 if unsigned else -7, np.uint8 if unsigned else np.int8)
    w = r.integers(-127, 128, (n, k)).astype(np.int8)
    ws = r.uniform(0.002, 0.01, n).astype(np.float32)
    bias = r.integers(-3000, 3000, n).astype(np.int32)
    return x, _f(0.05), xz, w, ws, np.zeros(n, np.int8), bias


def _qld_samples():
    r = rng(331)
    a = _dense_args(r, 5, 37, 19, True)
    b = _dense_args(r, 1, 64, 16, False)
    return [Sample(a + (_f(0.4), np.array(120, np.uint8)), {}),
            Sample(a + (_f(0.3), np.array(100, np.uint8)), {"qmin": 100}),
            Sample(b + (_f(0.2), np.array(3, np.int8)), {"qmin": -20, "qmax": 90})]


def _qd_samples():
    r = rng(332)
    return [Sample(_dense_args(r, 6, 29, 11, True)), Sample(_dense_args(r, 1, 16, 3, False))]


def _qlc_samples():
    r = rng(333)
    x = r.integers(0, 256, (2, 4, 7, 6)).astype(np.uint8)
    w = r.integers(-127, 128, (6, 2, 3, 3)).astype(np.int8)
    ws = r.uniform(0.002, 0.01, 6).astype(np.float32)
    bias = r.integers(-500, 500, 6).astype(np.int32)
    args = (x, _f(0.05), np.array(128, np.uint8), w, ws, np.zeros(6, np.int8), bias,
            _f(0.3), np.array(110, np.uint8))
    w1 = r.integers(-127, 128, (5, 4, 5, 5)).astype(np.int8)
    args1 = (x, _f(0.05), np.array(128, np.uint8), w1, _f(0.004), np.array(0, np.int8),
             r.integers(-500, 500, 5).astype(np.int32), _f(0.5), np.array(3, np.int8))
    w3 = r.integers(-127, 128, (5, 4, 3, 3)).astype(np.int8)
    args3 = args1[:3] + (w3,) + args1[4:]
    return [Sample(args, dict(_cattrs(1, 1, 1, 2), qmin=110)),
            Sample(args1, _cattrs(2, 2, 1, 1)),
            Sample(args3, _cattrs((1, 2), (0, 1), (2, 1), 1))]


def _dense_flops(x, xs, xz, w, *rest, **attrs):
    n = w.shape[0]
    return 2 * _n(x) * (n if isinstance(n, int) else 1)


def _qlc_flops(x, xs, xz, w, *rest, stride, padding, dilation, groups, **attrs):
    return _conv_flops(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)


# ---------------------------------------------------------------------- dynamic
def _qdd_rule(x, w, w_scale, bias=None):
    op = "qdense_dynamic"
    if x.dtype != _F32:
        raise op_error(DTypeError, op, f"input of dtype {x.dtype}", "a float32 input")
    if w.dtype != np.int8 or _nd(w) != 2 or _nd(x) != 2:
        raise op_error(ShapeError, op, f"input {x.dtype}{tuple(x.shape)}, weight "
                       f"{w.dtype}{tuple(w.shape)}", "x (M, K) float32, w (N, K) int8")
    if x.shape[1] != w.shape[1]:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)}, weight {tuple(w.shape)}",
                       "matching K (the weight is (N, K))")
    if w_scale.dtype != _F32 or tuple(w_scale.shape) != (w.shape[0],):
        raise op_error(ShapeError, op, f"w_scale {w_scale.dtype}{tuple(w_scale.shape)}",
                       f"float32 ({w.shape[0]},)")
    if bias is not None and (bias.dtype != _F32 or tuple(bias.shape) != (w.shape[0],)):
        raise op_error(ShapeError, op, f"bias {bias.dtype}{tuple(bias.shape)}",
                       f"float32 ({w.shape[0]},) (one per output column)")
    return Spec((x.shape[0], w.shape[0]), _F32)


def row_qparams(x):
    """Per-row asymmetric uint8 parameters of x (M, K) float32, as onnxruntime's
    DynamicQuantizeLinear per row: the range [min(0, x), max(0, x)] over 255 steps
    (scale 1 for a row of zeros), zero point rint(-lo / scale); and the row quantised."""
    lo = np.minimum(x.min(1, initial=0.0), 0).astype(np.float32)
    hi = np.maximum(x.max(1, initial=0.0), 0).astype(np.float32)
    s = (hi - lo) / np.float32(255)
    s = np.where(s > 0, s, np.float32(1)).astype(np.float32)
    z = np.clip(np.rint(-lo / s), 0, 255).astype(np.int32)
    q = np.clip(np.rint(x / s[:, None]) + z[:, None], 0, 255).astype(np.uint8)
    return q, s, z


def _qdd_kernel(x, w, w_scale, bias=None):
    y = _qfast.dynamic(np.ascontiguousarray(x, np.float32), _qfast.Weight(w, 0), w_scale,
                       row_qparams)
    return y if bias is None else with_bias(y, bias)


def with_bias(y, bias):
    """qdense_dynamic's optional bias: y + bias in float32, after the scaling (the add
    it replaces in a graph, in place)."""
    y += bias[None, :]
    return y


def _qdd_samples():
    r = rng(334)
    x = r.standard_normal((7, 40)).astype(np.float32)
    x[3] = 0                                   # a row of zeros: scale 1
    w = r.integers(-127, 128, (21, 40)).astype(np.int8)
    return [Sample((x, w, r.uniform(0.001, 0.01, 21).astype(np.float32))),
            Sample((np.abs(x[:1, :16]), w[:16, :16], np.full(16, 0.01, np.float32))),
            Sample((x[:5], w, r.uniform(0.001, 0.01, 21).astype(np.float32),
                    r.standard_normal(21).astype(np.float32)))]


QDENSE_DYNAMIC = defop(
    "qdense_dynamic", _qdd_rule, kernel=_qdd_kernel, grad=NOT_DIFFERENTIABLE,
    flops=lambda x, w, s, *b: 2 * _n(x) * (w.shape[0] if isinstance(w.shape[0], int) else 1),
    onnx=NO_ONNX, samples=_qdd_samples,
    doc="dynamic int8 dense: per-row uint8 activations quantised in the kernel, int8 "
        "weights (N, K) with per-channel scales, float32 out (plus an optional float32 "
        "bias (N,), added after the scaling)")


QLINEAR_DENSE = defop(
    "qlinear_dense", _qld_rule, kernel=_qld_kernel, grad=NOT_DIFFERENTIABLE,
    flops=_dense_flops, onnx=NO_ONNX, samples=_qld_samples, keeps_float=False,
    doc="int8 dense layer requantised in its epilogue (bias, per-channel scale, clamp)")
QDENSE = defop(
    "qdense", _qd_rule, kernel=_qd_kernel, grad=NOT_DIFFERENTIABLE, flops=_dense_flops,
    onnx=NO_ONNX, samples=_qd_samples,
    doc="int8 dense layer with its int32 bias, dequantised to float32 in its epilogue")
# ---------------------------------------------------------------------- conv + pool
# qlinear_conv2d_pool: qlinear_conv2d and the 2x2 stride-2 max-pool (floor) that is its one
# reader, as `fuse_layers` writes it where the numba provider serves the conv (LeNet's two
# int8 blocks): the kernel pools each chunk of images while its requantised output is in
# cache, one call instead of two kernels and a full-size intermediate.
def pool_2x2(y):
    """numpy: the 2x2 stride-2 max-pool (floor) of y (N, C, H, W), any dtype."""
    n, c, h, w = y.shape
    h2, w2 = h // 2, w // 2
    t = y[:, :, :2 * h2, :2 * w2].reshape(n, c, h2, 2, w2, 2)
    return np.ascontiguousarray(t.max(axis=(3, 5)))


def _qlcp_rule(x, *args, **attrs):
    s = _qlc_rule(x, *args, **attrs)
    ho, wo = s.shape[2], s.shape[3]
    if any(isinstance(d, int) and d < 2 for d in (ho, wo)):
        raise op_error(ShapeError, "qlinear_conv2d_pool", f"a convolution output of {ho}x{wo}",
                       "at least 2x2 under the 2x2 max-pool")
    half = tuple(d // 2 if isinstance(d, int) else d for d in (ho, wo))
    return Spec(tuple(s.shape[:2]) + half, s.dtype)


def _qlcp_kernel(*args, **attrs):
    return pool_2x2(_qlc_kernel(*args, **attrs))


def _qlcp_samples():
    r = rng(335)
    out = list(_qlc_samples())            # odd sizes (floor), groups 2, strides, dilation
    x = r.integers(0, 256, (3, 1, 28, 28)).astype(np.uint8)
    w = r.integers(-127, 128, (6, 1, 5, 5)).astype(np.int8)
    args = (x, _f(0.02), np.array(125, np.uint8), w, r.uniform(0.002, 0.01, 6).astype(
        np.float32), np.zeros(6, np.int8), r.integers(-900, 900, 6).astype(np.int32),
        _f(0.05), np.array(0, np.uint8))
    out.append(Sample(args, _cattrs(1, 2, 1, 1)))
    return out


QLINEAR_CONV2D_POOL = defop(
    "qlinear_conv2d_pool", _qlcp_rule, kernel=_qlcp_kernel, grad=NOT_DIFFERENTIABLE,
    flops=_qlc_flops, onnx=NO_ONNX, samples=_qlcp_samples, keeps_float=False,
    doc="qlinear_conv2d and its 2x2 stride-2 max-pool in one kernel (written by the "
        "fuse_layers pass where numba serves the conv)")
QLINEAR_CONV2D = defop(
    "qlinear_conv2d", _qlc_rule, kernel=_qlc_kernel, grad=NOT_DIFFERENTIABLE,
    flops=_qlc_flops, onnx=NO_ONNX, samples=_qlc_samples, keeps_float=False,
    doc="int8 conv2d requantised in its epilogue (bias, per-channel scale, clamp)")
