"""Resampling: `interpolate` in PyTorch's modes, pixel (un)shuffle, unfold and fold.

interpolate is separable: one pass per spatial dim, each an `index_select` of the source
rows the mode reads, weighted by constants (linear: 2 taps, cubic: 4, nearest: 1). The
source positions and weights are computed in numpy with PyTorch's formulas and in its
precision (float32 scales for nearest; the input's dtype for linear and cubic), so the
results match to rounding; the gradients come from index_select and the products.
pixel_shuffle is a reshape and a permute; unfold stacks the strided window slices (no
index leaves the padded input); fold is the adjoint of unfold, one conv_transpose2d with
a one-hot weight.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor
from ._util import Sample, randf, rng

_MODES = {"nearest": (1, 2, 3), "nearest-exact": (1, 2, 3), "linear": (1,), "bilinear": (2,),
          "bicubic": (2,), "trilinear": (3,), "area": (1, 2, 3)}
_INTERPOLATING = ("linear", "bilinear", "bicubic", "trilinear")


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _scale(n_in, n_out, scale, dtype):
    """PyTorch's compute_scales_value: 1/scale_factor when given, else in/out."""
    if scale is not None and scale > 0:
        return dtype.type(1.0 / scale)
    return dtype.type(n_in) / dtype.type(n_out)


def _nearest_index(n_in, n_out, scale, exact):
    o = np.arange(n_out)
    if not exact and n_out == n_in:
        return o
    if not exact and n_out == 2 * n_in:
        return o >> 1
    s = _scale(n_in, n_out, scale, np.dtype(np.float32))
    src = (o.astype(np.float32) + np.float32(0.5)) * s if exact else o.astype(np.float32) * s
    return np.minimum(np.floor(src).astype(np.int64), n_in - 1)


def _source(n_in, n_out, align, scale, dtype, cubic):
    """PyTorch's area_pixel_compute_source_index for every output position."""
    o = np.arange(n_out).astype(dtype)
    if align:
        s = dtype.type((n_in - 1) / (n_out - 1)) if n_out > 1 else dtype.type(0)
        return s * o
    s = _scale(n_in, n_out, scale, dtype)
    src = s * (o + dtype.type(0.5)) - dtype.type(0.5)
    return src if cubic else np.maximum(src, dtype.type(0))


def _linear_taps(n_in, n_out, align, scale, dtype):
    if n_out == n_in:
        o = np.arange(n_out)
        return [(o, np.ones(n_out, dtype))]
    src = _source(n_in, n_out, align, scale, dtype, False)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - i0.astype(dtype), 0, 1).astype(dtype)
    i1 = i0 + (i0 < n_in - 1)
    return [(i0, (1 - lam).astype(dtype)), (i1, lam)]


def _cubic_taps(n_in, n_out, align, scale, dtype):
    a = dtype.type(-0.75)
    src = _source(n_in, n_out, align, scale, dtype, True)
    f = np.floor(src)
    t = (src - f).astype(dtype)

    def near(x):       # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):        # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    ws = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    base = f.astype(np.int64) - 1
    return [(np.clip(base + k, 0, n_in - 1), w.astype(dtype)) for k, w in enumerate(ws)]


def _resample_axis(x, axis, taps):
    """sum_k x[..., idx_k, ...] * w_k along `axis` (weights broadcast along it)."""
    from .elementwise import add, mul
    from .index import index_select
    shape = [1] * x.ndim
    shape[axis] = -1
    y = None
    for idx, w in taps:
        v = index_select(x, Tensor(np.ascontiguousarray(idx, np.int64)), axis)
        if not np.all(w == 1):
            v = mul(v, Tensor(w.reshape(shape)))
        y = v if y is None else add(y, v)
    return y


