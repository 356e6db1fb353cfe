"""conv2d, its weight gradient and conv_transpose2d (its input gradient) with numba: the
im2col/col2im loops (`convloops`, 5-20x faster than numpy's data movement on small
layers), the one-GEMM layout for images with few output pixels, the weight gradient of
tiny layers as dot-product loops, and generated direct kernels (`convgen`) for layers
with few taps per output or depthwise-like ones. What they do not serve runs the ops'
numpy paths (`sampan.ops.conv`, `sampan.ops.conv_transpose`), which share the GEMM and
chunking steps with these kernels. bfloat16/float16 compute in float32 and round (the
ops' rule)."""
from __future__ import annotations

import numpy as np

from ....ops import conv as _c
from ....ops import conv_transpose as _ct
from .. import convgen
from .. import convloops as _loops
from .elementwise import in_float32

_LOOP_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _any_loops(dtype):
    """Whether the numba loops for any stride and dilation serve this dtype."""
    return dtype in _LOOP_DTYPES


def _unit_loops(dtype, stride, dilation):
    """Whether the numba im2col/col2im loops serve this call (see convloops.py)."""
    return _any_loops(dtype) and stride == (1, 1) and dilation == (1, 1)


# Per-sample GEMMs (one per image, batched by np.matmul) cost more in calls than in
# arithmetic when an image has few output pixels: LeNet's second layer (16x150 @ 150x100
# per image) ran forward, weight gradient and input gradient in 0.86-1.6 ms each at
# batch 64, against 0.68-0.79 ms with all images' pixels side by side in one GEMM (plus
# a transpose of the small output). At 784 pixels (the first layer) the two were even,
# so the one-GEMM layout serves convolutions with at most this many output pixels.
_ONE_GEMM_MAX_PIXELS = 256


# A weight gradient with at most this many entries (LeNet's first layer: 6 x 25) is
# computed by a numba dot-product loop: BLAS took 1.5 ms for its 64 per-image GEMMs
# (6x784 @ 784x25) and their sum, the loop with im2col 1.0 ms. (The same layer's
# forward as row updates in numba was 10% slower than its per-image GEMMs.) The loop
# counts on an image's rows staying in cache, so larger images keep BLAS.
_DOTS_MAX_OUTPUTS = 256
_DOTS_MAX_PIXELS = 1024


def _weight_grad_dots(dtype, stride, dilation, groups, outputs, pixels):
    return (groups == 1 and outputs <= _DOTS_MAX_OUTPUTS and pixels <= _DOTS_MAX_PIXELS
            and _unit_loops(dtype, stride, dilation))


# Convolutions with at most this many taps per output (C/groups*kh*kw; LeNet's first
# layer has 25, a 3x3 depthwise one 9), or at most 2 output channels per group, and at
# least DIRECT_MIN_OUTPUTS outputs (N*O*Ho*Wo; LeNet's first: 301,056) run generated
# direct kernels (backends/numba/convgen.py): their im2col GEMM is memory-bound. A
# kernel size compiles its own kernels (~1-2 s, then cached on disk), which small calls
# would not repay. DIRECT_MAX_TAPS = 0 turns them off.
DIRECT_MAX_TAPS = 32
DIRECT_MIN_OUTPUTS = 1 << 16
# the generated source grows with the kernel: 11x11 compiled in ~7 s (3x3 and 7x7 in 1-3 s)
DIRECT_MAX_KERNEL = 11


def _direct(dtype, stride, dilation, cg, og, kh, kw, outputs=DIRECT_MIN_OUTPUTS):
    """Whether the direct kernels serve a layer of `cg` input and `og` output channels
    per group: few taps, or a depthwise-like layer (og <= 2), whose GEMMs are (og, K) @
    (K, pixels) products that BLAS runs as slow vector products (a 3x3 depthwise layer
    on 64 channels of 32x32 at batch 16: 8.4 -> 1.6 ms forward)."""
    return (cg >= 1 and 1 < kh * kw and max(kh, kw) <= DIRECT_MAX_KERNEL
            and (cg * kh * kw <= DIRECT_MAX_TAPS or og <= 2)
            and DIRECT_MAX_TAPS > 0 and outputs >= DIRECT_MIN_OUTPUTS
            and _unit_loops(dtype, stride, dilation))


