"""Shape and indexing primitives: reshape, permute, expand, concat, pad, flip,
getitem (basic and advanced indexing), setitem (functional), copy.

squeeze/unsqueeze/flatten/transpose/stack/split are functions over these
primitives, so the IR has one spelling for each movement of data."""
from __future__ import annotations

import numpy as np

from ..errors import SampanIndexError, ShapeError, op_error
from ..ir.symint import SymInt, as_int, deciding, is_symbolic
from ..tensor import Tensor, apply, mark_view
from ._util import Sample, norm_axis, pick, randf, rng, unbroadcast
from .registry import NO_ONNX, STATE, Spec, defop


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


RESHAPE = defop("reshape", _reshape_rule, kernel=lambda a, shape: a.reshape(shape),
                view=True, saves=(), grad=lambda g, y, x, shape: reshape(g, tuple(x.shape)),
                unview=lambda x, v, shape: reshape(v, tuple(x.shape)),
                onnx="Reshape", flops=lambda *a, **k: 0,
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


PERMUTE = defop("permute", _permute_rule, kernel=lambda a, dims: a.transpose(dims), view=True,
                saves=(), grad=lambda g, y, x, dims: permute(g, tuple(np.argsort(dims).tolist())),
                unview=lambda x, v, dims: permute(v, tuple(np.argsort(dims).tolist())),
                onnx="Transpose", flops=lambda *a, **k: 0,
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


EXPAND = defop("expand", _expand_rule, kernel=lambda a, shape: np.broadcast_to(a, shape),
               view=True, saves=(),
               grad=lambda g, y, x, shape: unbroadcast(g, tuple(x.shape)),
               onnx="Expand", flops=lambda *a, **k: 0,
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


CONCAT = defop("concat", _concat_rule, kernel=lambda *a, axis: np.concatenate(a, axis=axis),
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
COPY = defop("copy", lambda x: Spec(x.shape, x.dtype), kernel=lambda a: a.copy(), saves=(),
             kind="elementwise", fuse="always", scalar="a", grad=lambda g, y, x: g,
             onnx="Identity",
             flops=lambda *a, **k: 0, samples=lambda: [Sample((randf(rng(34), 3, 2),))])


def clone(x):
    """A copy that owns its memory (differentiable)."""
    return apply(COPY, (_t(x),), {})


# ---------------------------------------------------------------------- indexing
def encode_index(idx):
    """Turn a Python index into plain data plus a list of index tensors.

    Items: ("s", start, stop, step) slice, ("i", k) int, ("n",) None, ("e",) Ellipsis,
    ("t", k) the k-th index tensor."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    enc, tensors = [], []
    for it in idx:
        if isinstance(it, slice):
            enc.append(("s", _int_or_none(it.start), _int_or_none(it.stop),
                        _int_or_none(it.step)))
        elif it is None:
            enc.append(("n",))
        elif it is Ellipsis:
            enc.append(("e",))
        elif isinstance(it, (bool, np.bool_)):
            tensors.append(Tensor(np.asarray(it)))
            enc.append(("t", len(tensors) - 1))
        elif isinstance(it, (int, np.integer)):
            enc.append(("i", as_int(it)))
        else:
            t = it if isinstance(it, Tensor) else Tensor(np.asarray(it))
            tensors.append(t)
            enc.append(("t", len(tensors) - 1))
    return tuple(enc), tensors


def _int_or_none(v):
    return None if v is None else as_int(v)


def decode_index(enc, arrays):
    out = []
    for it in enc:
        k = it[0]
        if k == "s":
            out.append(slice(it[1], it[2], it[3]))
        elif k == "i":
            out.append(it[1])
        elif k == "n":
            out.append(None)
        elif k == "e":
            out.append(Ellipsis)
        else:
            out.append(arrays[it[1]])
    return tuple(out)


def format_index(enc, arrays=()) -> str:
    """The user's spelling of an encoded index, e.g. ``[1:3, None, <i64[2] tensor>]``: for
    messages (the encoding itself is internal)."""
    from ..dtypes import short_name
    parts = []
    for it in enc:
        k = it[0]
        if k == "s":
            a, b, c = ("" if v is None else str(v) for v in it[1:])
            parts.append(f"{a}:{b}" + (f":{c}" if c else ""))
        elif k == "i":
            parts.append(str(it[1]))
        elif k == "n":
            parts.append("None")
        elif k == "e":
            parts.append("...")
        elif it[1] < len(arrays):
            t = arrays[it[1]]
            parts.append(f"<{short_name(t.dtype)}{list(t.shape)} tensor>")
        else:
            parts.append("<tensor>")
    return "[" + ", ".join(parts) + "]"


def _index_error(op, enc, arrays, shape, exc):
    """An out-of-range (or mismatched) index as the user wrote it: SampanIndexError,
    an IndexError like numpy's and PyTorch's."""
    return op_error(SampanIndexError, op, f"index {format_index(enc, arrays)} into a tensor "
                    f"of shape {tuple(shape)}",
                    "an index that fits the shape (each within its dim)", str(exc))


def _abstract(spec):
    """A zero-strided array of `spec`'s shape: lets numpy compute index shapes for free."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, spec.dtype), tuple(spec.shape),
                                           (0,) * len(spec.shape))


def _getitem_rule(x, *idx, index):
    try:
        r = _abstract(x)[decode_index(index, [_abstract(i) for i in idx])]
    except IndexError as e:
        raise _index_error("getitem", index, idx, x.shape, e) from None
    shape = tuple(np.shape(r))
    if any(i.dtype == np.bool_ and len(i.shape) > 0 for i in idx):
        # a boolean mask selects a data-dependent number of elements: a symbolic dim
        masked = [i for i in idx if i.dtype == np.bool_ and len(i.shape) > 0][0]
        pos = next(k for k, e in enumerate(index) if e[0] == "t" and idx[e[1]] is masked)
        lead = sum(1 for e in index[:pos] if e[0] == "s") + sum(
            len(x.shape) - len([e for e in index if e[0] in "sit"]) for e in index[:pos]
            if e[0] == "e")
        shape = shape[:lead] + ("nnz",) + shape[lead + 1:]
    return Spec(shape, x.dtype)


def _getitem_kernel(a, *idx, index):
    key = decode_index(index, idx)
    try:
        r = a[key]
    except IndexError as e:   # index values (the rule sees only their shapes)
        raise _index_error("getitem", index, idx, a.shape, e) from None
    if type(r) is not np.ndarray:   # one element: a 0-d view (as torch), not a numpy scalar
        r = a[key + (Ellipsis,)]
    return r


def _getitem_grad(g, y, x, *idx, index):
    if (not idx and STATE.tracer is None and not STATE.grad_enabled and type(g) is Tensor
            and g._data.dtype == x._data.dtype):
        # eager backward: a pending slice the engine merges with the other slices of x
        from ..autograd.engine import SliceGrads
        part = (decode_index(index, ()), g._data)
        return (SliceGrads(tuple(x.shape), g._data.dtype, [part]),)
    return (apply(GETITEM_GRAD, (g,) + tuple(idx), {"index": index, "shape": tuple(x.shape)}),
            ) + (None,) * len(idx)


def _getitem_samples():
    r = rng(35)
    x = randf(r, 4, 5)
    return [Sample((x,), {"index": (("i", 1),)}),
            Sample((x,), {"index": (("s", 1, None, 2), ("s", None, -1, None))}),
            Sample((x, np.array([0, 2, 2])), {"index": (("t", 0),)}, diff=(0,)),
            Sample((randf(r, 2, 3, 4),), {"index": (("e",), ("n",), ("i", -1))}),
            Sample((x, x > 0), {"index": (("t", 0),)}, diff=(0,))]


def _getitem_unview(x, v, *idx, index):
    return apply(SETITEM, (x, v) + tuple(idx), {"index": index})


GETITEM = defop("getitem", _getitem_rule, kernel=_getitem_kernel, grad=_getitem_grad,
                saves=(), onnx="Slice", flops=lambda *a, **k: 0, samples=_getitem_samples,
                unview=_getitem_unview)


def _getitem_grad_kernel(g, *idx, index, shape):
    out = np.zeros(shape, g.dtype)
    try:
        if not idx:  # basic indexing selects each element at most once: a plain store
            out[decode_index(index, idx)] = g
        else:        # integer arrays may repeat an index: accumulate
            np.add.at(out, decode_index(index, idx), g)
    except IndexError as e:
        raise _index_error("getitem_grad", index, idx, shape, e) from None
    return out


GETITEM_GRAD = defop(
    "getitem_grad", lambda g, *idx, index, shape: Spec(tuple(shape), g.dtype),
    kernel=_getitem_grad_kernel, saves=(), onnx="ScatterND", flops=lambda *a, **k: 0,
    grad=lambda gg, y, g, *idx, index, shape: (apply(GETITEM, (gg,) + tuple(idx),
                                                     {"index": index}),) + (None,) * len(idx),
    samples=lambda: [Sample((randf(rng(36), 3), np.array([0, 2, 0])),
                            {"index": (("t", 0),), "shape": (4,)}, diff=(0,))])


def getitem(x, idx):
    """``x[idx]`` with basic and advanced (integer/bool tensor) indexing."""
    x = _t(x)
    enc, tensors = encode_index(idx)
    view = all(e[0] != "t" for e in enc)     # basic indexing: a view (as in numpy, torch)
    attrs = {"index": enc}
    out = apply(GETITEM, (x,) + tuple(tensors), attrs)
    tr = STATE.tracer
    if tr is not None and tr.env is not None and not tensors:
        _symbolic_slices(out._data, tuple(x.shape), enc)
    if view and (not isinstance(out._data, np.ndarray) or out._data.base is not None):
        mark_view(out, x, GETITEM, attrs)
    return out


def _slice_extent(start, stop, step, n):
    """The length of ``range(n)[start:stop:step]`` as Python computes it, written with
    comparisons so that symbolic sizes (SymInt) record the decisions as guards."""
    step = 1 if step is None else step
    if step < 0:
        lo, hi = -1, n - 1
    else:
        lo, hi = 0, n

    def norm(v, default):
        if v is None:
            return default
        if v < 0:
            v = v + n
            return lo if v < lo else v
        return hi if v > hi else v
    a, b = norm(start, hi if step < 0 else lo), norm(stop, lo if step < 0 else hi)
    span = (a - b) if step < 0 else (b - a)
    if span <= 0:
        return 0
    k = -step if step < 0 else step
    return (span + k - 1) // k


def _symbolic_slices(v, shape, enc):
    """While jit traces dynamic dims: give the result `v` of ``x[enc]`` its symbolic
    extents (``x[1:]`` of a batch is ``batch-1`` long, ``w[:seq]`` is ``seq``) and record
    how the slices were clamped as guards (``w[:seq]`` assumes seq <= len(w))."""
    if not any(isinstance(d, SymInt) for d in shape) and not is_symbolic(enc):
        return
    n_dims = sum(1 for e in enc if e[0] in "si")
    out, d = [], 0
    for e in enc:
        k = e[0]
        if k == "e":
            for _ in range(len(shape) - n_dims):
                out.append(shape[d])
                d += 1
        elif k == "n":
            out.append(1)
        elif k == "i":
            i = e[1]
            if isinstance(i, SymInt):
                with deciding():     # whether numpy counts from the end: a guard
                    _ = i < 0
            d += 1
        else:
            with deciding():
                out.append(_slice_extent(e[1], e[2], e[3], shape[d]))
            d += 1
    out += list(shape[d:])
    if len(out) == len(v.shape) and all(int(a) == int(b) for a, b in zip(out, v.shape)):
        v.shape = tuple(out)


def _setitem_rule(x, v, *idx, index):
    # the value must broadcast to the selected part (leading 1s dropped, as numpy and
    # torch do): checked here, so a traced setitem fails at trace time with the user's
    # line, not in the generated code with numpy's message
    part = _getitem_rule(x, *idx, index=index).shape
    vs = tuple(v.shape)
    while len(vs) > len(part) and vs[0] == 1:
        vs = vs[1:]
    if len(vs) > len(part) or any(a != 1 and a != b for a, b in zip(vs[::-1], part[::-1])
                                  if isinstance(a, int) and isinstance(b, int)):
        raise op_error(ShapeError, "setitem", f"a value of shape {tuple(v.shape)} for "
                       f"{format_index(index, idx)} (a part of shape {part}) of a tensor of "
                       f"shape {tuple(x.shape)}", "a value that broadcasts to the part")
    return Spec(x.shape, x.dtype)


def _setitem_kernel(a, v, *idx, index):
    out = a.copy()
    try:
        out[decode_index(index, idx)] = v
    except IndexError as e:
        raise _index_error("setitem", index, idx, a.shape, e) from None
    return out


def _setitem_grad(g, y, x, v, *idx, index):
    from .elementwise import zeros_like_
    gx = apply(SETITEM, (g, zeros_like_(v)) + tuple(idx), {"index": index})
    gv = apply(GETITEM, (g,) + tuple(idx), {"index": index})
    # a value with more leading 1s than the part (x[:, 0] = v, v of shape (1, 1, 2) for
    # a part (1, 2)): the gradient of the part, reshaped to the value's shape
    vs = tuple(v.shape)
    k = 0
    while len(vs) - k > len(gv.shape) and vs[k] == 1:
        k += 1
    gv = unbroadcast(gv, vs[k:])
    if k:
        gv = reshape(gv, vs)
    return (gx, gv) + (None,) * len(idx)


SETITEM = defop("setitem", _setitem_rule, kernel=_setitem_kernel, grad=_setitem_grad, saves=(),
                onnx="ScatterND", flops=lambda *a, **k: 0,
                samples=lambda: [Sample((randf(rng(37), 4, 3), randf(rng(38), 3)),
                                        {"index": (("i", 1),)}),
                                 Sample((randf(rng(39), 4, 3), randf(rng(40), 2, 1)),
                                        {"index": (("s", 1, 3, None),)})])


def setitem(x, idx, value):
    """Functional ``x[idx] = value``: returns a new tensor (the in-place form is Tensor's)."""
    from .elementwise import cast
    x = _t(x)
    enc, tensors = encode_index(idx)
    v = _t(value) if isinstance(value, Tensor) else Tensor(np.asarray(value, x.dtype))
    if v.dtype != x.dtype:
        v = cast(v, x.dtype)
    return apply(SETITEM, (x, v) + tuple(tensors), {"index": enc})


# stack, narrow, split and chunk: compositions of the primitives above, in their own module
from .slicing import chunk, narrow, split, stack  # noqa: E402,F401
