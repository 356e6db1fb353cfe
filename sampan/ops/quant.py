"""Quantisation ops: quantize / dequantize (ONNX QuantizeLinear / DequantizeLinear),
fake_quant (quantise-dequantise in float with a straight-through gradient, as PyTorch's
fake_quantize_*_affine), and the int8 matmul and conv2d that accumulate in int32.

Conventions (ONNX's and PyTorch's): q = saturate(round_half_even(x / scale) + zero_point),
x' = (q - zero_point) * scale. `scale` and `zero_point` are inputs: 0-d for per-tensor, 1-d
along `axis` of the tensor for per-channel. The output dtype of quantize is the zero
point's (int8 or uint8). A NaN quantises to the zero point (ONNX leaves it undefined).

The int8 GEMM ops take weights as the ONNX ops do, (K, N) for matmul and (O, C/g, kh, kw)
for conv; `qmatmul` may take its weight transposed, (N, K) (`transposed=True`, what
`fuse_quant` stores: each output is then a dot of two contiguous rows). The op table's
kernels are the exact numpy reference (`_qref`); the numba provider serves the same ops
faster (`backends/numba/qkernels.py`, the same `int8_kernels` over its own GEMM).

    qmatmul(a, b, sa, za, sb, zb)   -> float32  sa * sb[j] * sum (a - za)(b - zb)
    qlinear_matmul(...8 inputs)     -> int8     requantised with (sy, zy)   QLinearMatMul
    matmul_integer(a, b, za, zb)    -> int32                                MatMulInteger
    qconv2d / qlinear_conv / conv_integer: the same over conv2d's windows
"""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, op_error
from . import _qref
from ._util import Sample, randf, rng
from .conv import _check_attrs, _out_dim
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, Spec, defop

_Q = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}
_F32 = np.dtype(np.float32)


def _nd(v):
    return len(v.shape)


def _isf(d):
    return d.kind == "f"


def _qparams(op, x, scale, zp, axis, zp_kinds="iu"):
    """Check scale/zero point against x: 0-d, or 1-d of length x.shape[axis]."""
    if not _isf(scale.dtype):
        raise op_error(DTypeError, op, f"scale of dtype {scale.dtype}", "a float scale")
    if zp.dtype.kind not in zp_kinds or zp.dtype.itemsize > 4:
        raise op_error(DTypeError, op, f"zero_point of dtype {zp.dtype}",
                       "an int8/uint8 (or int32) zero point")
    if tuple(scale.shape) != tuple(zp.shape) or _nd(scale) > 1:
        raise op_error(ShapeError, op, f"scale {tuple(scale.shape)}, zero_point "
                       f"{tuple(zp.shape)}", "both 0-d (per tensor) or both 1-d (per channel)")
    if _nd(scale) == 1:
        if not -max(_nd(x), 1) <= axis < max(_nd(x), 1) or _nd(x) == 0:
            raise op_error(ShapeError, op, f"axis={axis} for a {_nd(x)}-d input",
                           "an axis of the input")
        c = x.shape[axis % _nd(x)]
        if isinstance(c, int) and scale.shape[0] != c:
            raise op_error(ShapeError, op, f"{scale.shape[0]} scales for input "
                           f"{tuple(x.shape)} along axis {axis}",
                           f"one scale per channel ({c})")


def _chan(v, x, axis):
    """A per-channel vector shaped to broadcast against x along axis (or 0-d as is)."""
    v = np.asarray(v)
    if v.ndim == 0:
        return v
    shape = [1] * _nd(x)
    shape[axis % _nd(x)] = v.shape[0]
    return v.reshape(shape)


