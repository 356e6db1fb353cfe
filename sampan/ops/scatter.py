"""(issue 17) Scatter and masked ops: scatter (assignment), scatter_reduce, masked_select,
masked_scatter (primitives), and masked_fill, index_copy, index_fill, take_along_dim,
count_nonzero (composites over them). The data-dependent ops (nonzero, unique, bincount …)
live in `_datadep.py`; gather/scatter_add/index_add/index_select in `index.py`.

`EXPORTS` lists the functions exported as `sampan.<name>`, `METHODS` the Tensor methods and
`INPLACE` the in-place methods (bound by `sampan/_tensor_methods.py`).

Index inputs are range-checked in every kernel before numpy indexes with them (negative
entries are errors, as in PyTorch, rather than numpy's wrap-around)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor, apply
from . import _datadep
from ._util import Sample, pick, randf, rng
from .composite import COMPOSITES
from .index import (_check_index, _gather_index, _gather_shapes, _need_dim, gather,
                    index_add, index_select, scatter_add, take_along_axis)
from .registry import NO_ONNX, Spec, defop


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _zflops(*a, **k):
    return 0


# ---------------------------------------------------------------------- scatter (assign)
def _scatter_rule(x, idx, src, axis):
    _gather_shapes("scatter", x, idx, axis, src)
    if src.dtype != x.dtype:
        raise op_error(DTypeError, "scatter", f"input {x.dtype} and source {src.dtype}",
                       "one dtype")
    return Spec(tuple(x.shape), x.dtype)


def _scatter_kernel(a, i, src, axis):
    out = a.copy()
    out[_gather_index("scatter", a, i, axis, src)] = src
    return out


def _scatter_grad(g, y, x, i, src, axis):
    from .creation import zeros_like
    return scatter(g, axis, i, zeros_like(src)), None, take_along_axis(g, i, axis)


def _scatter_samples():
    r = rng(146)
    return [Sample((randf(r, 3, 4), np.array([[0, 3], [1, 2], [2, 0]]), randf(r, 3, 2)),
                   {"axis": 1}, diff=(0, 2)),
            Sample((randf(r, 4, 3), np.array([[3, 1, 0], [1, 3, 2]]), randf(r, 2, 3)),
                   {"axis": 0}, diff=(0, 2))]


SCATTER = defop("scatter", _scatter_rule, kernel=_scatter_kernel, grad=_scatter_grad,
                saves=(1,), nondiff_inputs=(1,), onnx="ScatterElements", flops=_zflops,
                samples=_scatter_samples)


# ---------------------------------------------------------------------- scatter_reduce
_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _sr_rule(x, idx, src, axis, reduce, include_self):
    _gather_shapes("scatter_reduce", x, idx, axis, src)
    if reduce not in _REDUCES:
        raise op_error(SampanValueError, "scatter_reduce", f"reduce={reduce!r}",
                       "one of " + ", ".join(_REDUCES))
    if src.dtype != x.dtype:
        raise op_error(DTypeError, "scatter_reduce", f"input {x.dtype} and source "
                       f"{src.dtype}", "one dtype")
    return Spec(tuple(x.shape), x.dtype)


def _identity(reduce, dtype):
    """The value a scattered place starts from when the input takes no part."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype == np.bool_:
        return reduce == "amin"
    if dtype.kind == "f":
        return -np.inf if reduce == "amax" else np.inf
    return np.iinfo(dtype).min if reduce == "amax" else np.iinfo(dtype).max


_UFUNC = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum,
          "amin": np.minimum}