def _direct_strided(dtype, stride, dilation, cg, og, kh, kw, outputs):
    """Whether a stride-2 depthwise-like layer (og <= 2) runs the direct kernels: the
    forward computes the stride-1 planes and stores every stride-th pixel, the gradients
    go through the zero-upsampled output gradient. 4x the arithmetic, but the GEMM path
    ran such layers as slow vector products (3x3 depthwise, 64 channels of 56x56 at
    stride 2, batch 16: forward 12.6 ms, input gradient 26.5 ms there, 5.6 and 8.8 ms
    this way)."""
    return (stride != (1, 1) and max(stride) <= 2 and og <= 2
            and _direct(dtype, (1, 1), dilation, cg, og, kh, kw, outputs))


def _direct_kernel(which, dtype, og, kh, kw):
    return convgen.kernel(which, og, kh, kw, dtype)


def _one_gemm(dtype, stride, dilation, groups, pixels):
    return (groups == 1 and pixels <= _ONE_GEMM_MAX_PIXELS
            and _unit_loops(dtype, stride, dilation))


def _cols_one_gemm(x, padding, kh, kw, ho, wo):
    """Columns (C*kh*kw, N*ho*wo) of x for the one-GEMM layout."""
    n, c = x.shape[:2]
    col = np.empty((c * kh * kw, n * ho * wo), x.dtype)
    _loops.im2col_rows(np.ascontiguousarray(_c._pad(x, *padding)), kh, kw, ho, wo, col)
    return col


def _im2col(xp, kh, kw, ho, wo, stride, dilation):
    """Columns (N, C, kh, kw, Ho, Wo) of a padded input, as one contiguous copy (the
    loops where they serve the dtype, else the op's numpy copy)."""
    (sh, sw), (dh, dw) = stride, dilation
    if _any_loops(xp.dtype):
        n, c = xp.shape[:2]
        col = np.empty((n, c * kh * kw, ho * wo), xp.dtype)
        if _unit_loops(xp.dtype, stride, dilation):
            _loops.im2col(np.ascontiguousarray(xp), kh, kw, ho, wo, col)
        else:
            _loops.im2col_strided(np.ascontiguousarray(xp), kh, kw, ho, wo, sh, sw, dh, dw,
                                  col)
        return col.reshape(n, c, kh, kw, ho, wo)
    return _c._im2col_numpy(xp, kh, kw, ho, wo, stride, dilation)


