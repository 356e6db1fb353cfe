"""Import handlers for ONNX's indexing ops: Slice, Gather, GatherElements, GatherND,
Scatter, ScatterElements, ScatterND, Compress, NonZero, Unique, TopK, OneHot, Trilu,
EyeLike, ConstantOfShape, Range, ReverseSequence.

Indices that are data stay sampan tensors (negative ones are wrapped with `where`), so
gathers and scatters remain differentiable in the data they move. NonZero, Unique and
Compress have data-dependent output shapes: they run eagerly, and tracing them raises
sampan's own clear error.
"""
from __future__ import annotations

import math

import numpy as np

import sampan
from . import onnx_op
from .shape import ints, norm_axes, norm_axis


def _int64(ctx, idx, what="indices"):
    if not np.issubdtype(np.dtype(idx.dtype), np.integer):
        raise ctx.error(f"{what} are {idx.dtype} (expected int32 or int64)")
    return idx if idx.dtype == np.int64 else sampan.cast(idx, sampan.int64)


def _wrap(ctx, idx, n, what="indices"):
    """Indices in [-n, n) as [0, n): numpy for static ones (checked), `where` for data."""
    if ctx.is_static(idx):
        a = np.asarray(ctx.static(idx)).astype(np.int64)
        if a.size and (a.min() < -n or a.max() >= n):
            raise ctx.error(f"{what} {a.reshape(-1)[:8].tolist()}... go outside [-{n}, {n})")
        return sampan.tensor(np.where(a < 0, a + n, a))
    idx = _int64(ctx, idx, what)
    return sampan.where(idx < 0, idx + n, idx)


# ---------------------------------------------------------------------- Slice
_FAR = 2 ** 31 - 1     # bounds this far out (INT_MAX, INT64_MIN ...) mean "to the end"


def _slice(ctx, x, starts, ends, axes, steps):
    starts, ends = ints(starts), ints(ends)
    axes = list(range(len(starts))) if axes is None else ints(axes)
    steps = [1] * len(starts) if steps is None else ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(f"starts {starts}, ends {ends}, axes {axes}, steps {steps} differ "
                        "in length")
    axes = norm_axes(ctx, axes, x.ndim)
    key = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        n = x.shape[a]
        if st == 0:
            raise ctx.error(f"step 0 on axis {a}")
        if st < 0 and s < -n:    # ONNX starts such a slice at 0; Python's would be empty
            e = e + n if e < 0 else e
            key[a] = slice(0, None if e < 0 else e, st)
        elif st > 0:
            # otherwise Python's slice clamps as ONNX does: kept as given, a negative start
            # stays relative to the end, so a graph traced with a dynamic dim serves every
            # size (x[:, -3:], x.flip(1)); INT_MAX-like bounds mean "to the end"
            key[a] = slice(None if s <= -_FAR else s, None if e >= _FAR else e, st)
        else:
            key[a] = slice(None if s >= _FAR else s, None if e <= -_FAR else e, st)
    key = [slice(k.start, k.stop, None if k.step == 1 else k.step) for k in key]
    if all(k == slice(None) for k in key):
        return x
    return x[tuple(key)]


@onnx_op("Slice", since=1)
def slice_v1(ctx, node, x):
    return _slice(ctx, x, node.attr("starts"), node.attr("ends"), node.attr("axes"), None)


@onnx_op("Slice", since=10)
def slice_v10(ctx, node, x, starts, ends, axes=None, steps=None):
    return _slice(ctx, x, ctx.static(starts, "starts"), ctx.static(ends, "ends"),
                  ctx.static(axes, "axes"), ctx.static(steps, "steps"))


# ---------------------------------------------------------------------- gathers
@onnx_op("Gather", since=1)
def gather(ctx, node, x, indices):
    axis = norm_axis(ctx, node.attr("axis", 0), x.ndim)
    if ctx.is_static(indices) and indices.ndim == 0:
        # one index (x[:, -1], say): plain indexing keeps a negative one as it is, so a
        # traced graph serves every size of that axis
        i, n = int(ctx.static(indices)), x.shape[axis]
        if not -n <= i < n:
            raise ctx.error(f"index {i} is outside [-{n}, {n}) on axis {axis}")
        return x[(slice(None),) * axis + (i,)]
    idx = _wrap(ctx, indices, x.shape[axis])
    out = sampan.index_select(x, axis, sampan.reshape(idx, -1))
    return sampan.reshape(out, *x.shape[:axis], *indices.shape, *x.shape[axis + 1:])


