"""Import handlers for the remaining ops: CumProd, CenterCropPad, Swish, TensorScatter,
Bernoulli, NonMaxSuppression, RoiAlign and DeformConv.

CumProd, CenterCropPad, Swish and TensorScatter are built from differentiable sampan ops
(TensorScatter's write positions may be data: a one-hot matrix of them places the
update). RoiAlign and DeformConv sample bilinearly with gathers at positions computed by
sampan ops, so they are differentiable in the image, the weights, the rois and the
offsets. Bernoulli draws from sampan's generator (a `seed` attribute seeds a generator of
its own), so its values are not numpy's. NonMaxSuppression's output length depends on the
data: it runs eagerly (its output is indices, which carry no gradient) and is refused
while `sampan.jit` traces.
"""
from __future__ import annotations

import numpy as np

import sampan
from ...ops.registry import STATE
from . import onnx_op
from .cast import onnx_dtype
from .reduce import scan
from .shape import ints, norm_axes, norm_axis


# ---------------------------------------------------------------------- CumProd
@onnx_op("CumProd", since=26)
def cumprod(ctx, node, x, axis):
    return scan(ctx, node, x, axis, sampan.cumprod, 1)


# ---------------------------------------------------------------------- CenterCropPad
@onnx_op("CenterCropPad", since=18)
def center_crop_pad(ctx, node, x, shape):
    want = ints(ctx.static(shape, "shape"))
    axes = node.attr("axes", None)
    axes = list(range(x.ndim)) if axes is None else norm_axes(ctx, axes, x.ndim)
    if len(want) != len(axes):
        raise ctx.error(f"shape has {len(want)} values for {len(axes)} axes")
    pads = [(0, 0)] * x.ndim
    for ax, s in zip(axes, want):
        dim = x.shape[ax]
        if s < 0:
            raise ctx.error(f"shape {want} has a negative size")
        if s < dim:          # crop: the extra element of an odd difference goes at the end
            x = sampan.narrow(x, ax, (dim - s) // 2, s)
        elif s > dim:        # pad with zeros, likewise
            pads[ax] = ((s - dim) // 2, s - dim - (s - dim) // 2)
    if any(p != (0, 0) for p in pads):
        x = sampan.pad(x, tuple(pads), value=0)
    return x


# ---------------------------------------------------------------------- Swish
@onnx_op("Swish", since=24)
def swish(ctx, node, x):
    alpha = float(node.attr("alpha", 1.0))
    return x * sampan.sigmoid(x * alpha if alpha != 1.0 else x)


# ---------------------------------------------------------------------- TensorScatter
@onnx_op("TensorScatter", since=24)
def tensor_scatter(ctx, node, past, update, write_indices=None):
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.error(f"mode={mode!r} (expected 'linear' or 'circular')")
    ax = norm_axis(ctx, node.attr("axis", -2), past.ndim)
    if ax == 0:
        raise ctx.error("axis 0 is the batch axis (expected an axis after it)")
    if update.ndim != past.ndim or any(
            u != p for i, (u, p) in enumerate(zip(update.shape, past.shape)) if i != ax) \
            or update.shape[ax] > past.shape[ax]:
        raise ctx.error(f"update has shape {list(update.shape)} for a cache of shape "
                        f"{list(past.shape)} (expected equal dims but along axis {ax}, "
                        "where it may be shorter)")
    b, big, s = past.shape[0], past.shape[ax], update.shape[ax]
    if write_indices is None:
        start = sampan.zeros((b,), dtype=sampan.int64)
    else:
        start = write_indices if write_indices.dtype == np.int64 else \
            sampan.cast(write_indices, sampan.int64)
    pos = start.reshape((b, 1)) + sampan.arange(s, dtype=sampan.int64).reshape((1, s))
    if mode == "circular":
        pos = sampan.remainder(pos, big)
    # onehot[b, l, s]: update row s lands at cache row l (positions past the end land
    # nowhere, as no row matches them)
    rows = sampan.arange(big, dtype=sampan.int64).reshape((1, big, 1))
    onehot = sampan.cast(sampan.eq(pos.reshape((b, 1, s)), rows), past.dtype)
    lead = (b,) + (1,) * (ax - 1)
    tail = (1,) * (past.ndim - ax - 1)
    # bring the axis last: [b, ..., rest, 1, s] @ [b, 1.., s, l] -> [b, ..., rest, 1, l]
    u = sampan.movedim(update, ax, -1).unsqueeze(-2)
    m = sampan.permute(onehot, 0, 2, 1).reshape((b,) + (1,) * (past.ndim - 2) + (s, big))
    placed = sampan.movedim(sampan.matmul(u, m).squeeze(-2), -1, ax)
    written = sampan.amax(onehot, 2).reshape(lead + (big,) + tail)
    return past * (1 - written) + placed


# ---------------------------------------------------------------------- Bernoulli
@onnx_op("Bernoulli", since=15)
def bernoulli(ctx, node, x):
    dtype = node.attr("dtype", None)
    dtype = x.dtype if dtype is None else onnx_dtype(ctx, dtype, "dtype")
    seed = node.attr("seed", None)
    if np.dtype(x.dtype).kind != "f":
        raise ctx.error(f"input is {x.dtype} (expected probabilities of a floating type)")
    gen = None if seed is None else sampan.Generator(int(seed))
    y = sampan.bernoulli(x, generator=gen)
    return y if y.dtype == dtype else sampan.cast(y, dtype)


# ---------------------------------------------------------------------- NonMaxSuppression
def _corners(b, center):
    """[n, 4] boxes as (ymin, xmin, ymax, xmax)."""
    if center:     # [x_center, y_center, width, height]
        x, y, w, h = b[:, 0], b[:, 1], b[:, 2] / 2, b[:, 3] / 2
        return np.stack([y - h, x - w, y + h, x + w], 1)
    y0, y1 = np.minimum(b[:, 0], b[:, 2]), np.maximum(b[:, 0], b[:, 2])
    x0, x1 = np.minimum(b[:, 1], b[:, 3]), np.maximum(b[:, 1], b[:, 3])
    return np.stack([y0, x0, y1, x1], 1)


def _iou(c, i, rest):
    """IoU of box i with the boxes `rest` (corner form)."""
    ih = np.minimum(c[i, 2], c[rest, 2]) - np.maximum(c[i, 0], c[rest, 0])
    iw = np.minimum(c[i, 3], c[rest, 3]) - np.maximum(c[i, 1], c[rest, 1])
    inter = np.where((ih > 0) & (iw > 0), ih * iw, 0.0)
    area = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
    union = area[i] + area[rest] - inter
    ok = (inter > 0) & (area[i] > 0) & (area[rest] > 0) & (union > 0)
    return np.where(ok, inter / np.where(union > 0, union, 1.0), 0.0)


def _opt_scalar(ctx, t, what, default):
    if t is None:
        return default
    a = np.asarray(ctx.static(t, what) if ctx.is_static(t) else t.numpy()).reshape(-1)
    return a[0] if a.size else default


@onnx_op("NonMaxSuppression", since=10)
def non_max_suppression(ctx, node, boxes, scores, max_out=None, iou_thr=None, score_thr=None):
    center = int(node.attr("center_point_box", 0))
    if center not in (0, 1):
        raise ctx.error(f"center_point_box={center} (expected 0 or 1)")
    if STATE.tracer is not None:
        raise ctx.error("the number of boxes it selects depends on the data, so it runs "
                        "eagerly only (call the layer without sampan.jit)")
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or \
            scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ctx.error(f"boxes {list(boxes.shape)} and scores {list(scores.shape)} (expected "
                        "[batch, boxes, 4] and [batch, classes, boxes])")
    k = max(int(_opt_scalar(ctx, max_out, "max_output_boxes_per_class", 0)), 0)
    iou = float(_opt_scalar(ctx, iou_thr, "iou_threshold", 0.0))
    thr = None if score_thr is None else float(_opt_scalar(ctx, score_thr, "score_threshold",
                                                           0.0))
    bx = np.asarray(boxes.numpy(), np.float64)   # eager: the selection is not differentiable
    sc = np.asarray(scores.numpy(), np.float64)
    out = []
    for bi in range(bx.shape[0]):
        c = _corners(bx[bi], center)
        for ci in range(sc.shape[1]):
            s = sc[bi, ci]
            cand = np.arange(s.size) if thr is None else np.nonzero(s > thr)[0]
            # highest score first; of equal scores the lower index first
            order = cand[np.lexsort((cand, -s[cand]))]
            kept = []
            for i in order:
                if len(kept) >= k:
                    break
                if not kept or not (_iou(c, i, np.array(kept)) > iou).any():
                    kept.append(i)
                    out.append((bi, ci, i))
    return sampan.tensor(np.array(out, np.int64).reshape(-1, 3))


# ---------------------------------------------------------------------- bilinear sampling
def _gather_hw(xf, idx):
    """xf [B, C, H*W] at flat positions idx [B, K] (int64): [B, C, K]."""
    b, c = xf.shape[0], xf.shape[1]
    return sampan.gather(xf, 2, sampan.broadcast_to(idx.unsqueeze(1), (b, c, idx.shape[1])))


def _corner(xf, yi, xi, w, width):
    """One bilinear corner: the values at integer (yi, xi) [B, K] weighted by w [B, K]."""
    v = _gather_hw(xf, yi * width + xi)
    return v * sampan.cast(w, xf.dtype).unsqueeze(1)


def _floor_int(t):
    return sampan.cast(sampan.floor(t), sampan.int64)


# ---------------------------------------------------------------------- RoiAlign
@onnx_op("RoiAlign", since=10)
def roi_align_v10(ctx, node, x, rois, batch_indices):
    return _roi_align(ctx, node, x, rois, batch_indices, "output_half_pixel")


@onnx_op("RoiAlign", since=16)
def roi_align_v16(ctx, node, x, rois, batch_indices):
    return _roi_align(ctx, node, x, rois, batch_indices,
                      node.attr("coordinate_transformation_mode", "half_pixel"))


def _roi_align(ctx, node, x, rois, batch_indices, ctm):
    mode = node.attr("mode", "avg")
    ph, pw = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    ratio = int(node.attr("sampling_ratio", 0))
    scale = float(node.attr("spatial_scale", 1.0))
    if mode not in ("avg", "max") or ctm not in ("half_pixel", "output_half_pixel"):
        raise ctx.error(f"mode={mode!r}, coordinate_transformation_mode={ctm!r} (expected "
                        "avg or max, half_pixel or output_half_pixel)")
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.ndim != 1 \
            or batch_indices.shape[0] != rois.shape[0]:
        raise ctx.error(f"X {list(x.shape)}, rois {list(rois.shape)}, batch_indices "
                        f"{list(batch_indices.shape)} (expected [N, C, H, W], [R, 4], [R])")
    n, c, h, w = x.shape
    r = rois.shape[0]
    half = ctm == "half_pixel"
    box = rois * scale - (0.5 if half else 0.0)
    if box.dtype != np.float64:
        box = sampan.cast(box, sampan.float64)
    x0, y0 = box[:, 0:1], box[:, 1:2]
    rw, rh = box[:, 2:3] - x0, box[:, 3:4] - y0
    if not half:
        rw, rh = sampan.clamp(rw, min=1.0), sampan.clamp(rh, min=1.0)
    bh, bw = rh / ph, rw / pw
    if ratio > 0:
        gh = gw = ratio
        gh_r = gw_r = None
    else:    # a grid per roi, ceil(roi size / bin count): the rois must be known
        b = np.asarray(ctx.static(rois, "rois (with sampling_ratio=0)"), np.float64)
        b = b * scale - (0.5 if half else 0.0)
        sw, sh = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        if not half:
            sw, sh = np.maximum(sw, 1.0), np.maximum(sh, 1.0)
        gh_r = np.ceil(sh / ph).astype(np.int64)
        gw_r = np.ceil(sw / pw).astype(np.int64)
        gh, gw = max(int(gh_r.max(initial=1)), 1), max(int(gw_r.max(initial=1)), 1)
    # sample coordinates [R, ph*gh] and [R, pw*gw]
    fy = (np.arange(ph)[:, None] + (np.arange(gh)[None, :] + 0.5) / gh).reshape(1, -1)
    fx = (np.arange(pw)[:, None] + (np.arange(gw)[None, :] + 0.5) / gw).reshape(1, -1)
    if gh_r is not None:    # per-roi grids: the sample offsets use each roi's own count
        fy = (np.arange(ph)[None, :, None] + (np.arange(gh)[None, None, :] + 0.5)
              / gh_r[:, None, None]).reshape(r, -1)
        fx = (np.arange(pw)[None, :, None] + (np.arange(gw)[None, None, :] + 0.5)
              / gw_r[:, None, None]).reshape(r, -1)
    ys = y0 + bh * sampan.tensor(fy)
    xs = x0 + bw * sampan.tensor(fx)
    ky, kx = ys.shape[1], xs.shape[1]
    # every (y sample, x sample) pair: [R, ky, kx] flattened
    yy = sampan.broadcast_to(ys.unsqueeze(2), (r, ky, kx)).reshape((r, ky * kx))
    xx = sampan.broadcast_to(xs.unsqueeze(1), (r, ky, kx)).reshape((r, ky * kx))
    inside = sampan.logical_not((yy < -1.0) | (yy > h) | (xx < -1.0) | (xx > w))
    yy, xx = sampan.clamp(yy, min=0.0), sampan.clamp(xx, min=0.0)
    ylo, xlo = _floor_int(yy), _floor_int(xx)
    ytop, xtop = ylo >= h - 1, xlo >= w - 1
    ylo, xlo = sampan.where(ytop, h - 1, ylo), sampan.where(xtop, w - 1, xlo)
    yhi, xhi = sampan.where(ytop, h - 1, ylo + 1), sampan.where(xtop, w - 1, xlo + 1)
    yy = sampan.where(ytop, sampan.cast(ylo, yy.dtype), yy)
    xx = sampan.where(xtop, sampan.cast(xlo, xx.dtype), xx)
    ly, lx = yy - sampan.cast(ylo, yy.dtype), xx - sampan.cast(xlo, xx.dtype)
    hy, hx = 1.0 - ly, 1.0 - lx
    valid = sampan.cast(inside, yy.dtype)
    bi = _int_indices(ctx, batch_indices, n)
    xf = sampan.index_select(x, 0, bi).reshape((r, c, h * w))
    corners = [_corner(xf, ylo, xlo, hy * hx * valid, w), _corner(xf, ylo, xhi, hy * lx * valid, w),
               _corner(xf, yhi, xlo, ly * hx * valid, w), _corner(xf, yhi, xhi, ly * lx * valid, w)]
    shape6 = (r, c, ph, gh, pw, gw)
    if mode == "avg":
        v = (corners[0] + corners[1] + corners[2] + corners[3]).reshape(shape6)
        if gh_r is None:
            return sampan.sum(v, (3, 5)) / float(max(gh * gw, 1))
        keep = ((np.arange(gh)[None, :] < gh_r[:, None])[:, None, None, :, None, None]
                & (np.arange(gw)[None, :] < gw_r[:, None])[:, None, None, None, None, :])
        cnt = np.maximum(gh_r * gw_r, 1).astype(np.float64).reshape(r, 1, 1, 1)
        v = v * sampan.tensor(keep.astype(np.dtype(x.dtype)))
        return sampan.sum(v, (3, 5)) / sampan.tensor(cnt.astype(np.dtype(x.dtype)))
    v = sampan.maximum(sampan.maximum(corners[0], corners[1]),
                       sampan.maximum(corners[2], corners[3])).reshape(shape6)
    if gh_r is not None:
        keep = ((np.arange(gh)[None, :] < gh_r[:, None])[:, None, None, :, None, None]
                & (np.arange(gw)[None, :] < gw_r[:, None])[:, None, None, None, None, :])
        v = sampan.where(sampan.tensor(keep), v, -np.inf)
    return sampan.amax(v, (3, 5))


def _int_indices(ctx, idx, n):
    if not np.issubdtype(np.dtype(idx.dtype), np.integer):
        raise ctx.error(f"batch_indices are {idx.dtype} (expected int64)")
    if ctx.is_static(idx):
        a = np.asarray(ctx.static(idx))
        if a.size and (a.min() < 0 or a.max() >= n):
            raise ctx.error(f"batch_indices {a[:8].tolist()} go outside [0, {n})")
    return idx if idx.dtype == np.int64 else sampan.cast(idx, sampan.int64)


# ---------------------------------------------------------------------- DeformConv
def _bilinear_zeros(xf, yy, xx, h, w):
    """Bilinear samples of xf [B, C, H*W] at real (yy, xx) [B, K]; corners outside the
    image count as zero (GridSample's zeros padding with aligned corners)."""
    y0, x0 = sampan.floor(yy), sampan.floor(xx)
    ly, lx = yy - y0, xx - x0
    y0, x0 = sampan.cast(y0, sampan.int64), sampan.cast(x0, sampan.int64)
    out = None
    for dy, wy in ((0, 1.0 - ly), (1, ly)):
        for dx, wx in ((0, 1.0 - lx), (1, lx)):
            yi, xi = y0 + dy, x0 + dx
            ok = (yi >= 0) & (yi <= h - 1) & (xi >= 0) & (xi <= w - 1)
            wgt = wy * wx * sampan.cast(ok, yy.dtype)
            v = _corner(xf, sampan.clamp(yi, 0, h - 1), sampan.clamp(xi, 0, w - 1), wgt, w)
            out = v if out is None else out + v
    return out


@onnx_op("DeformConv", since=19)
def deform_conv(ctx, node, x, weight, offset, bias=None, mask=None):
    if x.ndim != 4:
        raise ctx.error(f"X has shape {list(x.shape)}; sampan imports 2-d DeformConv only "
                        "(expected [N, C, H, W])")
    n, c, h, w = x.shape
    oc, cg = weight.shape[0], weight.shape[1]
    ks = ints(node.attr("kernel_shape", list(weight.shape[2:])))
    group, og = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    pads = ints(node.attr("pads", [0, 0, 0, 0]))
    st = ints(node.attr("strides", [1, 1]))
    dil = ints(node.attr("dilations", [1, 1]))
    kh, kw = ks
    if c != cg * group or oc % group or c % og or tuple(ks) != tuple(weight.shape[2:]):
        raise ctx.error(f"X {list(x.shape)}, W {list(weight.shape)}, group={group}, "
                        f"offset_group={og}, kernel_shape={ks} do not agree")
    oh = (h + pads[0] + pads[2] - (kh - 1) * dil[0] - 1) // st[0] + 1
    ow = (w + pads[1] + pads[3] - (kw - 1) * dil[1] - 1) // st[1] + 1
    if tuple(offset.shape) != (n, og * kh * kw * 2, oh, ow):
        raise ctx.error(f"offset has shape {list(offset.shape)}; expected "
                        f"{[n, og * kh * kw * 2, oh, ow]}")
    if mask is not None and tuple(mask.shape) != (n, og * kh * kw, oh, ow):
        raise ctx.error(f"mask has shape {list(mask.shape)}; expected "
                        f"{[n, og * kh * kw, oh, ow]}")
    # sample positions [N*og, kh*kw*oh*ow]: the kernel tap's place plus its offset
    off = offset.reshape((n * og, kh, kw, 2, oh, ow))
    base_y = (-pads[0] + st[0] * np.arange(oh))[None, None, :, None] \
        + dil[0] * np.arange(kh)[:, None, None, None]
    base_x = (-pads[1] + st[1] * np.arange(ow))[None, None, None, :] \
        + dil[1] * np.arange(kw)[None, :, None, None]
    dt = np.dtype(x.dtype)
    yy = off[:, :, :, 0] + sampan.tensor(np.broadcast_to(base_y, (kh, kw, oh, ow)).astype(dt))
    xx = off[:, :, :, 1] + sampan.tensor(np.broadcast_to(base_x, (kh, kw, oh, ow)).astype(dt))
    k = kh * kw * oh * ow
    xf = x.reshape((n * og, c // og, h * w))
    cols = _bilinear_zeros(xf, yy.reshape((n * og, k)), xx.reshape((n * og, k)), h, w)
    if mask is not None:
        cols = cols * mask.reshape((n * og, 1, k))
    # [N, group, C/group * kh*kw, oh*ow] against W [group, OC/group, C/group * kh*kw]
    cols = cols.reshape((n, group, cg * kh * kw, oh * ow))
    wm = weight.reshape((1, group, oc // group, cg * kh * kw))
    y = sampan.matmul(wm, cols).reshape((n, oc, oh, ow))
    if bias is not None:
        y = y + bias.reshape((1, oc, 1, 1))
    return y
