"""Import handlers for ONNX's shape ops: Reshape, Transpose, Flatten, Squeeze, Unsqueeze,
Concat, Split, Expand, Tile, Pad, DepthToSpace, SpaceToDepth.

Target shapes, axes, pads and repeats are `ctx.static` values (the importer folds shape
arithmetic, so models exported by PyTorch give static ones); the data itself only ever
flows through sampan ops, so an imported model stays differentiable and traceable.
"""
from __future__ import annotations

import numpy as np

import sampan
from ...ops import padding as _padding
from . import onnx_op


def norm_axis(ctx, axis, rank, what="axis"):
    """`axis` in [-rank, rank) as a non-negative int, or an OnnxError naming it."""
    a = int(axis)
    if not -rank <= a < rank:
        raise ctx.error(f"{what}={a} is out of range for a {rank}-d input "
                        f"(expected [{-rank}, {rank - 1}])")
    return a + rank if a < 0 else a


def norm_axes(ctx, axes, rank, what="axes"):
    out = [norm_axis(ctx, a, rank, what) for a in np.asarray(axes).reshape(-1)]
    if len(set(out)) != len(out):
        raise ctx.error(f"{what}={list(np.asarray(axes).reshape(-1))} repeats an axis")
    return out


def ints(a):
    return [int(v) for v in np.asarray(a).reshape(-1)]


# ---------------------------------------------------------------------- Reshape
def _reshape(ctx, node, x, shape, allowzero=0):
    shape = ints(shape)
    if shape.count(-1) > 1:
        raise ctx.error(f"shape {shape} has more than one -1")
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            if i >= x.ndim:
                raise ctx.error(f"shape {shape} copies dim {i} (a 0) of a {x.ndim}-d input")
            d = x.shape[i]
        elif d < -1:
            raise ctx.error(f"shape {shape} has a negative size {d}")
        out.append(d)
    n = int(np.prod(x.shape))
    if -1 in out:
        rest = int(np.prod([d for d in out if d != -1]))
        if rest == 0 or n % rest:
            raise ctx.error(f"cannot reshape {list(x.shape)} to {shape}: the -1 has no size")
        out[out.index(-1)] = n // rest
    if int(np.prod(out)) != n:
        raise ctx.error(f"cannot reshape {list(x.shape)} ({n} elements) to {shape}")
    return sampan.reshape(x, *out)


@onnx_op("Reshape", since=1)
def reshape_v1(ctx, node, x):
    return _reshape(ctx, node, x, node.attr("shape", []))


@onnx_op("Reshape", since=5)
def reshape_v5(ctx, node, x, shape):
    return _reshape(ctx, node, x, ctx.static(shape, "the target shape"))


@onnx_op("Reshape", since=14)
def reshape_v14(ctx, node, x, shape):
    return _reshape(ctx, node, x, ctx.static(shape, "the target shape"),
                    node.attr("allowzero", 0))


@onnx_op("Transpose", since=1)
def transpose(ctx, node, x):
    perm = node.attr("perm", None)
    perm = list(range(x.ndim))[::-1] if perm is None else norm_axes(ctx, perm, x.ndim, "perm")
    if len(perm) != x.ndim:
        raise ctx.error(f"perm={perm} for a {x.ndim}-d input (expected one entry per dim)")
    return sampan.permute(x, *perm)


@onnx_op("Flatten", since=1)
def flatten(ctx, node, x):
    axis = int(node.attr("axis", 1))
    if not -x.ndim <= axis <= x.ndim:
        raise ctx.error(f"axis={axis} is out of range for a {x.ndim}-d input")
    axis = axis + x.ndim if axis < 0 else axis
    return sampan.reshape(x, int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))


# ---------------------------------------------------------------------- Squeeze / Unsqueeze
def _squeeze(ctx, x, axes):
    if axes is None or len(ints(axes)) == 0:
        keep = [d for d in x.shape if d != 1]
    else:
        ax = norm_axes(ctx, axes, x.ndim)
        for a in ax:
            if x.shape[a] != 1:
                raise ctx.error(f"cannot squeeze axis {a} of size {x.shape[a]} "
                                f"(input shape {list(x.shape)})")
        keep = [d for i, d in enumerate(x.shape) if i not in ax]
    return sampan.reshape(x, *keep)


@onnx_op("Squeeze", since=1)
def squeeze_v1(ctx, node, x):
    return _squeeze(ctx, x, node.attr("axes", None))


@onnx_op("Squeeze", since=13)
def squeeze_v13(ctx, node, x, axes=None):
    return _squeeze(ctx, x, ctx.static(axes, "axes"))