@onnx_op("GatherElements", since=11)
def gather_elements(ctx, node, x, indices):
    axis = norm_axis(ctx, node.attr("axis", 0), x.ndim)
    if indices.ndim != x.ndim:
        raise ctx.error(f"indices of rank {indices.ndim} for a {x.ndim}-d input")
    return sampan.take_along_axis(x, _wrap(ctx, indices, x.shape[axis]), axis)


def _linear(ctx, indices, dims, what="indices"):
    """ONNX's N-d indices (last dim k) as int64 offsets into the first k dims `dims`."""
    k = indices.shape[-1]
    strides = np.cumprod([1] + list(dims[::-1]))[:-1][::-1].astype(np.int64)
    cols = [_wrap(ctx, _col(ctx, indices, j), dims[j], what) for j in range(k)]
    lin = None
    for j, c in enumerate(cols):
        term = c * int(strides[j])
        lin = term if lin is None else lin + term
    if lin is None:
        return sampan.tensor(np.zeros(indices.shape[:-1], np.int64))
    return lin


def _col(ctx, indices, j):
    if ctx.is_static(indices):
        return ctx.make_static(np.asarray(ctx.static(indices))[..., j])
    return indices[..., j]


@onnx_op("GatherND", since=11)
def gather_nd(ctx, node, x, indices):
    b = int(node.attr("batch_dims", 0))
    k = indices.shape[-1]
    if b + k > x.ndim or tuple(indices.shape[:b]) != tuple(x.shape[:b]):
        raise ctx.error(f"indices {list(indices.shape)} with batch_dims={b} for data "
                        f"{list(x.shape)}")
    bs = int(np.prod(x.shape[:b]))
    rest = x.shape[b + k:]
    lin = sampan.reshape(_linear(ctx, indices, x.shape[b:b + k]), bs, -1)
    x3 = sampan.reshape(x, bs, int(np.prod(x.shape[b:b + k])), int(np.prod(rest)))
    n_idx = lin.shape[1]
    idx3 = sampan.broadcast_to(sampan.reshape(lin, bs, n_idx, 1), (bs, n_idx, x3.shape[2]))
    out = sampan.take_along_axis(x3, idx3, 1)
    return sampan.reshape(out, *indices.shape[:-1], *rest)


# ---------------------------------------------------------------------- scatters
_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter(ctx, x, axis, idx, updates, reduction):
    if reduction in (None, "none"):
        return sampan.scatter(x, axis, idx, updates)
    if reduction not in _REDUCE:
        raise ctx.error(f"reduction={reduction!r} (expected none, add, mul, max or min)")
    return sampan.scatter_reduce(x, axis, idx, updates, _REDUCE[reduction], include_self=True)


@onnx_op("Scatter", since=9)
@onnx_op("ScatterElements", since=11)
def scatter_elements(ctx, node, x, indices, updates):
    axis = norm_axis(ctx, node.attr("axis", 0), x.ndim)
    if indices.shape != updates.shape or indices.ndim != x.ndim:
        raise ctx.error(f"indices {list(indices.shape)} and updates {list(updates.shape)} "
                        f"for data {list(x.shape)} (expected equal shapes of its rank)")
    idx = _wrap(ctx, indices, x.shape[axis])
    return _scatter(ctx, x, axis, idx, updates, node.attr("reduction", "none"))


@onnx_op("ScatterND", since=11)
def scatter_nd(ctx, node, x, indices, updates):
    k = indices.shape[-1]
    want = tuple(indices.shape[:-1]) + tuple(x.shape[k:])
    if k > x.ndim or tuple(updates.shape) != want:
        raise ctx.error(f"indices {list(indices.shape)} and updates {list(updates.shape)} "
                        f"for data {list(x.shape)} (expected updates of shape {list(want)})")
    m, r = int(np.prod(x.shape[:k])), int(np.prod(x.shape[k:]))
    lin = sampan.reshape(_linear(ctx, indices, x.shape[:k]), -1, 1)
    n = lin.shape[0]
    x2 = sampan.reshape(x, m, r)
    out = _scatter(ctx, x2, 0, sampan.broadcast_to(lin, (n, r)),
                   sampan.reshape(updates, n, r), node.attr("reduction", "none"))
    return sampan.reshape(out, *x.shape)


# ---------------------------------------------------------------------- data-dependent
def _nonzero_1d(cond):
    return sampan.reshape(sampan.nonzero(cond), -1)


