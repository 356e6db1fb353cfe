"""The reference (numpy) arithmetic of the int8 ops (`ops/quant.py`): quantise, and an
int8 GEMM that accumulates exactly and finishes each output as `mode` says:

- I32: the int32 sums, zero points removed;
- F32: float32, the sums dequantised with a float64 multiplier per output column;
- Q8: int8/uint8, requantised in float64 (the ONNX ops' `qlinear_*` of issue 19);
- `requant` (the fused `qlinear_dense` / `qlinear_conv2d` of issue 31): int32 sums plus
  an int32 bias, times a float32 multiplier, rounded half to even, plus the output zero
  point, saturated to [qmin, qmax], as onnxruntime's QLinearMatMul / QLinearConv
  requantise (MLAS: float32 scale, nearbyint).

The values multiplied are exactly representable as floats, so BLAS computes the exact
sums while every partial sum stays below 2^24 (K * 128 * 128 for int8) in float32, else
in float64 (exact for K below 2^37). numpy's own integer matmul has no BLAS behind it.
The numba provider's kernels (`backends/numba/qkernels.py`) compute the same numbers
faster; the tests compare them with these exactly.

Zero points are corrected outside the dot: sum (a - za)(b - zb) = sum ab - za * colsum(b)
- zb * rowsum(a) + K za zb.
"""
from __future__ import annotations

import numpy as np

I32, F32, Q8 = 0, 1, 2      # what the GEMM writes: int32 sums, float32, requantised int8


def quant_operands(x, scale, zp, axis):
    """(x contiguous, scale vector, int32 zero points, x's 3-d shape (outer, channels,
    inner)) of a quantisation along `axis` (one channel when scale is a scalar)."""
    x = np.ascontiguousarray(x)
    s = np.asarray(scale, x.dtype).reshape(-1)
    z = np.asarray(zp).reshape(-1).astype(np.int32)
    c = s.shape[0]
    if c == 1:
        return x, s, z, (1, 1, x.size)
    return x, s, z, (int(np.prod(x.shape[:axis])), c, int(np.prod(x.shape[axis + 1:])))


def quantize(x, scale, zp, axis, lo, hi, out_dtype):
    """clip(rint(x / scale) + zp, lo, hi) as `out_dtype`; scale and zp are scalars or
    vectors along `axis` of x (ONNX QuantizeLinear; NaN gives the zero point)."""
    x, s, z, shape3 = quant_operands(x, scale, zp, axis)
    c = s.shape[0]
    x3 = x.reshape(shape3)
    with np.errstate(invalid="ignore"):
        v = x3 / s.reshape(1, c, 1)
        v = np.where(np.isnan(v), 0, np.rint(v)) + z.reshape(1, c, 1)
        return np.clip(v, lo, hi).astype(out_dtype).reshape(x.shape)


def sums(a, bt, za, zb):
    """sum_k (a[m, k] - za)(bt[n, k] - zb[n]) exactly, as int64 (M, N)."""
    k = a.shape[1]
    zb = np.broadcast_to(np.asarray(zb, np.int64).reshape(-1), (bt.shape[0],))
    big = k * 255 * 255 if a.dtype == np.uint8 or bt.dtype == np.uint8 else k * 128 * 128
    ft = np.float32 if big < 2 ** 24 else np.float64
    acc = (a.astype(ft) @ bt.astype(ft).T).astype(np.int64)
    if za:
        acc -= int(za) * bt.astype(np.int64).sum(1)[None, :]
    if np.any(zb):
        acc -= zb[None, :] * a.astype(np.int64).sum(1)[:, None]
        acc += k * int(za) * zb[None, :]
    return acc


def gemm(a, bt, za, zb, mult=None, zy=0, lo=-128, hi=127, mode=I32, out_dtype=np.int8):
    """(M, K) x (N, K)^T in exact integers, finished as `mode` says (see module doc)."""
    n = bt.shape[0]
    mult = (np.ones(n) if mult is None else
            np.broadcast_to(np.asarray(mult, np.float64).reshape(-1), (n,)))
    acc = sums(a, bt, za, zb)
    if mode == I32:
        return acc.astype(np.int32)
    acc = acc.astype(np.float64)
    if mode == F32:
        return (acc * mult).astype(np.float32)
    return np.clip(np.rint(acc * mult) + zy, lo, hi).astype(out_dtype)


def requant(acc, bias, mult, zy, qmin, qmax, out_dtype, axis=-1):
    """saturate(rint(float32(acc + bias) * mult) + zy) into [qmin, qmax] (see module doc);
    `bias` (int32) and `mult` (float32) per channel along `axis` of acc; `out_dtype`
    float32 gives float32(acc + bias) * mult, unrounded."""
    shape = [1] * acc.ndim
    shape[axis] = -1
    v = (acc.astype(np.int64) + np.asarray(bias, np.int64).reshape(shape)).astype(np.float32)
    v = v * np.asarray(mult, np.float32).reshape(shape)
    if np.dtype(out_dtype) == np.float32:
        return v
    return np.clip(np.rint(v).astype(np.int64) + int(zy), qmin, qmax).astype(out_dtype)


def conv_windows(x, kh, kw, stride, padding, dilation, xz):
    """The (N, C, Ho, Wo, kh, kw) windows of conv2d over x (NCHW), padded with the
    zero point `xz` (the real zero): a strided view after one padded copy."""
    from .conv import _pad
    n, _, h, wd = x.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    xp = _pad(x, padding[0], padding[1], value=int(xz))
    v = np.lib.stride_tricks.sliding_window_view(
        xp, (dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1), axis=(2, 3))
    return v[:, :, :stride[0] * (ho - 1) + 1:stride[0], :stride[1] * (wo - 1) + 1:stride[1],
             ::dilation[0], ::dilation[1]]


def conv_sums(x, w, xz, wz, stride, padding, dilation, groups):
    """sum over each window of (x - xz)(w - wz[o]) exactly, int64 (N, O, Ho, Wo)."""
    o, cg, kh, kw = w.shape
    v = conv_windows(x, kh, kw, stride, padding, dilation, xz)
    n, _, ho, wo = v.shape[:4]
    og = o // groups
    wz = np.broadcast_to(np.asarray(wz).reshape(-1), (o,))
    outs = []
    for gi in range(groups):
        rows = v[:, gi * cg:(gi + 1) * cg].transpose(0, 2, 3, 1, 4, 5).reshape(
            n * ho * wo, cg * kh * kw)
        sl = slice(gi * og, (gi + 1) * og)
        outs.append(sums(rows, w[sl].reshape(og, -1), xz, wz[sl]))
    acc = outs[0] if groups == 1 else np.concatenate(outs, axis=1)
    return acc.reshape(n, ho, wo, o).transpose(0, 3, 1, 2)
