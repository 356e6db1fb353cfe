"""Layout ops with no ONNX op of their own: diagonal and diag_embed as Gathers over the
flattened pair of dims (the positions are constants), roll as two Slices and a Concat,
triu_gather / pair_dots (the pairwise interactions of recommendation models) as a
Gather of the strict upper triangle."""
from __future__ import annotations

import numpy as np

from ._register import register_lowering


def _static(ctx, dims, what):
    if any(not isinstance(d, int) for d in dims):
        ctx.fail(f"{what} of symbolic size")
    return [int(d) for d in dims]


def _to_end(nd, a, b):
    return [d for d in range(nd) if d not in (a, b)] + [a, b]


@register_lowering("diagonal")
def _diagonal(ctx, x, *, offset=0, dim1=0, dim2=1):
    shape = ctx.spec(x).shape
    nd = len(shape)
    a, b = dim1 % nd, dim2 % nd
    n, m = _static(ctx, [shape[a], shape[b]], "diagonal of dims")
    t = ctx.emit("Transpose", [x], perm=_to_end(nd, a, b))
    t = ctx.emit("Reshape", [t, ctx.ints([0] * (nd - 2) + [n * m])])
    rows = np.arange(max(0, -offset), min(n, m - offset)) if min(n, m - offset) > max(
        0, -offset) else np.zeros(0, np.int64)
    pos = (rows * m + rows + offset).astype(np.int64)
    return ctx.emit("Gather", [t, ctx.const(pos, "diag")], axis=nd - 2)


@register_lowering("diag_embed")
def _diag_embed(ctx, x, *, offset=0, dim1=-2, dim2=-1, size=None):
    shape = ctx.spec(x).shape
    (length,) = _static(ctx, shape[-1:], "diag_embed of a last dim")
    out = ctx.out[0].shape
    nd = len(out)
    a, b = dim1 % nd, dim2 % nd
    n, m = _static(ctx, [out[a], out[b]], "diag_embed into dims")
    # one zero column after x's last dim: positions off the diagonal read it
    lead = ctx.emit("Shape", [x], start=0, end=len(shape) - 1)
    zero = ctx.emit("Expand", [ctx.scalar(0, ctx.spec(x).dtype),
                               ctx.emit("Concat", [lead, ctx.ints([1])], axis=0)])
    xz = ctx.emit("Concat", [x, zero], axis=-1)
    pos = np.full(n * m, length, np.int64)
    for i in range(length):
        r, c = (i, i + offset) if offset >= 0 else (i - offset, i)
        if r < n and c < m:
            pos[r * m + c] = i
    y = ctx.emit("Gather", [xz, ctx.const(pos, "diag")], axis=len(shape) - 1)
    y = ctx.emit("Reshape", [y, ctx.ints([0] * (len(shape) - 1) + [n, m])])
    perm = _to_end(nd, a, b)           # y's dims are (other dims..., a, b): put them back
    inv = [perm.index(d) for d in range(nd)]
    return y if inv == list(range(nd)) else ctx.emit("Transpose", [y], perm=inv)


@register_lowering("roll")
def _roll(ctx, x, *, shifts, dims=None):
    shape = ctx.spec(x).shape
    y = x
    if dims is None:
        y = ctx.emit("Reshape", [x, ctx.ints([-1])])
        (total,) = _static(ctx, [int(np.prod(_static(ctx, shape, "roll")))], "roll")
        sizes, dims = [total], (0,)
    else:
        sizes = _static(ctx, [shape[d] for d in dims], "roll along dims")
    for s, d, n in zip(shifts, dims, sizes):
        k = s % n if n else 0
        if k == 0:
            continue
        head = ctx.emit("Slice", [y, ctx.ints([n - k]), ctx.ints([n]), ctx.ints([d])])
        tail = ctx.emit("Slice", [y, ctx.ints([0]), ctx.ints([n - k]), ctx.ints([d])])
        y = ctx.emit("Concat", [head, tail], axis=int(d))
    if ctx.spec(x).shape != () and y is not x and len(shape) != 1 and dims == (0,) and \
            len(sizes) == 1 and sizes[0] != shape[0]:
        y = ctx.emit("Reshape", [y, ctx.ints(list(shape))])
    return y if y is not x else ctx.emit("Identity", [x])


def _triu_pairs(k):
    i, j = np.triu_indices(k, 1)
    return (i * k + j).astype(np.int64)


@register_lowering("triu_gather")
def _triu_gather(ctx, z):
    (k,) = _static(ctx, ctx.spec(z).shape[1:2], "triu_gather")
    flat = ctx.emit("Reshape", [z, ctx.ints([0, k * k])])
    return ctx.emit("Gather", [flat, ctx.const(_triu_pairs(k), "triu")], axis=1)


@register_lowering("pair_dots")
def _pair_dots(ctx, t):
    (k,) = _static(ctx, ctx.spec(t).shape[1:2], "pair_dots")
    z = ctx.emit("MatMul", [t, ctx.emit("Transpose", [t], perm=[0, 2, 1])])
    flat = ctx.emit("Reshape", [z, ctx.ints([0, k * k])])
    return ctx.emit("Gather", [flat, ctx.const(_triu_pairs(k), "triu")], axis=1)