@onnx_op("NonZero", since=9)
def nonzero(ctx, node, x):
    if x.ndim == 0:
        return sampan.tensor(np.zeros((0, int(bool(x.numpy()))), np.int64))
    return sampan.permute(sampan.nonzero(x), 1, 0)


@onnx_op("Compress", since=9)
def compress(ctx, node, x, condition):
    axis = node.attr("axis", None)
    if axis is None:
        x, axis = sampan.reshape(x, -1), 0
    else:
        axis = norm_axis(ctx, axis, x.ndim)
    n = x.shape[axis]
    if condition.ndim != 1:
        raise ctx.error(f"condition of shape {list(condition.shape)} (expected 1-d)")
    if ctx.is_static(condition):   # known positions: an index_select that traces
        c = np.asarray(ctx.static(condition)).reshape(-1)[:n]
        return sampan.index_select(x, axis, sampan.tensor(np.flatnonzero(c).astype(np.int64)))
    if condition.shape[0] > n:
        condition = condition[:n]
    return sampan.index_select(x, axis, _nonzero_1d(condition))


@onnx_op("Unique", since=11)
def unique(ctx, node, x):
    axis = node.attr("axis", None)
    if axis is not None:
        axis = norm_axis(ctx, axis, x.ndim)
    flat = sampan.reshape(x, -1) if axis is None else x
    ax = 0 if axis is None else axis
    _, inverse, counts = sampan.unique(flat, sorted=True, return_inverse=True,
                                       return_counts=True, dim=None if axis is None else ax)
    inverse = sampan.reshape(inverse, -1)
    n, k = flat.shape[ax], counts.shape[0]
    # first occurrence of each value: the smallest position whose inverse is it
    first = sampan.scatter_reduce(sampan.full((k,), n, dtype=sampan.int64), 0, inverse,
                                  sampan.arange(n, dtype=sampan.int64), "amin")
    if not node.attr("sorted", 1):    # ONNX: values in the order they first appear
        perm = sampan.argsort(first, stable=True)
        first, counts = first[perm], counts[perm]
        inverse = sampan.argsort(perm, stable=True)[inverse]
    y = sampan.index_select(flat, ax, first)
    return y, first, inverse, sampan.cast(counts, sampan.int64)


# ---------------------------------------------------------------------- TopK
def _topk(ctx, node, x, k):
    axis = norm_axis(ctx, node.attr("axis", -1), x.ndim)
    k = int(np.asarray(k).reshape(-1)[0])
    if not 0 <= k <= x.shape[axis]:
        raise ctx.error(f"K={k} for an axis of size {x.shape[axis]}")
    largest = bool(node.attr("largest", 1))
    # a stable sort: of equal values the one with the lower index comes first (ONNX's rule)
    v, i = sampan.sort(x, axis, descending=largest, stable=True)
    return sampan.narrow(v, axis, 0, k), sampan.narrow(i, axis, 0, k)


@onnx_op("TopK", since=1)
def topk_v1(ctx, node, x):
    return _topk(ctx, node, x, node.attr("k"))


@onnx_op("TopK", since=10)
def topk_v10(ctx, node, x, k):
    return _topk(ctx, node, x, ctx.static(k, "K"))


# ---------------------------------------------------------------------- generators
@onnx_op("OneHot", since=9)
def one_hot(ctx, node, indices, depth, values):
    d = int(np.asarray(ctx.static(depth, "depth")).reshape(-1)[0])
    rank = indices.ndim + 1
    axis = norm_axis(ctx, node.attr("axis", -1), rank)
    if not np.issubdtype(np.dtype(indices.dtype), np.integer):
        indices = sampan.cast(indices, sampan.int64)
    idx = sampan.cast(indices, sampan.int64)
    idx = sampan.where(idx < 0, idx + d, idx)
    idx = sampan.reshape(idx, *indices.shape[:axis], 1, *indices.shape[axis:])
    ar = np.arange(d, dtype=np.int64).reshape([d if i == axis else 1 for i in range(rank)])
    hot = sampan.eq(idx, sampan.tensor(ar))
    return sampan.where(hot, values[1], values[0])


@onnx_op("Trilu", since=14)
def trilu(ctx, node, x, k=None):
    k = 0 if k is None else int(np.asarray(ctx.static(k, "k")).reshape(-1)[0])
    if x.ndim < 2:
        raise ctx.error(f"input of rank {x.ndim} (expected at least 2)")
    return sampan.triu(x, k) if node.attr("upper", 1) else sampan.tril(x, k)


