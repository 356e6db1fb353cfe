"""Import handlers for the remaining ops: CumProd, CenterCropPad, Swish, TensorScatter,
Bernoulli and NonMaxSuppression.

CumProd, CenterCropPad, Swish and TensorScatter are built from differentiable sampan ops
(TensorScatter's write positions may be data: a one-hot matrix of them places the
update). Bernoulli draws from sampan's generator (a `seed` attribute seeds a generator of
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
from .shape import ints, norm_axes, norm_axis


# ---------------------------------------------------------------------- CumProd
@onnx_op("CumProd", since=26)
def cumprod(ctx, node, x, axis):
    a = np.asarray(ctx.static(axis, "axis")).reshape(-1)
    if a.size != 1:
        raise ctx.error(f"axis holds {a.size} values (expected one)")
    ax = norm_axis(ctx, a[0], x.ndim)
    rev, excl = bool(node.attr("reverse", 0)), bool(node.attr("exclusive", 0))
    y = sampan.flip(x, ax) if rev else x
    if excl:   # shift by one along the axis: the product of what comes strictly before
        n = y.shape[ax]
        pads = [(0, 0)] * y.ndim
        pads[ax] = (1, 0)
        y = sampan.pad(sampan.narrow(y, ax, 0, max(n - 1, 0)), tuple(pads), value=1)
    y = sampan.cumprod(y, axis=ax)
    if y.dtype != x.dtype:
        y = sampan.cast(y, x.dtype)
    return sampan.flip(y, ax) if rev else y


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
