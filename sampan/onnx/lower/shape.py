"""Shape, layout and slicing: Reshape (-1 for one symbolic dim, else a computed shape),
Transpose, Expand, Concat, Pad, and indexing (getitem as Slice/Squeeze/Gather/Compress/
Unsqueeze; its gradient and setitem as ScatterElements over the flat positions)."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering

_BIG = np.iinfo(np.int64).max


def shape_tensor(ctx, shape, allow_infer=True):
    """A Reshape target for `shape`: one symbolic entry becomes -1, more are computed."""
    syms = [k for k, d in enumerate(shape) if isinstance(d, str)]
    if allow_infer and len(syms) == 1:
        return ctx.ints([-1 if isinstance(d, str) else d for d in shape])
    return ctx.ints(shape)


@register_lowering("reshape")
def _reshape(ctx, x, *, shape):
    if 0 in [d for d in shape if isinstance(d, int)]:
        return ctx.emit("Reshape", [x, ctx.ints(shape)], allowzero=1)
    return ctx.emit("Reshape", [x, shape_tensor(ctx, shape)])


@register_lowering("permute")
def _permute(ctx, x, *, dims):
    return ctx.emit("Transpose", [x], perm=[int(d) for d in dims])


@register_lowering("expand")
def _expand(ctx, x, *, shape):
    return ctx.emit("Expand", [x, ctx.ints(shape)])


@register_lowering("concat")
def _concat(ctx, *xs, axis):
    from .elementwise import to_out
    return ctx.emit("Concat", to_out(ctx, *xs), axis=int(axis))


@register_lowering("copy")
def _copy(ctx, x):
    return ctx.emit("Identity", [x])


@register_lowering("pad")
def _pad(ctx, x, *, pads, value=0.0):
    starts = [a for a, _ in pads]
    ends = [b for _, b in pads]
    v = ctx.scalar(value, ctx.spec(x).dtype)
    return ctx.emit("Pad", [x, ctx.ints(starts + ends), v], mode="constant")


@register_lowering("flip")
def _flip(ctx, x, *, axes):
    n = len(axes)
    return ctx.emit("Slice", [x, ctx.ints([-1] * n), ctx.ints([-_BIG] * n),
                              ctx.ints(list(axes)), ctx.ints([-1] * n)])


# ---------------------------------------------------------------------- indexing
def _expand_ellipsis(index, ndim, idx_specs):
    used = 0
    for e in index:
        if e[0] in "si":
            used += 1
        elif e[0] == "t":
            s = idx_specs[e[1]]
            used += len(s.shape) if s.dtype == np.bool_ else 1
    out = []
    for e in index:
        if e[0] == "e":
            out += [("s", None, None, None)] * (ndim - used)
        else:
            out.append(e)
    return out


def lower_index(ctx, x, idx, index):
    """x[index] with ONNX ops (see module doc)."""
    spec = ctx.spec(x)
    specs = [ctx.spec(i) for i in idx]
    items = _expand_ellipsis(index, len(spec.shape), specs)
    tensors = [e for e in items if e[0] == "t"]
    if len(tensors) > 1:
        ctx.fail("indexing with more than one index tensor")
    starts, ends, axes, steps, squeeze, nones = [], [], [], [], [], []
    dim = out = 0
    tensor_at = None
    for e in items:
        if e[0] == "s":
            _, a, b, c = e
            c = 1 if c is None else c
            if (a, b, c) != (None, None, 1):
                starts.append(a if a is not None else (0 if c > 0 else _BIG))
                ends.append(b if b is not None else (_BIG if c > 0 else -_BIG))
                axes.append(dim)
                steps.append(c)
            dim += 1
            out += 1
        elif e[0] == "i":
            k = e[1]
            starts.append(k)
            ends.append(k + 1 if k != -1 else _BIG)
            axes.append(dim)
            steps.append(1)
            squeeze.append(dim)
            dim += 1
        elif e[0] == "n":
            nones.append(out)
            out += 1
        else:
            s = specs[e[1]]
            nd = len(s.shape) if s.dtype == np.bool_ else 1
            tensor_at = (dim, e[1], nd, out)
            dim += nd
            out += 1 if s.dtype == np.bool_ else len(s.shape)
    y = x
    if axes:
        y = ctx.emit("Slice", [y, ctx.ints(starts), ctx.ints(ends), ctx.ints(axes),
                               ctx.ints(steps)])
    if squeeze:
        y = ctx.emit("Squeeze", [y, ctx.ints(squeeze)])
    if tensor_at is not None:
        p, k, nd, _ = tensor_at
        p -= sum(1 for q in squeeze if q < p)
        if specs[k].dtype == np.bool_:
            if tensor_at[0] + nd != len(spec.shape):
                ctx.fail("a boolean mask index that does not cover the trailing dims")
            if nd > 1:
                y = ctx.emit("Reshape", [y, ctx.ints([0] * p + [-1])])
            mask = ctx.emit("Reshape", [idx[k], ctx.ints([-1])])
            y = ctx.emit("Compress", [y, mask], axis=p)
        else:
            y = ctx.emit("Gather", [y, idx[k]], axis=p)
    if nones:
        y = ctx.emit("Unsqueeze", [y, ctx.ints(nones)])
    if y is x:
        y = ctx.emit("Identity", [x])
    return y


@register_lowering("getitem")
def _getitem(ctx, x, *idx, index):
    return lower_index(ctx, x, list(idx), index)


def _positions(ctx, shape, idx, index):
    """The flat positions x[index] reads in an array of `shape` (int64, index's shape)."""
    if any(isinstance(d, str) for d in shape):
        ctx.fail("writing through an index into a tensor of symbolic shape")
    grid = ctx.const(np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape), "pos")
    ctx.specs[grid] = _spec(shape)
    return lower_index(ctx, grid, list(idx), index)


def _spec(shape):
    from ...ops.registry import Spec
    return Spec(tuple(shape), np.dtype(np.int64))


def _scatter_flat(ctx, base, shape, pos, values, reduction):
    flat = ctx.emit("Reshape", [base, ctx.ints([-1])])
    p = ctx.emit("Reshape", [pos, ctx.ints([-1])])
    v = ctx.emit("Reshape", [ctx.emit("Expand", [values, ctx.emit("Shape", [pos])]),
                             ctx.ints([-1])])
    r = ctx.emit("ScatterElements", [flat, p, v], axis=0, reduction=reduction)
    return ctx.emit("Reshape", [r, ctx.ints(list(shape))])


@register_lowering("getitem_grad")
def _getitem_grad(ctx, g, *idx, index, shape):
    dt = ctx.spec(g).dtype
    zeros = ctx.const(np.zeros(tuple(shape), dt), "zeros")
    pos = _positions(ctx, shape, idx, index)
    return _scatter_flat(ctx, zeros, shape, pos, g, "add")


@register_lowering("setitem")
def _setitem(ctx, x, v, *idx, index):
    from .elementwise import as_dtype
    shape = ctx.spec(x).shape
    pos = _positions(ctx, shape, idx, index)
    return _scatter_flat(ctx, x, shape, pos, as_dtype(ctx, v, ctx.spec(x).dtype), None)