def _sampan_dtype(ctx, dt, what):
    """`dt` if sampan has tensors of it, else an OnnxError naming it."""
    dt = np.dtype(dt)
    if dt.name not in _DTYPES:
        raise ctx.error(f"{what} is {dt.name}, a dtype sampan has no tensors of (it has "
                        f"{', '.join(_DTYPES)})")
    return dt


_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
           "float32", "float64")


def _np_dtype(ctx, code, default):
    if code is None:
        return np.dtype(default)
    from onnx import helper
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(int(code)))
    except Exception:  # noqa: BLE001 - not a dtype onnx maps to numpy
        raise ctx.error(f"dtype {code} has no numpy equivalent") from None
    return _sampan_dtype(ctx, dt, "the dtype attribute")


@onnx_op("EyeLike", since=9)
def eye_like(ctx, node, x):
    if x.ndim != 2:
        raise ctx.error(f"input of rank {x.ndim} (expected 2)")
    dt = _np_dtype(ctx, node.attr("dtype", None), x.dtype)
    r, c, k = x.shape[0], x.shape[1], int(node.attr("k", 0))
    if ctx.foldable((r, c), dt):
        return ctx.make_static(np.eye(r, c, k, dtype=dt))
    # too large to make at import: ops that make it when the program runs
    rows = sampan.reshape(sampan.arange(r, dtype=sampan.int64), r, 1)
    return sampan.cast(rows + k == sampan.arange(c, dtype=sampan.int64), dt)


@onnx_op("ConstantOfShape", since=9)
def constant_of_shape(ctx, node, shape):
    dims = ints(ctx.static(shape, "the shape"))
    v = node.attr("value", None)
    v = np.zeros(1, np.float32) if v is None else np.asarray(v)
    if v.size != 1:
        raise ctx.error(f"value holds {v.size} elements (expected one)")
    _sampan_dtype(ctx, v.dtype, "value")
    if min(dims, default=0) < 0:
        raise ctx.error(f"shape {dims} has a negative dim")
    if ctx.foldable(dims, v.dtype):
        return ctx.make_static(np.full(dims, v.reshape(-1)[0], dtype=v.dtype))
    # too large to make at import (the file would not pay for it): a fill in the graph
    return sampan.full(tuple(dims), v.reshape(-1)[0].item(), dtype=v.dtype)


@onnx_op("Range", since=11)
def range_(ctx, node, start, limit, delta):
    s, lim, d = (np.asarray(ctx.static(t, w)) for t, w in
                 ((start, "start"), (limit, "limit"), (delta, "delta")))
    s0, lim0, d0 = s.item(), lim.item(), d.item()
    if d0 == 0:
        raise ctx.error("delta is 0")
    if all(isinstance(v, int) for v in (s0, lim0, d0)):
        n = max(-((s0 - lim0) // d0), 0)     # ceil((limit - start) / delta), exactly
    else:
        q = (lim0 - s0) / d0
        if not math.isfinite(q):
            raise ctx.error(f"start {s0}, limit {lim0} and delta {d0} give no finite length")
        n = max(math.ceil(q), 0)
    if ctx.foldable((n,), np.float64):     # the float64/int64 steps below
        out = s0 + np.arange(n) * d0       # ONNX: start + i * delta
        return ctx.make_static(out.astype(s.dtype))
    # too large to make at import: made when the program runs
    return sampan.arange(s0, lim0, d0, dtype=s.dtype)


@onnx_op("ReverseSequence", since=10)
def reverse_sequence(ctx, node, x, sequence_lens):
    t = norm_axis(ctx, node.attr("time_axis", 0), x.ndim, "time_axis")
    b = norm_axis(ctx, node.attr("batch_axis", 1), x.ndim, "batch_axis")
    if {t, b} != {0, 1}:
        raise ctx.error(f"time_axis={t}, batch_axis={b} (expected 0 and 1 in some order)")
    nt, nb = x.shape[t], x.shape[b]
    shape_t = [nt if i == t else 1 for i in range(x.ndim)]
    shape_b = [nb if i == b else 1 for i in range(x.ndim)]
    ar = sampan.tensor(np.arange(nt, dtype=np.int64).reshape(shape_t))
    lens = sampan.reshape(_int64(ctx, sequence_lens, "sequence_lens"), *shape_b)
    idx = sampan.where(ar < lens, lens - 1 - ar, ar)
    return sampan.take_along_axis(x, sampan.broadcast_to(idx, tuple(x.shape)), t)
