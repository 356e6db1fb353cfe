"""Shape and indexing primitives: reshape, permute, expand, concat, pad, flip, copy;
getitem (basic and advanced indexing) and setitem (functional) are in getitem.py and
re-exported here.

squeeze/unsqueeze/flatten/transpose/stack/split are functions over these
primitives, so the IR has one spelling for each movement of data."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, op_error
from ..ir.symint import SymInt, as_int
from ..tensor import Tensor, apply
from ._util import Sample, norm_axis, pick, randf, rng, unbroadcast
from .registry import NO_ONNX, Spec, defop


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


# ---------------------------------------------------------------------- reshape
def _resolve_shape(shape, numel, src_shape):
    shape = tuple(shape)
    if -1 in shape:
        if shape.count(-1) > 1:
            raise op_error(ShapeError, "reshape", f"shape {shape}", "at most one -1")
        known = 1
        for d in shape:
            if d != -1:
                known *= d
        if known == 0 or numel % known:
            raise op_error(ShapeError, "reshape", f"a tensor of shape {src_shape} -> {shape}",
                           "a shape with the same number of elements")
        shape = tuple(numel // known if d == -1 else d for d in shape)
    n = 1
    for d in shape:
        n *= d
    if n != numel:
        raise op_error(ShapeError, "reshape", f"a tensor of shape {src_shape} -> {shape}",
                       f"a shape with {numel} elements")
    return shape


def _reshape_rule(x, shape):
    if builtins_all_int(x.shape):
        n = 1
        for d in x.shape:
            n *= d
        return Spec(_resolve_shape(shape, n, x.shape), x.dtype)
    return Spec(tuple(shape), x.dtype)


def builtins_all_int(shape):
    return all(isinstance(d, int) for d in shape)


def _reshape_kernel(a, shape):
    return a.reshape(shape)


RESHAPE = defop("reshape", _reshape_rule, kernel=_reshape_kernel,
                view=True, saves=(), grad=lambda g, y, x, shape: reshape(g, tuple(x.shape)),
                unview=lambda x, v, shape: reshape(v, tuple(x.shape)),
                onnx="Reshape", flops=lambda *a, **k: 0, same_values=True,
                samples=lambda: [Sample((randf(rng(20), 3, 4),), {"shape": (4, 3)}),
                                 Sample((randf(rng(21), 2, 3, 4),), {"shape": (6, 4)}),
                                 Sample((randf(rng(22), 0, 4),), {"shape": (2, 0)})])


def reshape(x, *shape):
    """View with a new shape (one dim may be -1). Example: ``x.reshape(2, -1)``."""
    x = _t(x)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    # as_int and a Python product keep symbolic sizes (SymInt) while tracing with dynamic
    # dims: int() and np.prod would bake the traced size into the program
    shape = tuple(as_int(d) if not isinstance(d, str) else d for d in shape)
    if builtins_all_int(x.shape) and builtins_all_int(shape):
        numel = 1
        for d in x.shape:
            numel *= d
        shape = _resolve_shape(shape, numel, x.shape)
    if tuple(x.shape) == shape:
        return x
    return apply(RESHAPE, (x,), {"shape": shape})


# ---------------------------------------------------------------------- permute
def _permute_rule(x, dims):
    if sorted(dims) != list(range(len(x.shape))):
        raise op_error(ShapeError, "permute", f"dims {dims} for a {len(x.shape)}-d tensor",
                       f"a permutation of 0..{len(x.shape) - 1}")
    return Spec(tuple(x.shape[d] for d in dims), x.dtype)


def _permute_kernel(a, dims):
    return a.transpose(dims)


PERMUTE = defop("permute", _permute_rule, kernel=_permute_kernel, view=True,
                saves=(), grad=lambda g, y, x, dims: permute(g, tuple(np.argsort(dims).tolist())),
                unview=lambda x, v, dims: permute(v, tuple(np.argsort(dims).tolist())),
                onnx="Transpose", flops=lambda *a, **k: 0, same_values=True,
                samples=lambda: [Sample((randf(rng(23), 2, 3, 4),), {"dims": (2, 0, 1)}),
                                 Sample((randf(rng(24), 3, 4),), {"dims": (1, 0)})])


def _dim_range(op, d, ndim, extra=0):
    """`d` as a non-negative dim of a tensor with `ndim` dims (plus `extra` new ones)."""
    n = ndim + extra
    if not isinstance(d, (int, np.integer)) or not -max(n, 1) <= d < max(n, 1):
        raise op_error(ShapeError, op, f"dim {d!r} for a {ndim}-d tensor",
                       f"an int dim in [{-max(n, 1)}, {max(n, 1)})")
    return int(d) % n if n else 0


def permute(x, *dims):
    """Reorder dimensions. Example: ``x.permute(0, 2, 1)`` or ``sampan.permute(x, (0, 2, 1))``."""
    x = _t(x)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = dims[0]
    nd = x.ndim
    dims = tuple(_dim_range("permute", d, nd) for d in dims) if nd else tuple(dims)
    if dims == tuple(range(nd)):
        return x
    return apply(PERMUTE, (x,), {"dims": dims})


def transpose(x, dim0=-2, dim1=-1):
    """Swap two dimensions (also as `swapaxes`/`swapdims`). Example: ``x.transpose(0, 1)``."""
    x = _t(x)
    if x.ndim < 2:
        _dim_range("transpose", dim0, x.ndim)
        _dim_range("transpose", dim1, x.ndim)
        return x
    d = list(range(x.ndim))
    a, b = _dim_range("transpose", dim0, x.ndim), _dim_range("transpose", dim1, x.ndim)
    d[a], d[b] = d[b], d[a]
    return permute(x, tuple(d))


def swapaxes(x, axis0, axis1):
    """numpy's name for `transpose(x, dim0, dim1)`."""
    return transpose(x, axis0, axis1)


