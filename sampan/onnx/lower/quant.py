"""The int8 ops of `sampan.quant` (sampan/ops/quant.py): QuantizeLinear, DequantizeLinear,
MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv. ONNX's quantisation ops take
float32/float16/bfloat16 scales and inputs, not float64. `qmatmul`/`qconv2d` (the fused
int8 kernels with a float output) and the fake-quant ops stay NO_ONNX."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering
from .conv import _pads


def _no_double(ctx, *names):
    for n in names:
        if n is not None and ctx.spec(n).dtype == np.float64:
            ctx.fail("ONNX quantisation ops take float32, float16 or bfloat16, not float64")


def _axis(ctx, x, axis):
    return int(axis) % max(len(ctx.spec(x).shape), 1)


@register_lowering("quantize")
def _quantize(ctx, x, scale, zero_point, *, axis=1):
    _no_double(ctx, x, scale)
    return ctx.emit("QuantizeLinear", [x, scale, zero_point], axis=_axis(ctx, x, axis))


@register_lowering("dequantize")
def _dequantize(ctx, q, scale, zero_point, *, axis=1):
    _no_double(ctx, scale)
    return ctx.emit("DequantizeLinear", [q, scale, zero_point], axis=_axis(ctx, q, axis))


@register_lowering("matmul_integer")
def _matmul_integer(ctx, a, b, a_zero_point, b_zero_point):
    return ctx.emit("MatMulInteger", [a, b, a_zero_point, b_zero_point])


@register_lowering("qlinear_matmul")
def _qlinear_matmul(ctx, *ins):
    _no_double(ctx, ins[1], ins[4], ins[6])
    return ctx.emit("QLinearMatMul", list(ins))


def _conv_attrs(ctx, w, stride, padding, dilation, groups):
    return dict(strides=list(stride), pads=_pads(padding), dilations=list(dilation),
                group=int(groups), kernel_shape=list(ctx.spec(w).shape[2:]))


@register_lowering("conv_integer")
def _conv_integer(ctx, x, w, x_zero_point, w_zero_point, *, stride, padding, dilation,
                  groups):
    return ctx.emit("ConvInteger", [x, w, x_zero_point, w_zero_point],
                    **_conv_attrs(ctx, w, stride, padding, dilation, groups))


@register_lowering("qlinear_conv")
def _qlinear_conv(ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                  y_zero_point, *, stride, padding, dilation, groups):
    _no_double(ctx, x_scale, w_scale, y_scale)
    return ctx.emit("QLinearConv", [x, x_scale, x_zero_point, w, w_scale, w_zero_point,
                                    y_scale, y_zero_point],
                    **_conv_attrs(ctx, w, stride, padding, dilation, groups))