# ---------------------------------------------------------------------- kernels
def int8_kernels(K) -> dict:
    """{op name: kernel} of the int8 ops over kernel set `K` (a module with `quantize`,
    `gemm` and the modes I32 / F32 / Q8): the op table's are over the numpy reference
    (`_qref`), the numba provider's over its own (`backends/numba/qkernels.py`), so the
    ops' conventions (scales, zero points, windows) are written once."""
    gemm = K.gemm

    def q_kernel(x, scale, zero_point, axis=1):
        lo, hi = _Q[zero_point.dtype]
        ax = axis % _nd(x) if _nd(x) else 0
        return K.quantize(x, scale, zero_point, ax, lo, hi, zero_point.dtype)

    def mmi_kernel(a, b, a_zero_point, b_zero_point):
        return gemm(a, np.ascontiguousarray(b.T), int(a_zero_point), b_zero_point)

    def qmm_kernel(a, b, a_scale, a_zero_point, b_scale, b_zero_point, transposed=False):
        bt = b if transposed else np.ascontiguousarray(b.T)
        mult = np.float64(a_scale) * np.asarray(b_scale, np.float64)
        return gemm(a, bt, int(a_zero_point), b_zero_point, mult, mode=K.F32)

    def qlmm_kernel(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                    y_zero_point):
        lo, hi = _Q[y_zero_point.dtype]
        mult = np.float64(a_scale) * np.asarray(b_scale, np.float64) / np.float64(y_scale)
        return gemm(a, np.ascontiguousarray(b.T), int(a_zero_point), b_zero_point, mult,
                    int(y_zero_point), lo, hi, K.Q8, y_zero_point.dtype)

    def conv(x, w, xz, wz, stride, padding, dilation, groups, mult, yz, lo, hi, mode, dt):
        o, cg, kh, kw = w.shape
        v = _qref.conv_windows(x, kh, kw, stride, padding, dilation, xz)
        n, _, ho, wo = v.shape[:4]
        og = o // groups
        wz = np.broadcast_to(np.asarray(wz).reshape(-1), (o,))
        mult = np.broadcast_to(np.asarray(mult, np.float64).reshape(-1), (o,))
        outs = []
        for gi in range(groups):
            rows = v[:, gi * cg:(gi + 1) * cg].transpose(0, 2, 3, 1, 4, 5).reshape(
                n * ho * wo, cg * kh * kw)
            sl = slice(gi * og, (gi + 1) * og)
            outs.append(gemm(rows, w[sl].reshape(og, -1), int(xz), wz[sl], mult[sl], yz, lo,
                             hi, mode, dt))
        y = outs[0] if groups == 1 else np.concatenate(outs, axis=1)
        return np.ascontiguousarray(y.reshape(n, ho, wo, o).transpose(0, 3, 1, 2))

    def ci_kernel(x, w, x_zero_point, w_zero_point, stride, padding, dilation, groups):
        return conv(x, w, x_zero_point, w_zero_point, stride, padding, dilation, groups, 1.0,
                    0, 0, 0, K.I32, np.int8)

    def qc_kernel(x, w, x_scale, x_zero_point, w_scale, w_zero_point, stride, padding,
                  dilation, groups):
        mult = np.float64(x_scale) * np.asarray(w_scale, np.float64)
        return conv(x, w, x_zero_point, w_zero_point, stride, padding, dilation, groups,
                    mult, 0, 0, 0, K.F32, np.int8)

    def qlc_kernel(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                   y_zero_point, stride, padding, dilation, groups):
        lo, hi = _Q[y_zero_point.dtype]
        mult = np.float64(x_scale) * np.asarray(w_scale, np.float64) / np.float64(y_scale)
        return conv(x, w, x_zero_point, w_zero_point, stride, padding, dilation, groups,
                    mult, int(y_zero_point), lo, hi, K.Q8, y_zero_point.dtype)

    return {"quantize": q_kernel, "matmul_integer": mmi_kernel, "qmatmul": qmm_kernel,
            "qlinear_matmul": qlmm_kernel, "conv_integer": ci_kernel, "qconv2d": qc_kernel,
            "qlinear_conv": qlc_kernel}


_REF = int8_kernels(_qref)


# ---------------------------------------------------------------------- quantize
def _q_rule(x, scale, zero_point, axis=1):
    if not _isf(x.dtype):
        raise op_error(DTypeError, "quantize", f"input of dtype {x.dtype}", "a float input")
    if zero_point.dtype not in _Q:
        raise op_error(DTypeError, "quantize", f"zero_point of dtype {zero_point.dtype}",
                       "int8 or uint8 (the output dtype)")
    _qparams("quantize", x, scale, zero_point, axis)
    return Spec(tuple(x.shape), zero_point.dtype)


def _q_samples():
    r = rng(300)
    x = randf(r, 3, 4, 5, low=-3, high=3)
    return [Sample((x, np.array(0.05, np.float32), np.array(3, np.int8)), {}),
            Sample((x, np.array(0.02, np.float32), np.array(128, np.uint8)), {}),
            Sample((x, r.uniform(0.01, 0.03, 4).astype(np.float32), np.zeros(4, np.int8)),
                   {"axis": 1}),
            Sample((randf(r, 5, 3), r.uniform(0.01, 0.03, 3).astype(np.float32),
                    np.array([0, 5, -4], np.int8)), {"axis": -1})]