def _out_sizes(op, x, nd, size, scale_factor, recompute):
    if (size is None) == (scale_factor is None):
        raise op_error(SampanValueError, op, f"size={size}, scale_factor={scale_factor}",
                       "exactly one of size and scale_factor")
    if size is not None:
        sizes = (size,) * nd if isinstance(size, (int, np.integer)) else tuple(size)
        if len(sizes) != nd:
            raise op_error(ShapeError, op, f"size={size} for a {x.ndim}-d input",
                           f"an int or {nd} sizes")
        sizes, scales = tuple(int(s) for s in sizes), (None,) * nd
    else:
        sf = (scale_factor,) * nd if isinstance(scale_factor, (int, float)) else tuple(
            scale_factor)
        if len(sf) != nd or any(s <= 0 for s in sf):
            raise op_error(ShapeError, op, f"scale_factor={scale_factor} for a {x.ndim}-d "
                           "input", f"a positive number or {nd} of them")
        sizes = tuple(int(math.floor(float(n) * float(s))) for n, s in zip(x.shape[2:], sf))
        scales = (None,) * nd if recompute else tuple(float(s) for s in sf)
    if min(sizes) < 1 or min(x.shape[2:]) < 1:
        raise op_error(ShapeError, op, f"input {tuple(x.shape)} with size={size}, "
                       f"scale_factor={scale_factor}",
                       f"input and output sizes >= 1 (output {sizes})")
    return sizes, scales


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """PyTorch's `F.interpolate` over (N, C, *spatial) input: modes "nearest",
    "nearest-exact", "linear" (3-d input), "bilinear", "bicubic" (4-d), "trilinear"
    (5-d) and "area"; `size` or `scale_factor` (used for the coordinates too unless
    recompute_scale_factor); align_corners for the interpolating modes.

    Example::

        >>> F.interpolate(sampan.randn(1, 3, 4, 4), scale_factor=2, mode="bilinear").shape
        (1, 3, 8, 8)
    """
    op = "interpolate"
    x = _t(input)
    if mode not in _MODES:
        raise op_error(SampanValueError, op, f"mode={mode!r}", f"one of {tuple(_MODES)}")
    nd = x.ndim - 2
    if nd not in _MODES[mode]:
        raise op_error(ShapeError, op, f"a {x.ndim}-d input with mode={mode!r}",
                       f"{' or '.join(str(d + 2) for d in _MODES[mode])}-d input for that mode")
    if align_corners is not None and mode not in _INTERPOLATING:
        raise op_error(SampanValueError, op, f"align_corners={align_corners} with mode={mode!r}",
                       f"align_corners only with {_INTERPOLATING}")
    if antialias:
        raise op_error(SampanValueError, op, "antialias=True", "antialias=False (not "
                       "implemented in sampan)")
    sizes, scales = _out_sizes(op, x, nd, size, scale_factor, recompute_scale_factor)
    if mode == "area":
        from .pool import adaptive_avg_pool2d
        from .pool3d import adaptive_avg_pool3d
        from .spatial1d import adaptive_avg_pool1d
        return (adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d)[nd - 1](x, sizes)
    if mode.startswith("nearest"):
        for d, (n_out, s) in enumerate(zip(sizes, scales)):
            idx = _nearest_index(x.shape[d + 2], n_out, s, mode == "nearest-exact")
            x = _resample_axis(x, d + 2, [(idx, np.ones(1))])
        return x
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, op, f"dtype {x.dtype} with mode={mode!r}", "a floating dtype")
    dtype = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)
    taps = _cubic_taps if mode == "bicubic" else _linear_taps
    for d, (n_out, s) in enumerate(zip(sizes, scales)):
        x = _resample_axis(x, d + 2, taps(x.shape[d + 2], n_out, bool(align_corners), s, dtype))
    return x


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """`interpolate` under its older name (PyTorch's F.upsample)."""
    return interpolate(input, size, scale_factor, mode, align_corners)


