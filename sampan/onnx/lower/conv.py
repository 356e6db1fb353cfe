"""Convolution and pooling: Conv, ConvTranspose, MaxPool, AveragePool, MaxUnpool (as a
scatter into the flat output plane: ONNX's MaxUnpool numbers positions per (n, c) plane
the way sampan does, but onnxruntime runs it in float32 only)."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering


def _pads(padding):
    p = [int(v) for v in padding]
    return p + p


@register_lowering("conv2d")
def _conv2d(ctx, x, w, *b, stride, padding, dilation, groups):
    return ctx.emit("Conv", [x, w, *b], strides=list(stride), pads=_pads(padding),
                    dilations=list(dilation), group=int(groups),
                    kernel_shape=list(ctx.spec(w).shape[2:]))


@register_lowering("conv_transpose2d")
def _conv_t(ctx, x, w, *b, stride, padding, dilation, groups, output_padding):
    return ctx.emit("ConvTranspose", [x, w, *b], strides=list(stride), pads=_pads(padding),
                    dilations=list(dilation), group=int(groups),
                    output_padding=list(output_padding),
                    kernel_shape=list(ctx.spec(w).shape[2:]))


def _poolable(ctx, x):
    """MaxPool takes floats and 8-bit ints: other ints pool as float64 (exact below 2**53)."""
    dt = ctx.spec(x).dtype
    if dt.kind in "iu" and dt.itemsize > 1:
        return ctx.cast(x, np.float64), dt
    return x, None


@register_lowering("max_pool2d")
def _max_pool(ctx, x, *, kernel_size, stride, padding, dilation=(1, 1), ceil_mode=False):
    x, back = _poolable(ctx, x)
    y = ctx.emit("MaxPool", [x], kernel_shape=list(kernel_size), strides=list(stride),
                 pads=_pads(padding), dilations=list(dilation), ceil_mode=int(ceil_mode))
    return y if back is None else ctx.cast(y, back)


@register_lowering("avg_pool2d")
def _avg_pool(ctx, x, *, kernel_size, stride, padding, count_include_pad=True,
              ceil_mode=False, divisor_override=None):
    if divisor_override is not None:
        return _window_sum(ctx, x, kernel_size, stride, padding, 1.0 / divisor_override)
    return ctx.emit("AveragePool", [x], kernel_shape=list(kernel_size), strides=list(stride),
                    pads=_pads(padding), count_include_pad=int(count_include_pad),
                    ceil_mode=int(ceil_mode))


@register_lowering("max_unpool2d")
def _max_unpool(ctx, x, indices, *, output_size):
    n, c = ctx.spec(x).shape[:2]
    hw = int(output_size[0]) * int(output_size[1])
    flat_x = ctx.emit("Reshape", [x, ctx.ints([0, 0, -1])])
    flat_i = ctx.emit("Reshape", [ctx.cast(indices, np.int64), ctx.ints([0, 0, -1])])
    zeros = ctx.emit("Expand", [ctx.scalar(0, ctx.spec(x).dtype),
                                ctx.emit("Concat", [ctx.emit("Shape", [x], start=0, end=2),
                                                    ctx.ints([hw])], axis=0)])
    out = ctx.emit("ScatterElements", [zeros, flat_i, flat_x], axis=2)
    shape = ctx.emit("Concat", [ctx.emit("Shape", [x], start=0, end=2),
                                ctx.ints(list(output_size))], axis=0)
    del n, c
    return ctx.emit("Reshape", [out, shape])


def _window_sum(ctx, x, kernel_size, stride, padding, scale):
    """Each window's sum (padding counts as zeros) times `scale`: a depthwise Conv with a
    kernel of `scale`s, padded at the end for the partial windows ceil_mode keeps."""
    spec = ctx.spec(x)
    c = spec.shape[1]
    if not isinstance(c, int):
        ctx.fail("a window sum over a symbolic number of channels")
    out_hw = ctx.out[0].shape[2:]
    ends = []
    for n, k, s, p, o in zip(spec.shape[2:], kernel_size, stride, padding, out_hw):
        ends.append(p + max(0, (o - 1) * s + k - (n + 2 * p)))
    w = ctx.const(np.full((c, 1) + tuple(kernel_size), scale, spec.dtype), "window")
    return ctx.emit("Conv", [x, w], strides=list(stride), group=c,
                    pads=[int(p) for p in padding] + ends, kernel_shape=list(kernel_size))


@register_lowering("max_pool2d_indices")
def _max_pool_indices(ctx, x, *, kernel_size, stride, padding, dilation=(1, 1),
                      ceil_mode=False):
    # MaxPool's indices count over the whole (N, C, H, W) tensor; sampan's (and torch's)
    # within each (n, c) plane
    h, w = ctx.spec(x).shape[2:]
    if not isinstance(h, int) or not isinstance(w, int):
        ctx.fail("max pooling indices over a plane of symbolic size")
    x, _ = _poolable(ctx, x)
    _, i = ctx.emit("MaxPool", [x], n_out=2, kernel_shape=list(kernel_size),
                    strides=list(stride), pads=_pads(padding), dilations=list(dilation),
                    ceil_mode=int(ceil_mode))
    return ctx.emit("Mod", [i, ctx.scalar(h * w, np.int64)])
