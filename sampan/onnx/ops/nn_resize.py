"""Import handlers for ONNX's resampling ops: Resize, Upsample, GridSample, AffineGrid.

Resize is separable: for each resized axis the importer computes, in numpy from the
static shapes, which input cells each output cell reads and with what weight (ONNX's
coordinate transformation, nearest rounding, cubic coefficient, exclude_outside and the
antialias filter stretched on downscale). Nearest becomes an `index_select` (exact, any
dtype); linear and cubic become a matmul with the (out, in) weight matrix along the axis,
so the result is differentiable with respect to the input.
"""
from __future__ import annotations

import math

import numpy as np

import sampan
import sampan.nn.functional as F

from . import onnx_op
from .nn import _shape_value
from .nn_grid import grid_sample_nd

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize")


def _source_coords(mode, n_in, n_out, scale, roi):
    """ONNX's coordinate transformation: the input coordinate of every output cell, and
    which of them fall outside the input (tf_crop_and_resize only)."""
    y = np.arange(n_out, dtype=np.float64)
    out_f = scale * n_in
    outside = None
    if mode == "align_corners":
        x = np.zeros(n_out) if out_f == 1 else y * (n_in - 1) / (out_f - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        lo, hi = roi
        if out_f == 1:
            x = np.full(n_out, (hi - lo) * (n_in - 1) / 2)
        else:
            x = y * (hi - lo) * (n_in - 1) / (out_f - 1)
        x = x + lo * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if out_f == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:   # half_pixel_symmetric
        offset = n_in / 2 * (1 - n_out / out_f)
        x = offset + (y + 0.5) / scale - 0.5
    return x, outside


def _cubic(d, a):
    d = np.abs(d)
    return np.where(d <= 1, (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1,
                    np.where(d < 2, a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a, 0.0))


def _taps(kind, ratio, scale, a, nearest_mode, antialias):
    """(offsets k, weights (n_out, n)) of the taps at `left + k` for ratios in (0, 1]."""
    if kind == "nearest":
        k = np.array([0, 1])
        whole = ratio == 1.0
        if nearest_mode == "round_prefer_floor":
            right = ratio > 0.5
        elif nearest_mode == "round_prefer_ceil":
            right = ratio >= 0.5
        elif nearest_mode == "floor":
            right = np.zeros_like(ratio, dtype=bool)
        else:   # ceil
            right = np.ones_like(ratio, dtype=bool)
        right = right | whole
        return k, np.stack([~right, right], axis=1).astype(np.float64)
    s = min(scale, 1.0) if antialias else 1.0
    reach = 1.0 if kind == "linear" else 2.0
    start = int(math.floor(-reach / s) + 1)
    k = np.arange(start, 1 - start + 1)                 # 2 - 2*start taps
    d = (k[None, :] - ratio[:, None]) * s
    w = np.clip(1 - np.abs(d), 0, 1) if kind == "linear" else _cubic(d, a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    return k, w


def _axis_weights(kind, n_in, n_out, scale, cmode, roi, a, nearest_mode, antialias,
                  exclude_outside):
    """The dense (n_out, n_in) weight matrix of one axis and its extrapolated rows."""
    x, outside = _source_coords(cmode, n_in, n_out, scale, roi)
    fl = np.floor(x)
    whole = x == fl
    left = np.where(whole, fl - 1, fl).astype(np.int64)
    ratio = np.where(whole, 1.0, x - fl)
    k, w = _taps(kind, ratio, scale, a, nearest_mode, antialias)
    idx = left[:, None] + k[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    idx = np.clip(idx, 0, n_in - 1)
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.repeat(np.arange(n_out), idx.shape[1]), idx.ravel()), w.ravel())
    return m, outside


def _resize(ctx, x, kind, scales, sizes, cmode, roi, a=-0.75, nearest_mode="round_prefer_floor",
            antialias=False, exclude_outside=False, extrapolation=0.0):
    r = x.ndim
    if cmode not in _COORD_MODES:
        raise ctx.error(f"coordinate_transformation_mode {cmode!r} is not one of "
                        f"{', '.join(_COORD_MODES)}")
    if sizes is not None:
        out_sizes = [int(v) for v in sizes]
        if scales is None:
            scales = [o / i for o, i in zip(out_sizes, x.shape)]
    else:
        scales = [float(v) for v in scales]
        out_sizes = [int(i * s) for i, s in zip(x.shape, scales)]
    y = x
    outside_any = None
    for ax in range(r):
        n_in, n_out, sc = x.shape[ax], out_sizes[ax], scales[ax]
        rroi = None if roi is None else (float(roi[ax]), float(roi[ax + r]))
        if n_out == n_in and math.isclose(sc, 1.0) and (rroi is None or rroi == (0.0, 1.0)):
            continue
        ctx.allow((n_out, n_in), np.float64, f"the weights of axis {ax}")
        m, outside = _axis_weights(kind, n_in, n_out, sc, cmode, rroi, a, nearest_mode,
                                   antialias, exclude_outside)
        if kind == "nearest":
            y = sampan.index_select(y, ax, sampan.Tensor(np.argmax(m, axis=1).astype(np.int64)))
        else:
            wt = sampan.Tensor(m.T.astype(y.dtype))            # (in, out)
            y = sampan.moveaxis(sampan.matmul(sampan.moveaxis(y, ax, -1), wt), -1, ax)
        if outside is not None and outside.any():
            shp = [1] * r
            shp[ax] = n_out
            o = outside.reshape(shp)
            outside_any = o if outside_any is None else (outside_any | o)
    if outside_any is not None:
        y = sampan.where(sampan.Tensor(outside_any), sampan.full_like(y, extrapolation), y)
    return y


@onnx_op("Resize", since=10)
def resize_v10(ctx, node, x, scales):
    mode = node.attr("mode", "nearest")
    s = _shape_value(ctx, scales, "scales")
    return _resize(ctx, x, _kind(ctx, mode), s, None, "asymmetric", None, nearest_mode="floor")


def _kind(ctx, mode):
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.error(f"mode {mode!r} is not one of nearest, linear, cubic")
    return mode


@onnx_op("Resize", since=11)
def resize(ctx, node, x, roi=None, scales=None, sizes=None):
    r = x.ndim
    kind = _kind(ctx, node.attr("mode", "nearest"))
    cmode = node.attr("coordinate_transformation_mode", "half_pixel")
    s = None if scales is None else _shape_value(ctx, scales, "scales")
    z = None if sizes is None else _shape_value(ctx, sizes, "sizes")
    s = None if s is None or s.size == 0 else s
    z = None if z is None or z.size == 0 else z
    if (s is None) == (z is None):
        raise ctx.error("exactly one of scales and sizes must be given")
    rv = None
    if cmode == "tf_crop_and_resize":
        rv = None if roi is None else _shape_value(ctx, roi, "roi")
        if rv is None or rv.size == 0:
            raise ctx.error("coordinate_transformation_mode tf_crop_and_resize needs roi")
    axes = node.attr("axes")
    if axes is not None:
        axes = [int(a) % r for a in axes]
    else:
        axes = list(range(r))
    full_s = [1.0] * r
    full_z = list(x.shape)
    full_roi = [0.0] * r + [1.0] * r
    for i, a in enumerate(axes):
        if s is not None:
            full_s[a] = float(s[i])
        else:
            full_z[a] = int(z[i])
        if rv is not None:
            full_roi[a], full_roi[r + a] = float(rv[i]), float(rv[len(axes) + i])
    if z is not None:
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratios = [full_z[a] / x.shape[a] for a in axes]
            if policy not in ("not_larger", "not_smaller"):
                raise ctx.error(f"keep_aspect_ratio_policy {policy!r} is not stretch, "
                                "not_larger or not_smaller")
            sc = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                full_z[a] = int(sc * x.shape[a] + 0.5)
            full_s = [sc if i in axes else 1.0 for i in range(r)]
        else:
            full_s = None
    return _resize(ctx, x, kind, full_s, full_z if z is not None else None, cmode,
                   full_roi if rv is not None else None,
                   a=float(node.attr("cubic_coeff_a", -0.75)),
                   nearest_mode=node.attr("nearest_mode", "round_prefer_floor"),
                   antialias=bool(node.attr("antialias", 0)),
                   exclude_outside=bool(node.attr("exclude_outside", 0)),
                   extrapolation=float(node.attr("extrapolation_value", 0.0)))


def _upsample(ctx, node, x, s):
    mode = node.attr("mode", "nearest")
    kind = {"nearest": "nearest", "linear": "linear", "bilinear": "linear"}.get(mode)
    if kind is None:
        raise ctx.error(f"mode {mode!r} is not nearest or linear")
    return _resize(ctx, x, kind, [float(v) for v in s], None, "asymmetric", None,
                   nearest_mode="floor")


@onnx_op("Upsample", since=7)
def upsample_v7(ctx, node, x):
    return _upsample(ctx, node, x, node.attr("scales"))


@onnx_op("Upsample", since=9)
def upsample(ctx, node, x, scales):
    return _upsample(ctx, node, x, _shape_value(ctx, scales, "scales"))


# ---------------------------------------------------------------------- grids
@onnx_op("AffineGrid", since=20)
def affine_grid(ctx, node, theta, size):
    sz = [int(v) for v in _shape_value(ctx, size, "size")]
    return F.affine_grid(theta, tuple(sz), align_corners=bool(node.attr("align_corners", 0)))


@onnx_op("GridSample", since=16)
def grid_sample(ctx, node, x, grid):
    mode = node.attr("mode", "bilinear" if ctx.opset < 20 else "linear")
    mode = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
    pad = node.attr("padding_mode", "zeros")
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ctx.error(f"mode {mode!r} is not one of linear, nearest, cubic")
    if pad not in ("zeros", "border", "reflection"):
        raise ctx.error(f"padding_mode {pad!r} is not one of zeros, border, reflection")
    if x.ndim < 3 or grid.ndim != x.ndim or grid.shape[-1] != x.ndim - 2:
        raise ctx.error(f"X {list(x.shape)} and grid {list(grid.shape)}: expected X (N, C, "
                        "D1..Dr) and grid (N, O1..Or, r)")
    if mode == "bicubic" or x.ndim != 4:
        return grid_sample_nd(x, grid, {"bilinear": "linear", "bicubic": "cubic"}.get(
            mode, mode), pad, bool(node.attr("align_corners", 0)))
    return F.grid_sample(x, grid, mode=mode, padding_mode=pad,
                         align_corners=bool(node.attr("align_corners", 0)))


@onnx_op("Col2Im", since=18)
def col2im(ctx, node, x, image_shape, block_shape):
    """Sum the columns back into an image: each (channel, block offset, position) value
    is added at its pixel with one `index_add` over the flattened padded image."""
    img = [int(v) for v in _shape_value(ctx, image_shape, "image_shape")]
    blk = [int(v) for v in _shape_value(ctx, block_shape, "block_shape")]
    r = len(img)
    dil = [int(v) for v in node.attr("dilations", [1] * r)]
    strides = [int(v) for v in node.attr("strides", [1] * r)]
    pads = [int(v) for v in node.attr("pads", [0] * 2 * r)]
    n, ck, L = x.shape
    kprod = int(np.prod(blk))
    if ck % kprod:
        raise ctx.error(f"input dim 1 ({ck}) is not a multiple of prod(block_shape) "
                        f"{blk}")
    c = ck // kprod
    padded = [img[i] + pads[i] + pads[r + i] for i in range(r)]
    nblk = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // strides[i] + 1 for i in range(r)]
    if int(np.prod(nblk)) != L:
        raise ctx.error(f"input has {L} blocks; image_shape {img}, block_shape {blk}, "
                        f"pads, strides and dilations give {int(np.prod(nblk))}")
    kk = np.stack(np.meshgrid(*[np.arange(b) for b in blk], indexing="ij"), -1).reshape(-1, r)
    ll = np.stack(np.meshgrid(*[np.arange(b) for b in nblk], indexing="ij"), -1).reshape(-1, r)
    pos = kk[:, None, :] * np.array(dil) + ll[None, :, :] * np.array(strides)   # (K, L, r)
    flat = np.ravel_multi_index(tuple(pos.reshape(-1, r).T), padded).astype(np.int64)
    out = sampan.zeros(n, c, int(np.prod(padded)), dtype=x.dtype)
    out = sampan.index_add(out, 2, sampan.Tensor(flat), sampan.reshape(x, n, c, kprod * L))
    out = sampan.reshape(out, n, c, *padded)
    if any(pads):
        out = F.pad(out, [v for i in reversed(range(r)) for v in (-pads[i], -pads[r + i])])
    return out