QUANTIZE = defop("quantize", _q_rule, kernel=_REF["quantize"], grad=NOT_DIFFERENTIABLE,
                 flops=lambda x, *a, **k: 2 * _n(x), onnx="QuantizeLinear",
                 samples=_q_samples, keeps_float=False,
                 doc="saturate(round_half_even(x / scale) + zero_point) to int8/uint8")


def _n(s):
    n = 1
    for d in s.shape:
        n *= d if isinstance(d, int) else 1
    return n


# ---------------------------------------------------------------------- dequantize
def _dq_rule(q, scale, zero_point, axis=1):
    if q.dtype not in _Q and q.dtype != np.int32:
        raise op_error(DTypeError, "dequantize", f"input of dtype {q.dtype}",
                       "int8, uint8 or int32")
    _qparams("dequantize", q, scale, zero_point, axis)
    return Spec(tuple(q.shape), scale.dtype)


def _dq_kernel(q, scale, zero_point, axis=1):
    z = _chan(zero_point, q, axis).astype(np.int32)
    s = _chan(scale, q, axis)
    return ((q.astype(np.int32) - z).astype(scale.dtype) * s).astype(scale.dtype)


def _dq_samples():
    r = rng(301)
    q = r.integers(-128, 128, (3, 4, 5)).astype(np.int8)
    return [Sample((q, np.array(0.05, np.float32), np.array(3, np.int8)), {}),
            Sample((q.view(np.uint8), np.array(0.02, np.float32), np.array(128, np.uint8)), {}),
            Sample((q, r.uniform(0.01, 0.03, 4).astype(np.float32), np.zeros(4, np.int8)),
                   {"axis": 1})]


DEQUANTIZE = defop("dequantize", _dq_rule, kernel=_dq_kernel, grad=NOT_DIFFERENTIABLE,
                   flops=lambda q, *a, **k: 2 * _n(q), onnx="DequantizeLinear",
                   samples=_dq_samples, doc="(q - zero_point) * scale")


# ---------------------------------------------------------------------- fake_quant
def _fq_rule(x, scale, zero_point, quant_min=-128, quant_max=127, axis=1):
    if not _isf(x.dtype):
        raise op_error(DTypeError, "fake_quant", f"input of dtype {x.dtype}", "a float input")
    _qparams("fake_quant", x, scale, zero_point, axis, zp_kinds="i")
    if not quant_min < quant_max:
        raise op_error(ShapeError, "fake_quant", f"quant_min={quant_min}, quant_max={quant_max}",
                       "quant_min < quant_max")
    return Spec(tuple(x.shape), x.dtype)