def _conv2d(x, w, stride, padding, dilation, groups):
    """conv2d with the numba loops: generated direct kernels for few taps per output,
    the one-GEMM layout for small images, else im2col by loops and one batched GEMM."""
    n, h, wd = x.shape[0], x.shape[2], x.shape[3]
    o, cg, kh, kw = w.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if kh == kw == 1 and stride == (1, 1) and padding == (0, 0):
        pass
    elif (_direct(x.dtype, stride, dilation, cg, o // groups, kh, kw, n * o * ho * wo)
          or _direct_strided(x.dtype, stride, dilation, cg, o // groups, kh, kw,
                             n * o * (h + 2 * padding[0] - kh + 1)
                             * (wd + 2 * padding[1] - kw + 1))):
        # (strided: the stride-1 planes, every stride-th pixel stored)
        y = np.empty((n, o, ho, wo), x.dtype)
        w2 = np.ascontiguousarray(w).reshape(o, -1)
        _direct_kernel("forward", x.dtype, o // groups, kh, kw)(
            np.ascontiguousarray(x), w2, y, *padding, *stride)
        return y
    elif _one_gemm(x.dtype, stride, dilation, groups, ho * wo):
        y = w.reshape(o, cg * kh * kw) @ _cols_one_gemm(x, padding, kh, kw, ho, wo)
        return np.ascontiguousarray(y.reshape(o, n, ho, wo).transpose(1, 0, 2, 3))
    return _c._conv2d_cols(x, w, stride, padding, dilation, groups, _im2col)


def _gw(x, g, kernel_size, stride, padding, dilation, groups):
    n, c, h, wd = x.shape
    o, ho, wo = g.shape[1], g.shape[2], g.shape[3]
    kh, kw = kernel_size
    k = c // groups * kh * kw
    if _direct(x.dtype, stride, dilation, c // groups, o // groups, kh, kw, n * o * ho * wo):
        out = np.empty((o, k), x.dtype)
        _direct_kernel("weight_grad", x.dtype, o // groups, kh, kw)(
            np.ascontiguousarray(x), np.ascontiguousarray(g), out, *padding)
        return out.reshape(o, c // groups, kh, kw)
    hf = (h + 2 * padding[0] - kh + 1, wd + 2 * padding[1] - kw + 1)   # stride-1 output
    if _direct_strided(x.dtype, stride, dilation, c // groups, o // groups, kh, kw,
                       n * o * hf[0] * hf[1]):
        return _gw(x, _c._upsample(g, stride, hf), kernel_size, (1, 1), padding, dilation,
                   groups)
    if _weight_grad_dots(x.dtype, stride, dilation, groups, o * k, ho * wo):
        col = _cols_one_gemm(x, padding, kh, kw, ho, wo)
        out = np.empty((o, k), x.dtype)
        _loops.weight_grad_dots(np.ascontiguousarray(g).reshape(n, o, ho * wo), col,
                                x.dtype.type(0), out)
        return out.reshape(o, c, kh, kw)
    if _one_gemm(x.dtype, stride, dilation, groups, ho * wo):
        col = _cols_one_gemm(x, padding, kh, kw, ho, wo)
        return (_c._samples_last(g) @ col.T).reshape(o, c, kh, kw)
    return _c._gw_cols(x, g, kernel_size, stride, padding, dilation, groups, _im2col)


def _col2im(col, h, wd, stride, padding, dilation, ho, wo):
    """`conv_transpose`'s column accumulation by the loops (stride 1 and dilation 1, or
    any), else the op's numpy one."""
    n, o, kh, kw = col.shape[:4]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if _unit_loops(col.dtype, stride, dilation):
        buf = np.empty((n, o, h + kh - 1, wd + kw - 1), col.dtype)
        _loops.col2im(col.reshape(n, o * kh * kw, h * wd), h, wd, kh, kw, buf)
        return _c._crop(buf, ph, pw, ho, wo)
    if _any_loops(col.dtype):
        hb = max((h - 1) * sh + dh * (kh - 1) + 1, ph + ho)
        wb = max((wd - 1) * sw + dw * (kw - 1) + 1, pw + wo)
        buf = np.empty((n, o, hb, wb), col.dtype)
        _loops.col2im_strided(col.reshape(n, o * kh * kw, h * wd), h, wd, kh, kw,
                              sh, sw, dh, dw, buf)
        return np.ascontiguousarray(buf[:, :, ph:ph + ho, pw:pw + wo])
    return _ct._col2im_numpy(col, h, wd, stride, padding, dilation, ho, wo)


def _conv_transpose(x, w, stride, padding, output_padding, dilation, groups):
    n, ci, h, wd = x.shape
    _, cog, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h - 1) * sh - 2 * ph + dh * (kh - 1) + output_padding[0] + 1
    wo = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + output_padding[1] + 1
    cig = ci // groups
    direct_ok = ph < kh and pw < kw and ho > 0 and wo > 0   # the padding k - 1 - p >= 0
    if direct_ok and _direct(x.dtype, stride, dilation, cig, cog, kh, kw,
                             n * cog * groups * ho * wo):
        # stride 1: the correlation of x, padded by k - 1 - p, with the flipped kernel,
        # each group's (in, out) weight transposed to (out, in)
        wf = w.reshape(groups, cig, cog, kh, kw)[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4)
        wf = np.ascontiguousarray(wf).reshape(groups * cog, cig * kh * kw)
        y = np.empty((n, groups * cog, ho, wo), x.dtype)
        _direct_kernel("forward", x.dtype, cog, kh, kw)(np.ascontiguousarray(x), wf, y,
                                                        kh - 1 - ph, kw - 1 - pw, 1, 1)
        return y
    hu = ((h - 1) * sh + 1 + output_padding[0], (wd - 1) * sw + 1 + output_padding[1])
    if direct_ok and _direct_strided(x.dtype, stride, dilation, cig, cog, kh, kw,
                                     n * cog * groups * ho * wo):
        return _conv_transpose(_c._upsample(x, stride, hu), w, (1, 1), padding, (0, 0),
                               dilation, groups)
    if _one_gemm(x.dtype, stride, dilation, groups, h * wd) and (kh, kw) != (1, 1):
        col = w.reshape(ci, cog * kh * kw).T @ _c._samples_last(x)      # (K, N*L)
        buf = np.empty((n, cog, h + kh - 1, wd + kw - 1), col.dtype)
        _loops.col2im_rows(col, h, wd, kh, kw, buf)
        return _c._crop(buf, ph, pw, ho, wo)
    return _ct._ct_cols(x, w, stride, padding, output_padding, dilation, groups, _col2im)


KERNELS = {"conv2d": in_float32(_conv2d), "conv2d_grad_weight": in_float32(_gw),
           "conv_transpose2d": in_float32(_conv_transpose)}