def _unsqueeze(ctx, x, axes):
    axes = ints(axes)
    rank = x.ndim + len(axes)
    ax = norm_axes(ctx, axes, rank)
    dims = iter(x.shape)
    return sampan.reshape(x, *[1 if i in ax else next(dims) for i in range(rank)])


@onnx_op("Unsqueeze", since=1)
def unsqueeze_v1(ctx, node, x):
    return _unsqueeze(ctx, x, node.attr("axes", []))


@onnx_op("Unsqueeze", since=13)
def unsqueeze_v13(ctx, node, x, axes):
    return _unsqueeze(ctx, x, ctx.static(axes, "axes"))


# ---------------------------------------------------------------------- Concat / Split
@onnx_op("Concat", since=1)
def concat(ctx, node, *xs):
    xs = [x for x in xs if x is not None]
    axis = node.attr("axis", 1 if ctx.opset < 4 else None)
    if axis is None:
        raise ctx.error("needs the axis attribute")
    axis = norm_axis(ctx, axis, xs[0].ndim)
    for x in xs[1:]:
        if x.ndim != xs[0].ndim or x.dtype != xs[0].dtype:
            raise ctx.error(f"inputs {[(list(t.shape), str(t.dtype)) for t in xs]} differ "
                            "in rank or dtype (expected equal ranks and one dtype)")
    if len(xs) == 1:
        return xs[0]
    return sampan.concat(xs, axis)