def _fq_q(x, scale, zero_point, quant_min, quant_max, axis):
    s = _chan(scale, x, axis).astype(x.dtype)
    z = _chan(zero_point, x, axis).astype(x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.rint(x * (1 / s)) + z, s, z      # x * (1 / scale) as PyTorch's kernel


def _fq_kernel(x, scale, zero_point, quant_min=-128, quant_max=127, axis=1):
    q, s, z = _fq_q(x, scale, zero_point, quant_min, quant_max, axis)
    return ((np.clip(q, quant_min, quant_max) - z) * s).astype(x.dtype)


def _mask_kernel(x, scale, zero_point, quant_min=-128, quant_max=127, axis=1):
    q = _fq_q(x, scale, zero_point, quant_min, quant_max, axis)[0]
    return ((q >= quant_min) & (q <= quant_max)).astype(x.dtype)


def _fq_grad(g, y, x, scale, zero_point, quant_min=-128, quant_max=127, axis=1):
    """Straight-through: the gradient passes where x quantises inside [qmin, qmax]."""
    from ..tensor import apply
    from .elementwise import mul
    m = apply(FAKE_QUANT_MASK, (x, scale, zero_point),
              {"quant_min": quant_min, "quant_max": quant_max, "axis": axis})
    return mul(g, m), None, None


def _fq_samples():
    r = rng(302)
    x = randf(r, 3, 4, 5, low=-4, high=4)
    return [Sample((x, np.array(0.03, np.float32), np.array(0, np.int32)), {}, diff=()),
            Sample((x, np.array(0.02, np.float32), np.array(5, np.int32)),
                   {"quant_min": 0, "quant_max": 255}, diff=()),
            Sample((x, r.uniform(0.01, 0.04, 4).astype(np.float32), np.zeros(4, np.int32)),
                   {"axis": 1}, diff=())]


FAKE_QUANT_MASK = defop(
    "fake_quant_mask", _fq_rule, kernel=_mask_kernel, grad=NOT_DIFFERENTIABLE,
    flops=lambda x, *a, **k: 3 * _n(x), onnx=NO_ONNX, samples=_fq_samples,
    doc="1 where x quantises inside [quant_min, quant_max], else 0 (fake_quant's gradient)")

FAKE_QUANT = defop(
    "fake_quant", _fq_rule, kernel=_fq_kernel, grad=_fq_grad, nondiff_inputs=(1, 2),
    flops=lambda x, *a, **k: 4 * _n(x), onnx=NO_ONNX, samples=_fq_samples, saves=(0, 1, 2),
    doc="quantise-dequantise in float; straight-through gradient (exported as Q + DQ)")


# ---------------------------------------------------------------------- int8 matmul
def _mm_check(op, a, b, transposed):
    if a.dtype not in _Q or b.dtype not in _Q:
        raise op_error(DTypeError, op, f"inputs of dtypes {a.dtype}, {b.dtype}",
                       "int8 or uint8 inputs")
    if _nd(a) != 2 or _nd(b) != 2:
        raise op_error(ShapeError, op, f"inputs {tuple(a.shape)}, {tuple(b.shape)}",
                       "2-d inputs (M, K) and (K, N)" + (", (N, K) transposed"
                                                         if transposed else ""))
    k, n = (b.shape[1], b.shape[0]) if transposed else b.shape
    if a.shape[1] != k:
        raise op_error(ShapeError, op, f"inputs {tuple(a.shape)}, {tuple(b.shape)}"
                       + (" (b transposed)" if transposed else ""), "matching inner dims")
    return n


def _zp_check(op, what, zp, n=None, scale=None):
    if zp.dtype.kind not in "iu" or zp.dtype.itemsize > 4:
        raise op_error(DTypeError, op, f"{what} zero point of dtype {zp.dtype}",
                       "an integer zero point")
    if _nd(zp) > 1 or (_nd(zp) == 1 and (n is None or zp.shape[0] != n)):
        raise op_error(ShapeError, op, f"{what} zero point of shape {tuple(zp.shape)}",
                       "0-d" + (f" or ({n},)" if n is not None else ""))
    if scale is not None:
        if not _isf(scale.dtype):
            raise op_error(DTypeError, op, f"{what} scale of dtype {scale.dtype}", "float")
        if _nd(scale) > 1 or (_nd(scale) == 1 and (n is None or scale.shape[0] != n)):
            raise op_error(ShapeError, op, f"{what} scale of shape {tuple(scale.shape)}",
                           "0-d" + (f" or ({n},)" if n is not None else ""))


def _mmi_rule(a, b, a_zero_point, b_zero_point):
    n = _mm_check("matmul_integer", a, b, False)
    _zp_check("matmul_integer", "a", a_zero_point)
    _zp_check("matmul_integer", "b", b_zero_point, n)
    return Spec((a.shape[0], n), np.dtype(np.int32))


def _qmm_rule(a, b, a_scale, a_zero_point, b_scale, b_zero_point, transposed=False):
    op = "qmatmul"
    n = _mm_check(op, a, b, transposed)
    _zp_check(op, "a", a_zero_point, None, a_scale)
    _zp_check(op, "b", b_zero_point, n, b_scale)
    return Spec((a.shape[0], n), _F32)


def _qlmm_rule(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    op = "qlinear_matmul"
    n = _mm_check(op, a, b, False)
    _zp_check(op, "a", a_zero_point, None, a_scale)
    _zp_check(op, "b", b_zero_point, n, b_scale)
    _zp_check(op, "y", y_zero_point, None, y_scale)
    if y_zero_point.dtype not in _Q:
        raise op_error(DTypeError, op, f"y zero point of dtype {y_zero_point.dtype}",
                       "int8 or uint8 (the output dtype)")
    return Spec((a.shape[0], n), y_zero_point.dtype)


def _mm_data(r, m=5, k=7, n=4):
    a = r.integers(-128, 128, (m, k)).astype(np.int8)
    b = r.integers(-127, 128, (k, n)).astype(np.int8)
    return a, b


def _f(x):
    return np.asarray(x, np.float32)


def _mmi_samples():
    r = rng(303)
    a, b = _mm_data(r)
    return [Sample((a, b, np.array(3, np.int8), np.array(0, np.int8))),
            Sample((a.view(np.uint8), b, np.array(128, np.uint8),
                    np.array([1, -2, 0, 4], np.int8)))]


def _qmm_samples():
    r = rng(304)
    a, b = _mm_data(r)
    sb = r.uniform(0.001, 0.01, 4).astype(np.float32)
    return [Sample((a, b, _f(0.05), np.array(-3, np.int8), sb, np.zeros(4, np.int8))),
            Sample((a, np.ascontiguousarray(b.T), _f(0.02), np.array(0, np.int8), _f(0.004),
                    np.array(0, np.int8)), {"transposed": True})]


def _qlmm_samples():
    r = rng(305)
    a, b = _mm_data(r, 6, 9, 3)
    sb = r.uniform(0.002, 0.01, 3).astype(np.float32)
    return [Sample((a, _f(0.05), np.array(2, np.int8), b, sb, np.zeros(3, np.int8), _f(0.3),
                    np.array(-5, np.int8))),
            Sample((a.view(np.uint8), _f(0.05), np.array(128, np.uint8), b, _f(0.004),
                    np.array(0, np.int8), _f(0.2), np.array(10, np.uint8)))]


def _mm_flops(a, b, *rest, **attrs):
    n = b.shape[0] if attrs.get("transposed") else b.shape[1]
    return 2 * _n(a) * (n if isinstance(n, int) else 1)


MATMUL_INTEGER = defop("matmul_integer", _mmi_rule, kernel=_REF["matmul_integer"],
                       grad=NOT_DIFFERENTIABLE, flops=_mm_flops, onnx="MatMulInteger",
                       samples=_mmi_samples, keeps_float=False,
                       doc="int8 x int8 -> int32: sum (a - za)(b - zb)")
QMATMUL = defop("qmatmul", _qmm_rule, kernel=_REF["qmatmul"], grad=NOT_DIFFERENTIABLE,
                flops=_mm_flops, onnx=NO_ONNX, samples=_qmm_samples,
                doc="int8 GEMM (int32 accumulate) dequantised to float32 with sa * sb; "
                    "exported as MatMulInteger + Mul")
QLINEAR_MATMUL = defop("qlinear_matmul", _qlmm_rule, kernel=_REF["qlinear_matmul"],
                       grad=NOT_DIFFERENTIABLE, flops=lambda a, s, z, b, *r: 2 * _n(a) *
                       (b.shape[1] if isinstance(b.shape[1], int) else 1),
                       onnx="QLinearMatMul", samples=_qlmm_samples, keeps_float=False,
                       doc="int8 GEMM requantised to int8/uint8 with (y_scale, y_zero_point)")


# ---------------------------------------------------------------------- int8 conv2d
def _conv_check(op, x, w, stride, padding, dilation, groups):
    if x.dtype not in _Q or w.dtype not in _Q:
        raise op_error(DTypeError, op, f"inputs of dtypes {x.dtype}, {w.dtype}",
                       "int8 or uint8 inputs")
    if _nd(x) != 4 or _nd(w) != 4:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)}, weight {tuple(w.shape)}",
                       "4-d input (N, C, H, W) and weight (O, C/groups, kh, kw)")
    _check_attrs(op, stride, padding, dilation, groups)
    o, cg, kh, kw = w.shape
    if x.shape[1] != cg * groups or o % groups:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)}, weight {tuple(w.shape)}, "
                       f"groups={groups}", "input channels == weight.shape[1] * groups")
    hw = tuple(_out_dim(n, k, s, p, d) for n, k, s, p, d in
               zip(x.shape[2:], (kh, kw), stride, padding, dilation))
    if any(isinstance(d, int) and d < 1 for d in hw):
        raise op_error(ShapeError, op, f"input {tuple(x.shape)} with kernel {(kh, kw)}",
                       "an input at least as large as the (dilated) kernel after padding")
    return (x.shape[0], o) + hw