def _sr_kernel(a, i, src, axis, reduce, include_self):
    key = _gather_index("scatter_reduce", a, i, axis, src)
    low = a.dtype == _dt.bfloat16 or a.dtype == np.float16
    out = a.astype(np.float32) if low else a.copy()
    if not include_self:
        out[key] = _identity(reduce, out.dtype)
    _UFUNC[reduce].at(out, key, src.astype(out.dtype) if low else src)
    if reduce == "mean":
        n = np.zeros(a.shape, np.int64)
        np.add.at(n, key, 1)
        n = np.maximum(n + bool(include_self), 1)
        out = (out // n if out.dtype.kind in "iu" else out / n).astype(out.dtype)
    return out.astype(a.dtype) if low else out


def _sr_grad(g, y, x, i, src, axis, reduce, include_self):
    from .creation import full_like, ones_like, zeros_like
    from .elementwise import cast, div, eq, logical_and, mul, where

    def gat(t):
        return take_along_axis(t, i, axis)
    if reduce == "sum":
        gx, gs = g, gat(g)
    elif reduce == "mean":
        n = scatter_add(full_like(g, 1.0 if include_self else 0.0), i, ones_like(src), axis)
        n = where(eq(n, 0.0), 1.0, n)
        gx, gs = div(g, n), div(gat(g), gat(n))
    elif reduce in ("amax", "amin"):
        d = _dt.dtype_name(x.dtype)
        self_is = cast(eq(x, y), d)
        src_is = cast(eq(src, gat(y)), d)
        share = div(g, scatter_add(self_is, i, src_is, axis))   # ties share the gradient
        gx, gs = mul(self_is, share), mul(src_is, gat(share))
    else:   # prod: the products of the others, without dividing by a zero
        xz = where(eq(x, 0.0), 1.0, x)
        gx = div(mul(g, scatter_reduce(xz, axis, i, src, "prod", include_self=include_self)),
                 xz)
        zero = eq(src, 0.0)
        nzero = gat(scatter_add(zeros_like(x), i, cast(zero, _dt.dtype_name(x.dtype)), axis))
        single = logical_and(zero, eq(nzero, 1.0))
        others = scatter_reduce(x, axis, i, where(single, 1.0, src), "prod",
                                include_self=include_self)
        gs = where(single, gat(mul(g, others)), div(gat(mul(g, y)), where(zero, 1.0, src)))
    if not include_self:   # the input's values at scattered places were not used
        gx = scatter(gx, axis, i, zeros_like(src))
    return gx, None, gs


def _sr_samples():
    r = rng(147)
    x, s = randf(r, 3, 4), randf(r, 3, 3)
    i = np.array([[0, 0, 3], [1, 1, 1], [2, 0, 2]])   # duplicates
    return [Sample((x, i, s), {"axis": 1, "reduce": "mean", "include_self": True},
                   diff=(0, 2)),
            Sample((x, i, s), {"axis": 1, "reduce": "amax", "include_self": False},
                   diff=(0, 2))]


SCATTER_REDUCE = defop("scatter_reduce", _sr_rule, kernel=_sr_kernel, grad=_sr_grad,
                       save_output=True, nondiff_inputs=(1,), onnx="ScatterElements",
                       flops=lambda x, i, s, **k: int(np.prod([d for d in s.shape
                                                               if isinstance(d, int)])),
                       samples=_sr_samples)


# ---------------------------------------------------------------------- masked_select
def _mask_rule(op, x, mask):
    if mask.dtype != np.bool_:
        raise op_error(DTypeError, op, f"mask dtype {mask.dtype}", "a bool mask")
    if tuple(mask.shape) != tuple(x.shape):
        raise op_error(ShapeError, op, f"input {tuple(x.shape)} and mask {tuple(mask.shape)}",
                       "a mask of the input's shape (the frontend broadcasts)")


def _ms_rule(x, mask):
    _mask_rule("masked_select", x, mask)
    return Spec(("masked",), x.dtype)


def _ms_grad(g, y, x, mask):
    from .creation import zeros_like
    return masked_scatter(zeros_like(x), mask, g), None


def _mask_samples(r):
    return r.uniform(size=(3, 4)) > 0.5


MASKED_SELECT = defop(
    "masked_select", _ms_rule, kernel=lambda a, m: a[m], grad=_ms_grad, saves=(1,),
    nondiff_inputs=(1,), onnx=NO_ONNX, flops=_zflops,
    samples=lambda: [Sample((randf(rng(148), 3, 4), _mask_samples(rng(149))), diff=(0,))])


def _msc_rule(x, mask, src):
    _mask_rule("masked_scatter", x, mask)
    if src.dtype != x.dtype:
        raise op_error(DTypeError, "masked_scatter", f"input {x.dtype} and source "
                       f"{src.dtype}", "one dtype")
    return Spec(tuple(x.shape), x.dtype)


def _msc_kernel(a, m, src):
    n = int(np.count_nonzero(m))
    if n > src.size:
        raise op_error(ShapeError, "masked_scatter", f"a mask with {n} true entries and a "
                       f"source of {src.size} elements", "a source with at least as many "
                       "elements as the mask has true entries")
    out = a.copy()
    out[m] = src.reshape(-1)[:n]
    return out


def _msc_grad(g, y, x, mask, src):
    from .creation import zeros
    from .elementwise import cast, sub, where
    from .reduce import cumsum
    from .shape import narrow, reshape
    n = 1
    for d in src.shape:
        n *= d
    flat = reshape(mask, (-1,))
    # the k-th true entry of the mask took source element k; the others go to a spare slot
    pos = where(flat, sub(cumsum(cast(flat, "int64"), 0), 1), n)
    buf = scatter_add(zeros((n + 1,), dtype=g.dtype), pos, reshape(g, (-1,)), 0)
    gs = reshape(narrow(buf, 0, 0, n), tuple(src.shape))
    return where(mask, 0.0, g), None, gs


MASKED_SCATTER = defop(
    "masked_scatter", _msc_rule, kernel=_msc_kernel, grad=_msc_grad, saves=(1,),
    nondiff_inputs=(1,), onnx=NO_ONNX, flops=_zflops,
    samples=lambda: [Sample((randf(rng(150), 3, 4), _mask_samples(rng(149)),
                             randf(rng(151), 4, 4)), diff=(0, 2))])


# ---------------------------------------------------------------------- frontends
def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    """PyTorch's scatter: `input` with `src[i][j]` written to ``out[index[i][j]][j]``
    (dim 0; likewise for others), `src` a tensor of the index's shape or a scalar (or
    `value=`). ``reduce="add"`` / ``"multiply"`` combine instead of overwriting (duplicates
    accumulate); without it, the last of duplicate indices wins. Example:
    ``sampan.scatter(x, 1, idx, src)``."""
    if (src is None) == (value is None):
        raise op_error(SampanValueError, "scatter", "both src and value" if src is not None
                       else "neither src nor value", "one of src= or value=")
    x, index = _t(input), _t(index)
    dim = _need_dim("scatter", dim) % max(x.ndim, 1)
    if src is None or not isinstance(src, (Tensor, np.ndarray)):
        from .creation import full
        src = full(tuple(index.shape), src if value is None else value, dtype=x.dtype)
    src = _t(src)
    if src.dtype != x.dtype:
        from .elementwise import cast
        src = cast(src, _dt.dtype_name(x.dtype))
    if reduce is None:
        return apply(SCATTER, (x, index, src), {"axis": dim})
    if reduce == "add":
        return scatter_add(x, dim, index, src)
    if reduce == "multiply":
        return scatter_reduce(x, dim, index, src, "prod")
    raise op_error(SampanValueError, "scatter", f"reduce={reduce!r}", "'add' or 'multiply'")


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    """`src` combined into `input` at `index` along `dim` with `reduce` ("sum", "prod",
    "mean", "amax", "amin"); with ``include_self=False`` the input's values at scattered
    places take no part. Example: ``sampan.scatter_reduce(x, 0, idx, src, "amax")``."""
    x, index, src = _t(input), _t(index), _t(src)
    if src.dtype != x.dtype:
        from .elementwise import cast
        src = cast(src, _dt.dtype_name(x.dtype))
    return apply(SCATTER_REDUCE, (x, index, src), {
        "axis": _need_dim("scatter_reduce", dim) % max(x.ndim, 1), "reduce": reduce,
        "include_self": bool(include_self)})


def _mask_to(op, x, mask):
    """The mask as bool, broadcast to the shape of `x` (also broadcast: PyTorch's rule)."""
    from ._util import broadcast_shapes
    from .elementwise import cast
    from .shape import expand
    mask = _t(mask)
    if mask.dtype != np.bool_:
        raise op_error(DTypeError, op, f"mask dtype {mask.dtype}", "a bool mask")
    shape = broadcast_shapes(op, tuple(x.shape), tuple(mask.shape))
    return (expand(x, shape) if tuple(x.shape) != shape else x,
            expand(mask, shape) if tuple(mask.shape) != shape else cast(mask, "bool"))


def masked_select(input, mask):
    """The elements of `input` where `mask` (broadcast with it) is true, as a 1-d tensor.
    Its length depends on the data: eager only. Example: ``sampan.masked_select(x, x > 0)``."""
    x, mask = _mask_to("masked_select", _t(input), mask)
    return apply(MASKED_SELECT, (x, mask), {})


def masked_scatter(input, mask, source):
    """`input` with the true places of `mask` filled, in order, from `source`'s elements.
    Example: ``sampan.masked_scatter(x, m, src)``."""
    x = _t(input)
    xb, mask = _mask_to("masked_scatter", x, mask)
    if tuple(xb.shape) != tuple(x.shape):
        raise op_error(ShapeError, "masked_scatter", f"input {tuple(x.shape)} and mask "
                       f"{tuple(mask.shape)}", "a mask that broadcasts to the input")
    src = _t(source)
    if src.dtype != x.dtype:
        from .elementwise import cast
        src = cast(src, _dt.dtype_name(x.dtype))
    return apply(MASKED_SCATTER, (x, mask, src), {})


def _fill_value(op, x, value):
    """A fill value as a 0-d tensor of x's dtype (a tensor value keeps its gradient)."""
    from .creation import full
    from .elementwise import cast
    if isinstance(value, (Tensor, np.ndarray)):
        v = _t(value)
        if v.ndim != 0:
            raise op_error(ShapeError, op, f"a value of shape {tuple(v.shape)}",
                           "a scalar or a 0-d tensor")
        return v if v.dtype == x.dtype else cast(v, _dt.dtype_name(x.dtype))
    return full((), value, dtype=x.dtype)


def masked_fill(input, mask, value):
    """`input` with `value` (a scalar or a 0-d tensor, which gets a gradient) where `mask`
    is true. Example: ``x.masked_fill(x < 0, 0.0)``."""
    from .elementwise import where
    x = _t(input)
    mask = _t(mask)
    if mask.dtype != np.bool_:
        raise op_error(DTypeError, "masked_fill", f"mask dtype {mask.dtype}", "a bool mask")
    return where(mask, _fill_value("masked_fill", x, value), x)


def _line_index(op, x, dim, index, length):
    """A 1-d index along `dim` as a full gather/scatter index for a slab whose `dim` is as
    long as the index (the other dims of `x`)."""
    from .shape import expand, reshape
    index = _t(index)
    if index.ndim > 1:
        raise op_error(ShapeError, op, f"index of shape {tuple(index.shape)}", "a 1-d index")
    shape = [1] * x.ndim
    shape[dim] = -1
    full = list(x.shape)
    full[dim] = length
    return expand(reshape(index, tuple(shape) if x.ndim else (-1,)), tuple(full))


def index_copy(input, dim, index, source):
    """`input` with the slices along `dim` at `index` replaced by `source`'s. Example:
    ``sampan.index_copy(x, 0, sampan.tensor([2, 0]), rows)``."""
    x, src = _t(input), _t(source)
    index = _t(index)
    if x.ndim == 0:                         # one slot, as in PyTorch
        from .index import _scalar_slot
        from .shape import reshape
        _scalar_slot("index_copy", _need_dim("index_copy", dim), index, src)
        return reshape(index_copy(reshape(x, (1,)), 0, reshape(index, (1,)),
                                  reshape(src, (1,))), ())
    dim = _need_dim("index_copy", dim) % max(x.ndim, 1)
    n = index.shape[0] if index.ndim else 1
    return scatter(x, dim, _line_index("index_copy", x, dim, index, n), src)


def index_fill(input, dim, index, value):
    """`input` with `value` (a scalar or 0-d tensor) in the slices along `dim` at `index`.
    Example: ``sampan.index_fill(x, 1, sampan.tensor([0]), -1.0)``."""
    from .creation import full, zeros
    from .elementwise import where
    from .shape import reshape
    x = _t(input)
    dim = _need_dim("index_fill", dim) % max(x.ndim, 1)
    index = reshape(_t(index), (-1,))
    n = x.shape[dim] if x.ndim else 1
    m = scatter(zeros((n,), dtype="bool"), 0, index, full(tuple(index.shape), True))
    shape = [1] * x.ndim
    if x.ndim:
        shape[dim] = n
    return where(reshape(m, tuple(shape)), _fill_value("index_fill", x, value), x)


def take_along_dim(input, indices, dim=None):
    """PyTorch's take_along_dim: gather along `dim` with `input` and `indices`
    broadcast against each other in the other dims (dim None: over the flattened input).
    Example: ``sampan.take_along_dim(x, sampan.argsort(x, 1), 1)``."""
    from ._util import broadcast_shapes
    from .shape import expand, reshape
    x, idx = _t(input), _t(indices)
    _check_index("take_along_dim", idx)
    if dim is None:
        return take_along_axis(reshape(x, (-1,)), reshape(idx, (-1,)), 0)
    if x.ndim != idx.ndim:
        raise op_error(ShapeError, "take_along_dim", f"input {tuple(x.shape)} and indices "
                       f"{tuple(idx.shape)}", "the same number of dims")
    dim = _need_dim("take_along_dim", dim) % x.ndim
    xs, js = list(x.shape), list(idx.shape)
    xs[dim] = js[dim] = 1
    b = list(broadcast_shapes("take_along_dim", tuple(xs), tuple(js)))
    bx, bi = list(b), list(b)
    bx[dim], bi[dim] = x.shape[dim], idx.shape[dim]
    return take_along_axis(expand(x, tuple(bx)), expand(idx, tuple(bi)), dim)


def index_put(input, indices, values, accumulate=False):
    """`input` with ``input[indices] = values`` for a tuple of integer index tensors (one per
    leading dim, broadcast together; negative entries count from the end, as PyTorch's);
    with ``accumulate=True`` duplicates add up. Example:
    ``sampan.index_put(x, (sampan.tensor([0, 0]),), sampan.tensor(1.0), accumulate=True)``."""
    from ._util import broadcast_shapes
    from .elementwise import add, cast, lt, mul, where
    from .registry import STATE
    from .shape import expand, reshape, setitem
    x = _t(input)
    idx = tuple(_t(i) for i in (indices if isinstance(indices, (tuple, list)) else (indices,)))
    if not idx or len(idx) > x.ndim:
        raise op_error(ShapeError, "index_put", f"{len(idx)} index tensors for a "
                       f"{x.ndim}-d input", f"1 to {x.ndim} index tensors")
    for i, n in zip(idx, x.shape):
        _check_index("index_put", i)
        if STATE.tracer is None and i._data.size and (
                int(i._data.min()) < -n or int(i._data.max()) >= n):
            from ..errors import SampanIndexError
            bad = int(i._data.min()) if int(i._data.min()) < -n else int(i._data.max())
            raise op_error(SampanIndexError, "index_put", f"index {bad} for a dim of "
                           f"length {n}", f"indices in [{-n}, {n})")
    v = _t(values)
    if v.dtype != x.dtype:
        v = cast(v, _dt.dtype_name(x.dtype))
    if not accumulate:
        return setitem(x, idx, v)
    k = len(idx)
    b = broadcast_shapes("index_put", *(tuple(i.shape) for i in idx))
    lin = None
    for i, n in zip(idx, x.shape):    # the row of the flattened leading dims
        i = where(lt(i, 0), add(i, n), i)
        lin = i if lin is None else add(mul(lin, n), i)
    rest = tuple(x.shape[k:])
    rows = 1
    for d in x.shape[:k]:
        rows *= d
    count = 1
    for d in b:
        count *= d
    lin = reshape(expand(lin, b), (count,))
    v = reshape(expand(v, b + rest) if tuple(v.shape) != b + rest else v, (count,) + rest)
    out = index_add(reshape(x, (rows,) + rest), 0, lin, v)
    return reshape(out, tuple(x.shape))


def count_nonzero(input, dim=None, *, axis=None):
    """The number of nonzero elements (int64), over `dim` (an int, a tuple, or None for
    all). Example: ``sampan.count_nonzero(x, 0)``."""
    from .elementwise import cast, ne
    from .reduce import sum
    x = _t(input)
    dim = pick("count_nonzero", "dim", dim, "axis", axis)
    nz = cast(ne(x, False if x.dtype == np.bool_ else 0), "int64")
    return sum(nz, dim)


# ---------------------------------------------------------------------- composite samples
def _index_put_args(x, i, j, v, accumulate):
    return index_put(x, (i, j), v, accumulate=accumulate)


def _comp_samples():
    r = rng(152)
    x = randf(r, 3, 4)
    m = _mask_samples(rng(153))
    return {
        "masked_fill": (masked_fill, lambda: [
            Sample((x, m), {"value": -1.5}, diff=(0,)),
            Sample((x, m[0], np.array(0.75)), diff=(0, 2))]),
        "index_copy": (index_copy, lambda: [
            Sample((x, 0, np.array([2, 0]), randf(r, 2, 4)), diff=(0, 3))]),
        "index_fill": (index_fill, lambda: [
            Sample((x, 1, np.array([3, 0, 3]), 2.0), diff=(0,)),
            Sample((x, 0, np.array([1]), np.array(-0.5)), diff=(0, 3))]),
        "take_along_dim": (take_along_dim, lambda: [
            Sample((x, np.array([[0, 3, 1]])), {"dim": 1}, diff=(0,)),
            Sample((x, np.array([11, 0, 5])), {}, diff=(0,))]),
        "index_put": (_index_put_args, lambda: [
            Sample((x, np.array([2, 0, 2]), np.array([[1], [3]]), randf(r, 2, 3)),
                   {"accumulate": True}),
            Sample((x, np.array([-1, 0]), np.array([1, 2]), np.array(0.25, np.float32)),
                   {"accumulate": False})]),
        "count_nonzero": (count_nonzero, lambda: [
            Sample((np.array([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]]),), {"dim": 1}, diff=())]),
    }