def swapdims(x, dim0, dim1):
    """PyTorch's alias of `transpose(x, dim0, dim1)`."""
    return transpose(x, dim0, dim1)


# ---------------------------------------------------------------------- expand
def _expand_rule(x, shape):
    from ._util import broadcast_shapes
    out = broadcast_shapes("expand", x.shape, shape)
    if tuple(out) != tuple(shape):
        raise op_error(ShapeError, "expand", f"shape {tuple(x.shape)} -> {tuple(shape)}",
                       "a target shape the input broadcasts to")
    return Spec(tuple(shape), x.dtype)


def _expand_kernel(a, shape):
    return np.broadcast_to(a, shape)


EXPAND = defop("expand", _expand_rule, kernel=_expand_kernel,
               view=True, saves=(),
               grad=lambda g, y, x, shape: unbroadcast(g, tuple(x.shape)),
               onnx="Expand", flops=lambda *a, **k: 0, same_values=True,
               samples=lambda: [Sample((randf(rng(25), 3, 1),), {"shape": (2, 3, 4)}),
                                Sample((randf(rng(26), 4),), {"shape": (3, 4)})])


def expand(x, *shape):
    """Broadcast to a larger shape without copying (-1 keeps a dim)."""
    x = _t(x)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    lead = len(shape) - x.ndim
    shape = tuple(x.shape[i - lead] if d == -1 else d for i, d in enumerate(shape))
    if tuple(x.shape) == shape:
        return x
    return apply(EXPAND, (x,), {"shape": shape})


broadcast_to = expand


def squeeze(x, dim=None, *, axis=None):
    """Drop size-1 dims: all of them, or those of `dim` (an int or a tuple) that have size
    1 (a listed dim of another size stays, as in PyTorch). Example: ``x.squeeze(-1)``."""
    if axis is not None:
        dim = axis if dim is None else pick("squeeze", "dim", dim, "axis", axis)
    x = _t(x)
    axes = norm_axis(dim, x.ndim, "squeeze") if dim is not None else None
    shape = tuple(d for i, d in enumerate(x.shape)
                  if not (d == 1 and (axes is None or i in axes)))
    return reshape(x, shape)