def _ci_rule(x, w, x_zero_point, w_zero_point, stride, padding, dilation, groups):
    shape = _conv_check("conv_integer", x, w, stride, padding, dilation, groups)
    _zp_check("conv_integer", "x", x_zero_point)
    _zp_check("conv_integer", "w", w_zero_point, w.shape[0])
    return Spec(shape, np.dtype(np.int32))


def _qc_rule(x, w, x_scale, x_zero_point, w_scale, w_zero_point, stride, padding, dilation,
             groups):
    shape = _conv_check("qconv2d", x, w, stride, padding, dilation, groups)
    _zp_check("qconv2d", "x", x_zero_point, None, x_scale)
    _zp_check("qconv2d", "w", w_zero_point, w.shape[0], w_scale)
    return Spec(shape, _F32)


def _qlc_rule(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
              stride, padding, dilation, groups):
    op = "qlinear_conv"
    shape = _conv_check(op, x, w, stride, padding, dilation, groups)
    _zp_check(op, "x", x_zero_point, None, x_scale)
    _zp_check(op, "w", w_zero_point, w.shape[0], w_scale)
    _zp_check(op, "y", y_zero_point, None, y_scale)
    if y_zero_point.dtype not in _Q:
        raise op_error(DTypeError, op, f"y zero point of dtype {y_zero_point.dtype}",
                       "int8 or uint8 (the output dtype)")
    return Spec(shape, y_zero_point.dtype)