def _split(ctx, node, x, split, num_outputs=None):
    axis = norm_axis(ctx, node.attr("axis", 0), x.ndim)
    n = x.shape[axis]
    if split is not None and len(ints(split)):
        sizes = ints(split)
        if sum(sizes) != n or min(sizes) < 0:
            raise ctx.error(f"split {sizes} does not add up to the axis size {n}")
    else:
        k = num_outputs if num_outputs is not None else node.n_outputs
        if num_outputs is not None:
            size = -(-n // k)
            sizes = [size] * (n // size) + ([n % size] if n % size else [])
            if len(sizes) != k:
                raise ctx.error(f"num_outputs={k} cannot split an axis of size {n}")
        else:
            if n % k:
                raise ctx.error(f"cannot split an axis of size {n} into {k} equal parts")
            sizes = [n // k] * k
    if len(sizes) != node.n_outputs:
        raise ctx.error(f"{len(sizes)} parts for {node.n_outputs} outputs")
    if len(sizes) == 1:
        return (x,)
    return tuple(sampan.split(x, sizes, axis))


@onnx_op("Split", since=1)
def split_v1(ctx, node, x, split=None):
    s = ctx.static(split, "split") if split is not None else node.attr("split", None)
    return _split(ctx, node, x, s)


@onnx_op("Split", since=2)
def split_v2(ctx, node, x):
    return _split(ctx, node, x, node.attr("split", None))


@onnx_op("Split", since=13)
def split_v13(ctx, node, x, split=None):
    return _split(ctx, node, x, ctx.static(split, "split"))


@onnx_op("Split", since=18)
def split_v18(ctx, node, x, split=None):
    num = node.attr("num_outputs", None)
    if (split is None) == (num is None):
        raise ctx.error("needs exactly one of the split input and the num_outputs attribute")
    return _split(ctx, node, x, ctx.static(split, "split"), num)


# ---------------------------------------------------------------------- Expand / Tile
@onnx_op("Expand", since=8)
def expand(ctx, node, x, shape):
    shape = ints(ctx.static(shape, "the target shape"))
    try:
        out = np.broadcast_shapes(tuple(x.shape), tuple(shape))
    except ValueError:
        raise ctx.error(f"input shape {list(x.shape)} does not broadcast with {shape}") \
            from None
    if tuple(out) == tuple(x.shape):
        return x
    return sampan.broadcast_to(x, out)


@onnx_op("Tile", since=6)
def tile(ctx, node, x, repeats):
    reps = ints(ctx.static(repeats, "repeats"))
    if len(reps) != x.ndim or min(reps, default=0) < 0:
        raise ctx.error(f"repeats {reps} for a {x.ndim}-d input (expected {x.ndim} "
                        "non-negative counts)")
    return sampan.tile(x, tuple(reps))


# ---------------------------------------------------------------------- Pad
_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate",
          "wrap": "circular"}


def _pad(ctx, node, x, pads, value, axes=None, mode="constant"):
    pads = ints(pads)
    axes = list(range(x.ndim)) if axes is None else norm_axes(ctx, axes, x.ndim)
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} for {len(axes)} axes (expected 2 * {len(axes)} "
                        "amounts: all begins, then all ends)")
    if mode not in _MODES:
        raise ctx.error(f"mode={mode!r} (expected one of {', '.join(_MODES)})")
    pairs = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        pairs[a] = (pads[i], pads[i + len(axes)])
    if not any(a or b for a, b in pairs):
        return x
    if mode == "constant":
        if value is None or ctx.is_static(value) or not isinstance(value, sampan.Tensor):
            v = 0.0 if value is None else ctx.static(value, "constant_value") \
                if isinstance(value, sampan.Tensor) else value
            v = np.asarray(v).reshape(-1)
            return sampan.pad(x, tuple(pairs), value=v[0].item() if v.size else 0.0)
        # a value computed from data: pad with zeros, add it where the padding is
        grown = [(max(a, 0), max(b, 0)) for a, b in pairs]
        big = [n + a + b for n, (a, b) in zip(x.shape, grown)]
        x0 = sampan.pad(x, tuple(pairs), value=0.0)
        sl = tuple(slice(max(-a, 0), big[d] - max(-b, 0)) for d, (a, b) in enumerate(pairs))
        if ctx.foldable(big, np.bool_):
            mask = np.pad(np.zeros(x.shape, bool), grown, constant_values=True)
            m = sampan.tensor(mask[sl])
        else:   # too large to make at import: made when the program runs
            m = sampan.pad(sampan.zeros(*x.shape, dtype=sampan.float32), tuple(grown),
                           value=1.0)[sl] > 0.5
        # where, not x0 + m * value: a value of -inf would give 0 * -inf = nan inside
        return sampan.where(m, sampan.reshape(value, *([1] * x.ndim)), x0)
    fn = {"reflect": _padding.pad_reflect, "replicate": _padding.pad_replicate,
          "circular": _padding.pad_circular}[_MODES[mode]]
    return fn(x, tuple(pairs))


@onnx_op("Pad", since=1)
def pad_v1(ctx, node, x):
    return _pad(ctx, node, x, node.attr("paddings", []), node.attr("value", 0.0),
                mode=node.attr("mode", "constant"))


@onnx_op("Pad", since=2)
def pad_v2(ctx, node, x):
    return _pad(ctx, node, x, node.attr("pads", []), node.attr("value", 0.0),
                mode=node.attr("mode", "constant"))


@onnx_op("Pad", since=11)
def pad_v11(ctx, node, x, pads, value=None, axes=None):
    axes = None if axes is None else ctx.static(axes, "axes")
    return _pad(ctx, node, x, ctx.static(pads, "pads"), value, axes,
                node.attr("mode", "constant"))


# ---------------------------------------------------------------------- depth <-> space
@onnx_op("DepthToSpace", since=1)
def depth_to_space(ctx, node, x):
    b = int(node.attr("blocksize"))
    mode = node.attr("mode", "DCR")
    if x.ndim != 4 or x.shape[1] % (b * b):
        raise ctx.error(f"input {list(x.shape)} (expected N, C, H, W with C divisible by "
                        f"blocksize**2 = {b * b})")
    n, c, h, w = x.shape
    if mode == "DCR":
        y = sampan.permute(sampan.reshape(x, n, b, b, c // (b * b), h, w), 0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        y = sampan.permute(sampan.reshape(x, n, c // (b * b), b, b, h, w), 0, 1, 4, 2, 5, 3)
    else:
        raise ctx.error(f"mode={mode!r} (expected 'DCR' or 'CRD')")
    return sampan.reshape(y, n, c // (b * b), h * b, w * b)


@onnx_op("SpaceToDepth", since=1)
def space_to_depth(ctx, node, x):
    b = int(node.attr("blocksize"))
    if x.ndim != 4 or x.shape[2] % b or x.shape[3] % b:
        raise ctx.error(f"input {list(x.shape)} (expected N, C, H, W with H and W divisible "
                        f"by blocksize {b})")
    n, c, h, w = x.shape
    y = sampan.reshape(x, n, c, h // b, b, w // b, b)
    mode = node.attr("mode", "DCR")       # an attribute from opset 28 on; DCR before
    if mode == "DCR":
        y = sampan.permute(y, 0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        y = sampan.permute(y, 0, 1, 3, 5, 2, 4)
    else:
        raise ctx.error(f"mode={mode!r} (expected 'DCR' or 'CRD')")
    return sampan.reshape(y, n, c * b * b, h // b, w // b)