def unsqueeze(x, dim=None, *, axis=None):
    """Insert a size-1 dim at `dim` (in [-ndim-1, ndim]). Example: ``x.unsqueeze(0)``."""
    if axis is not None:
        dim = axis if dim is None else pick("unsqueeze", "dim", dim, "axis", axis)
    x = _t(x)
    if dim is None:
        raise op_error(ShapeError, "unsqueeze", "no dim", "dim= (or axis=)")
    axis = _dim_range("unsqueeze", dim, x.ndim, 1)
    s = list(x.shape)
    s.insert(axis, 1)
    return reshape(x, tuple(s))


def flatten(x, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim into one. Example: ``x.flatten(1)``."""
    x = _t(x)
    if x.ndim == 0:
        _dim_range("flatten", start_dim, 0)
        _dim_range("flatten", end_dim, 0)
        return reshape(x, (1,))
    s, e = _dim_range("flatten", start_dim, x.ndim), _dim_range("flatten", end_dim, x.ndim)
    if s > e:
        raise op_error(ShapeError, "flatten", f"start_dim {start_dim} after end_dim {end_dim}",
                       "start_dim <= end_dim")
    n = 1
    for d in x.shape[s:e + 1]:
        n *= d
    return reshape(x, tuple(x.shape[:s]) + (n,) + tuple(x.shape[e + 1:]))


# ---------------------------------------------------------------------- concat / split
def _concat_rule(*xs, axis):
    from ._util import same_dtype
    d = same_dtype("concat", *xs)
    base = list(xs[0].shape)
    total = 0
    for x in xs:
        if len(x.shape) != len(base) or any(
                a != b for i, (a, b) in enumerate(zip(x.shape, base)) if i != axis):
            raise op_error(ShapeError, "concat", "shapes " + ", ".join(str(tuple(v.shape))
                                                                       for v in xs),
                           f"equal shapes except along axis {axis}")
        total = total + x.shape[axis] if isinstance(total, int) and isinstance(
            x.shape[axis], int) else f"{total}+{x.shape[axis]}"
    base[axis] = total
    return Spec(tuple(base), d)


def _concat_grad(g, y, *xs, axis):
    out, start = [], 0
    for x in xs:
        n = x.shape[axis]
        out.append(narrow(g, axis, start, n))
        start += n
    return tuple(out)


def _concat_kernel(*a, axis):
    return np.concatenate(a, axis=axis)


CONCAT = defop("concat", _concat_rule, kernel=_concat_kernel,
               saves=(), grad=_concat_grad, onnx="Concat", flops=lambda *a, **k: 0,
               samples=lambda: [Sample((randf(rng(27), 2, 3), randf(rng(28), 4, 3)), {"axis": 0}),
                                Sample((randf(rng(29), 2, 3), randf(rng(30), 2, 1),
                                        randf(rng(31), 2, 2)), {"axis": 1})])


def concat(xs, dim=None, *, axis=None):
    """Join tensors along an existing dim (default 0; also as `cat`).
    Example: ``sampan.cat([a, b], dim=1)``."""
    from .elementwise import cast
    if axis is not None:
        dim = axis if dim is None else pick("concat", "dim", dim, "axis", axis)
    xs = [_t(x) for x in xs]
    if not xs:
        raise op_error(ShapeError, "concat", "no tensors", "a non-empty sequence of tensors")
    ax = _dim_range("concat", 0 if dim is None else dim, xs[0].ndim)
    if len(xs) == 1:
        return xs[0]
    from ..dtypes import promote_types
    d = xs[0].dtype
    for x in xs[1:]:
        d = promote_types(d, x.dtype)
    xs = [x if x.dtype == d else cast(x, d) for x in xs]
    return apply(CONCAT, tuple(xs), {"axis": ax})


cat = concat   # PyTorch's name


# ---------------------------------------------------------------------- pad / flip
def _pad_rule(x, pads, value=0.0):
    if len(pads) != len(x.shape) or any(a < 0 or b < 0 for a, b in pads):
        raise op_error(ShapeError, "pad", f"pads {tuple(pads)} for a {len(x.shape)}-d input",
                       "one (before, after) pair >= 0 per dim (the frontend crops negative "
                       "amounts)")
    return Spec(tuple(d if isinstance(d, str) and not (a or b) else
                      (f"{d}+{a + b}" if isinstance(d, str) else d + a + b)
                      for d, (a, b) in zip(x.shape, pads)), x.dtype)


def _pad_grad(g, y, x, pads, value=0.0):
    idx = tuple(slice(a, a + d) for d, (a, b) in zip(x.shape, pads))
    return (getitem(g, idx),)


PAD = defop("pad", _pad_rule, kernel=lambda a, pads, value=0.0: np.pad(
            a, pads, constant_values=np.asarray(value, a.dtype)), saves=(), grad=_pad_grad,
            onnx="Pad", flops=lambda *a, **k: 0,
            samples=lambda: [Sample((randf(rng(32), 2, 3),), {"pads": ((1, 0), (2, 1)),
                                                              "value": 0.0})])


def pad(x, pad, mode="constant", value=None):
    """PyTorch's `F.pad`: `pad` is last dim first ((left, right, top, bottom, …); negative
    amounts crop) or a per-dim tuple of (before, after) pairs; mode "constant" (with
    `value`), "reflect", "replicate" or "circular" (see `sampan.ops.padding`). A number
    in place of `mode` is the value (sampan's older `pad(x, pad, value)`).

    Example::

        >>> sampan.pad(sampan.ones(2, 3), (1, -1), value=5.0).numpy()[0]
        array([5., 1., 1.], dtype=float32)
    """
    from .padding import pad as _pad_modes
    if not isinstance(mode, str):
        mode, value = "constant", mode
    return _pad_modes(x, pad, mode, value)


FLIP = defop("flip", lambda x, axes: Spec(x.shape, x.dtype),
             kernel=lambda a, axes: np.flip(a, axes), saves=(), view=True,
             grad=lambda g, y, x, axes: flip(g, axes), onnx=NO_ONNX, flops=lambda *a, **k: 0,
             unview=lambda x, v, axes: flip(v, axes),
             samples=lambda: [Sample((randf(rng(33), 2, 3, 4),), {"axes": (0, 2)})])


def flip(x, dims=None, *more, axis=None):
    """Reverse the order of elements along `dims` (an int, a tuple, or several ints as
    the method ``x.flip(0, 1)``). Example: ``sampan.flip(x, dims=(0,))``."""
    if more:
        dims = ((dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)) + more
    if axis is not None:
        dims = axis if dims is None else pick("flip", "dims", dims, "axis", axis)
    x = _t(x)
    if dims is None:
        raise op_error(ShapeError, "flip", "no dims", "dims= (or axis=)")
    if isinstance(dims, (tuple, list)) and not dims:
        return x
    return apply(FLIP, (x,), {"axes": norm_axis(dims, x.ndim, "flip")})


# ---------------------------------------------------------------------- copy
def _copy_kernel(a):
    return a.copy()


COPY = defop("copy", lambda x: Spec(x.shape, x.dtype), kernel=_copy_kernel, saves=(),
             kind="elementwise", fuse="always", scalar="a", grad=lambda g, y, x: g,
             onnx="Identity", same_values=True,
             flops=lambda *a, **k: 0, samples=lambda: [Sample((randf(rng(34), 3, 2),))])


def clone(x):
    """A copy that owns its memory (differentiable)."""
    return apply(COPY, (_t(x),), {})


# getitem, setitem and the index encoding are in getitem.py; their names stay importable here
from .getitem import (  # noqa: E402,F401
    GETITEM, GETITEM_GRAD, SETITEM, _getitem_grad, decode_index, encode_index, format_index,
    getitem, setitem)


# stack, narrow, split and chunk: compositions of the primitives above, in their own module
from .slicing import chunk, narrow, split, stack  # noqa: E402,F401