def _cattrs(stride=1, padding=0, dilation=1, groups=1):
    def p(v):
        return (v, v) if isinstance(v, int) else tuple(v)
    return {"stride": p(stride), "padding": p(padding), "dilation": p(dilation),
            "groups": groups}


def _conv_data(r, x=(2, 4, 7, 6), w=(6, 2, 3, 3)):
    return (r.integers(-128, 128, x).astype(np.int8), r.integers(-127, 128, w).astype(np.int8))


def _ci_samples():
    r = rng(306)
    x, w = _conv_data(r)
    return [Sample((x, w, np.array(4, np.int8), np.array(0, np.int8)), _cattrs(1, 1, 1, 2)),
            Sample((x[:, :2].view(np.uint8), w[:, :1].repeat(2, 1), np.array(128, np.uint8),
                    np.zeros(6, np.int8)), _cattrs((2, 1), (0, 1), 1, 1))]


def _qc_samples():
    r = rng(307)
    x, w = _conv_data(r)
    sw = r.uniform(0.002, 0.01, 6).astype(np.float32)
    return [Sample((x, w, _f(0.05), np.array(-2, np.int8), sw, np.zeros(6, np.int8)),
                   _cattrs(1, 1, 1, 2)),
            Sample((x[:, :2], w[:, :1].repeat(2, 1), _f(0.02), np.array(0, np.int8), _f(0.01),
                    np.array(0, np.int8)), _cattrs(2, 0, (1, 2), 1))]


def _qlc_samples():
    r = rng(308)
    x, w = _conv_data(r)
    sw = r.uniform(0.002, 0.01, 6).astype(np.float32)
    return [Sample((x, _f(0.05), np.array(1, np.int8), w, sw, np.zeros(6, np.int8), _f(0.5),
                    np.array(-3, np.int8)), _cattrs(1, 1, 1, 2))]


def _conv_flops(x, w, *rest, stride, padding, dilation, groups):
    shape = _conv_check("conv", x, w, stride, padding, dilation, groups) \
        if all(isinstance(d, int) for d in x.shape) else (1, 1, 1, 1)
    n = 1
    for d in shape:
        n *= d
    return 2 * n * _n(Spec(tuple(w.shape[1:]), w.dtype))


def _qlc_flops(x, xs, xz, w, *rest, **attrs):
    return _conv_flops(x, w, **attrs)


CONV_INTEGER = defop("conv_integer", _ci_rule, kernel=_REF["conv_integer"],
                     grad=NOT_DIFFERENTIABLE,
                     flops=_conv_flops, onnx="ConvInteger", samples=_ci_samples,
                     keeps_float=False, doc="int8 conv2d -> int32 sums (zero points removed)")
QCONV2D = defop("qconv2d", _qc_rule, kernel=_REF["qconv2d"], grad=NOT_DIFFERENTIABLE,
                flops=_conv_flops, onnx=NO_ONNX, samples=_qc_samples,
                doc="int8 conv2d (int32 accumulate) dequantised to float32 with sx * sw; "
                    "exported as ConvInteger + Mul")
QLINEAR_CONV = defop("qlinear_conv", _qlc_rule, kernel=_REF["qlinear_conv"],
                     grad=NOT_DIFFERENTIABLE,
                     flops=_qlc_flops, onnx="QLinearConv", samples=_qlc_samples,
                     keeps_float=False, doc="int8 conv2d requantised to int8/uint8")