for _name, (_fn, _s) in _comp_samples().items():
    COMPOSITES[_name] = (_fn, _s)


EXPORTS = ["scatter", "scatter_reduce", "masked_select", "masked_scatter", "masked_fill",
           "index_copy", "index_fill", "index_put", "take_along_dim", "count_nonzero"] + \
    _datadep.EXPORTS
# gather, scatter_add, index_add and index_select (index.py) are exported by sampan/__init__
METHODS = {"scatter": scatter, "scatter_reduce": scatter_reduce,
           "scatter_add": scatter_add, "index_add": index_add,
           "index_copy": index_copy, "index_fill": index_fill,
           "index_select": index_select, "gather": gather,
           "masked_select": masked_select, "masked_scatter": masked_scatter,
           "masked_fill": masked_fill, "take_along_dim": take_along_dim,
           "count_nonzero": count_nonzero, "index_put": index_put, **_datadep.METHODS}
INPLACE = {"scatter_": scatter, "scatter_reduce_": scatter_reduce, "scatter_add_": scatter_add,
           "index_add_": index_add, "index_copy_": index_copy, "index_fill_": index_fill,
           "masked_fill_": masked_fill, "masked_scatter_": masked_scatter,
           "index_put_": index_put}
globals().update({n: getattr(_datadep, n) for n in _datadep.EXPORTS})
