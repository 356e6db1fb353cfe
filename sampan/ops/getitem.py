"""getitem (basic and advanced indexing) and setitem (functional), with the index encoding
the IR carries for them (encode_index / decode_index / format_index). The other data
movements are in `shape`, which re-exports everything here."""
from __future__ import annotations

import numpy as np

from ..errors import SampanIndexError, ShapeError, op_error
from ..ir.symint import SymInt, as_int, deciding, is_symbolic
from ..tensor import Tensor, apply, mark_view
from ._util import Sample, randf, rng, unbroadcast
from .registry import STATE, Spec, defop
from .shape import _t, reshape


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
    r = a[key]      # an IndexError of index values: `_getitem_error` words it
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


def _getitem_error(exc, arrays, attrs):
    """getitem's kernel failed on index values (the rule sees only their shapes)."""
    if isinstance(exc, IndexError):
        return _index_error("getitem", attrs["index"], arrays[1:], arrays[0].shape, exc)
    return None


GETITEM = defop("getitem", _getitem_rule, kernel=_getitem_kernel, grad=_getitem_grad,
                kernel_error=_getitem_error,
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