# ---------------------------------------------------------------------- pixel shuffle
def pixel_shuffle(input, upscale_factor):
    """(*, C*r*r, H, W) -> (*, C, H*r, W*r), PyTorch's channel order.

    Example: ``F.pixel_shuffle(sampan.randn(1, 8, 3, 3), 2).shape`` is (1, 2, 6, 6)"""
    from .shape import permute, reshape
    x, r = _t(input), int(upscale_factor)
    if x.ndim < 3 or r < 1 or x.shape[-3] % (r * r):
        raise op_error(ShapeError, "pixel_shuffle", f"input {tuple(x.shape)} with "
                       f"upscale_factor={upscale_factor}", "(*, C*r*r, H, W) input, r >= 1")
    lead, (c, h, w) = tuple(x.shape[:-3]), x.shape[-3:]
    k = len(lead)
    y = reshape(x, lead + (c // (r * r), r, r, h, w))
    y = permute(y, tuple(range(k)) + tuple(k + i for i in (0, 3, 1, 4, 2)))
    return reshape(y, lead + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    """(*, C, H*r, W*r) -> (*, C*r*r, H, W), the inverse of pixel_shuffle.

    Example: ``F.pixel_unshuffle(sampan.randn(1, 2, 6, 6), 2).shape`` is (1, 8, 3, 3)"""
    from .shape import permute, reshape
    x, r = _t(input), int(downscale_factor)
    if x.ndim < 3 or r < 1 or x.shape[-2] % r or x.shape[-1] % r:
        raise op_error(ShapeError, "pixel_unshuffle", f"input {tuple(x.shape)} with "
                       f"downscale_factor={downscale_factor}", "(*, C, H*r, W*r) input, r >= 1")
    lead, (c, h, w) = tuple(x.shape[:-3]), x.shape[-3:]
    k = len(lead)
    y = reshape(x, lead + (c, h // r, r, w // r, r))
    y = permute(y, tuple(range(k)) + tuple(k + i for i in (0, 2, 4, 1, 3)))
    return reshape(y, lead + (c * r * r, h // r, w // r))


def channel_shuffle(input, groups):
    """(N, C, *) with C = g * k -> channels reordered (0, k, 2k, …, 1, k + 1, …).

    Example: ``F.channel_shuffle(sampan.randn(1, 4, 2, 2), 2).shape`` is (1, 4, 2, 2)"""
    from .shape import reshape, transpose
    x, g = _t(input), int(groups)
    if x.ndim < 3 or g < 1 or x.shape[1] % g:
        raise op_error(ShapeError, "channel_shuffle", f"input {tuple(x.shape)} with "
                       f"groups={groups}", "(N, C, *) input with C divisible by groups >= 1")
    n, c = x.shape[:2]
    rest = tuple(x.shape[2:])
    y = transpose(reshape(x, (n, g, c // g) + rest), 1, 2)
    return reshape(y, (n, c) + rest)


# ---------------------------------------------------------------------- unfold / fold
def _pair(v, op, name):
    if isinstance(v, (int, np.integer)):
        return (int(v), int(v))
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise op_error(ShapeError, op, f"{name}={v}", "an int or a pair of ints")
    return v


def _fold_args(op, kernel_size, dilation, padding, stride):
    k, d = _pair(kernel_size, op, "kernel_size"), _pair(dilation, op, "dilation")
    p, s = _pair(padding, op, "padding"), _pair(stride, op, "stride")
    if min(k) < 1 or min(d) < 1 or min(s) < 1 or min(p) < 0:
        raise op_error(ShapeError, op, f"kernel_size={k}, dilation={d}, padding={p}, "
                       f"stride={s}", "kernel, dilation, stride >= 1 and padding >= 0")
    return k, d, p, s


def _blocks(op, hw, k, d, p, s):
    out = tuple((n + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for n, kk, dd, pp, ss in
                zip(hw, k, d, p, s))
    if min(out) < 1:
        raise op_error(ShapeError, op, f"spatial size {tuple(hw)} with kernel_size={k}, "
                       f"dilation={d}, padding={p}", "a size the kernel fits in")
    return out


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """Sliding local blocks (im2col): (N, C, H, W) -> (N, C*kh*kw, L), PyTorch's order.

    Example::

        >>> F.unfold(sampan.randn(1, 2, 4, 4), 2).shape
        (1, 8, 9)
    """
    from .pool3d import _taps
    from .shape import reshape, unsqueeze
    op = "unfold"
    x = _t(input)
    sq = x.ndim == 3
    if sq:
        x = unsqueeze(x, 0)
    if x.ndim != 4:
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)}",
                       "a 3-d (C, H, W) or 4-d (N, C, H, W) input")
    k, d, p, s = _fold_args(op, kernel_size, dilation, padding, stride)
    out = _blocks(op, x.shape[2:], k, d, p, s)
    cols = _taps(x, k, s, p, d, out, 0.0)                       # (N, C, K, Ho, Wo)
    n, c = x.shape[:2]
    y = reshape(cols, (n, c * k[0] * k[1], out[0] * out[1]))
    return reshape(y, tuple(y.shape[1:])) if sq else y


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sum sliding local blocks back into an image (col2im), the adjoint of unfold:
    (N, C*kh*kw, L) -> (N, C, H, W).

    Example::

        >>> F.fold(sampan.randn(1, 8, 9), (4, 4), 2).shape
        (1, 2, 4, 4)
    """
    from .conv_transpose import conv_transpose2d
    from .shape import reshape, unsqueeze
    op = "fold"
    x = _t(input)
    sq = x.ndim == 2
    if sq:
        x = unsqueeze(x, 0)
    k, d, p, s = _fold_args(op, kernel_size, dilation, padding, stride)
    hw = _pair(output_size, op, "output_size")
    out = _blocks(op, hw, k, d, p, s)
    kk = k[0] * k[1]
    if x.ndim != 3 or x.shape[1] % kk or x.shape[2] != out[0] * out[1]:
        raise op_error(ShapeError, op, f"input of shape {tuple(x.shape)} for output_size="
                       f"{hw}, kernel_size={k}", f"(N, C*{kk}, {out[0] * out[1]}) (the "
                       "number of blocks that fit the output)")
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a floating dtype")
    n, ck, _ = x.shape
    c = ck // kk
    w = np.zeros((ck, 1) + k, x.dtype)
    w[np.arange(ck), 0, (np.arange(ck) % kk) // k[1], np.arange(ck) % k[1]] = 1
    op_pad = tuple((n_ + 2 * pp - dd * (q - 1) - 1) % ss for n_, q, dd, pp, ss in
                   zip(hw, k, d, p, s))
    y = conv_transpose2d(reshape(x, (n, ck) + out), Tensor(w), None, s, p, op_pad, c, d)
    return reshape(y, tuple(y.shape[1:])) if sq else y


def _register():
    from .composite import COMPOSITES

    def interp(mode):
        def fn(x, **attrs):
            return interpolate(x, mode=mode, **attrs)
        return fn

    def x(seed, *shape):
        return randf(rng(seed), *shape)
    COMPOSITES["interpolate_nearest"] = (interp("nearest"), lambda: [
        Sample((x(110, 1, 2, 3, 4),), {"scale_factor": 1.7}),
        Sample((x(111, 1, 2, 5),), {"size": 3})])
    COMPOSITES["interpolate_nearest_exact"] = (interp("nearest-exact"), lambda: [
        Sample((x(112, 1, 1, 3, 5),), {"size": (5, 3)})])
    COMPOSITES["interpolate_linear"] = (interp("linear"), lambda: [
        Sample((x(113, 1, 2, 4),), {"size": 7}),
        Sample((x(114, 2, 1, 5),), {"scale_factor": 1.5, "align_corners": True})])
    COMPOSITES["interpolate_bilinear"] = (interp("bilinear"), lambda: [
        Sample((x(115, 1, 1, 3, 4),), {"size": (5, 3)}),
        Sample((x(116, 1, 2, 3, 3),), {"scale_factor": 1.5, "align_corners": True})])
    COMPOSITES["interpolate_bicubic"] = (interp("bicubic"), lambda: [
        Sample((x(117, 1, 1, 4, 3),), {"size": (3, 5)}),
        Sample((x(118, 1, 1, 3, 3),), {"scale_factor": 2, "align_corners": True})])
    COMPOSITES["interpolate_trilinear"] = (interp("trilinear"), lambda: [
        Sample((x(119, 1, 1, 2, 3, 2),), {"size": (3, 2, 4)})])
    COMPOSITES["pixel_shuffle"] = (pixel_shuffle, lambda: [
        Sample((x(120, 1, 8, 2, 3),), {"upscale_factor": 2})])
    COMPOSITES["pixel_unshuffle"] = (pixel_unshuffle, lambda: [
        Sample((x(121, 2, 1, 4, 6),), {"downscale_factor": 2})])
    COMPOSITES["channel_shuffle"] = (channel_shuffle, lambda: [
        Sample((x(126, 1, 6, 2, 2),), {"groups": 3})])
    COMPOSITES["unfold"] = (unfold, lambda: [
        Sample((x(122, 1, 2, 4, 5),), {"kernel_size": (2, 3), "padding": 1, "stride": 2}),
        Sample((x(123, 1, 1, 5, 5),), {"kernel_size": 2, "dilation": 2})])
    COMPOSITES["fold"] = (fold, lambda: [
        Sample((x(124, 1, 6, 9),), {"output_size": (4, 5), "kernel_size": (2, 3),
                                    "padding": 1, "stride": 2}),
        Sample((x(125, 1, 4, 9),), {"output_size": 5, "kernel_size": 2, "dilation": 2})])


_register()
