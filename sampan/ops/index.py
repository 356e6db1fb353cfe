"""Gather/scatter primitives: index_select, index_add, take_along_axis (gather),
scatter_add."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, SampanIndexError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, pick, randf, rng
from .registry import NO_ONNX, Spec, defop


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _check_index(op, idx):
    if idx.dtype.kind not in "iu":
        raise op_error(DTypeError, op, f"index dtype {idx.dtype}", "an integer dtype")


def _index_select_rule(x, idx, axis):
    _check_index("index_select", idx)
    if len(idx.shape) != 1:
        raise op_error(ShapeError, "index_select", f"index of shape {tuple(idx.shape)}",
                       "a 1-d index")
    s = list(x.shape)
    s[axis] = idx.shape[0]
    return Spec(tuple(s), x.dtype)


def _check_range(op, i, n, axis, shape):
    """Indices in [0, n), as PyTorch requires (numpy would read -1 as the last entry)."""
    if i.size:
        lo, hi = int(i.min()), int(i.max())
        if lo < 0 or hi >= n:
            raise op_error(SampanIndexError, op, f"index {lo if lo < 0 else hi} along axis "
                           f"{axis} of an input of shape {tuple(shape)}", f"indices in [0, {n})")


def _index_select_kernel(a, i, axis):
    n = a.shape[axis]
    if i.size:                 # indices in [0, n), as PyTorch requires (not numpy's -1)
        lo, hi = int(i.min()), int(i.max())
        if lo < 0 or hi >= n:
            raise IndexError(f"index_select: index {lo if lo < 0 else hi} along axis "
                             f"{axis} of an input of shape {tuple(a.shape)}; expected "
                             f"indices in [0, {n})")
    return np.take(a, i, axis=axis)


def _index_select_error(exc, arrays, attrs):
    """index_select's kernel found an index out of range: say which, as sampan does."""
    if isinstance(exc, IndexError):
        a, i = arrays[0], arrays[1]
        try:
            _check_range("index_select", i, a.shape[attrs["axis"]], attrs["axis"], a.shape)
        except SampanIndexError as e:
            return e
    return None


INDEX_SELECT = defop(
    "index_select", _index_select_rule, kernel=_index_select_kernel,
    kernel_error=_index_select_error,
    indexes=True,
    saves=(1,), nondiff_inputs=(1,), onnx="Gather", flops=lambda *a, **k: 0,
    grad=lambda g, y, x, i, axis: (index_add(_zeros_like(x), i, g, axis), None),
    samples=lambda: [Sample((randf(rng(41), 5, 3), np.array([4, 0, 0, 2])), {"axis": 0},
                            diff=(0,)),
                     Sample((randf(rng(42), 2, 4), np.array([3, 1])), {"axis": 1}, diff=(0,))])


def _zeros_like(x):
    from .creation import zeros_like
    return zeros_like(x)


def _index_add_kernel(a, i, src, axis):
    # (where numba is, embedding gradients run a row loop: backends/numba/loops/sparse.py)
    _check_range("index_add", i, a.shape[axis], axis, a.shape)
    out = a.copy()
    idx = [slice(None)] * a.ndim
    idx[axis] = i
    np.add.at(out, tuple(idx), src)
    return out


def _index_add_rule(x, idx, src, axis):
    # the numba row loop reads src[j] for every index j and writes x's row width of src:
    # a src of any other shape read or wrote out of bounds
    _check_index("index_add", idx)
    want = list(x.shape)
    if len(idx.shape) != 1 or not 0 <= axis < len(want):
        raise op_error(ShapeError, "index_add", f"index of shape {tuple(idx.shape)}, axis "
                       f"{axis} for input {tuple(x.shape)}", "a 1-d index and an input axis")
    want[axis] = idx.shape[0]
    if tuple(src.shape) != tuple(want) or src.dtype != x.dtype:
        raise op_error(ShapeError, "index_add", f"input {tuple(x.shape)}, index of length "
                       f"{idx.shape[0]} and source {src.dtype}{list(src.shape)}",
                       f"a source {x.dtype}{want} (the input with dim {axis} as long as "
                       "the index)")
    return Spec(tuple(x.shape), x.dtype)


INDEX_ADD = defop(
    "index_add", _index_add_rule, kernel=_index_add_kernel,
    saves=(1,), nondiff_inputs=(1,), onnx=NO_ONNX,
    flops=lambda x, i, s, axis: int(np.prod(s.shape)),
    grad=lambda g, y, x, i, src, axis: (g, None, index_select(g, i, axis)),
    samples=lambda: [Sample((randf(rng(43), 5, 3), np.array([4, 0, 0]), randf(rng(44), 3, 3)),
                            {"axis": 0}, diff=(0, 2))])


def _is_dim(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _dim_index(op, dim, index, axis, default=None):
    """(dim, index) of a call in PyTorch's order ``f(input, dim, index)`` or numpy's
    ``f(x, index, axis)``: the second argument decides (an int is a dim)."""
    if dim is None or _is_dim(dim):
        d = pick(op, "dim", dim, "axis", axis, default)
        return d, index
    d = pick(op, "dim", index, "axis", axis, default)   # numpy order: (x, index, axis)
    return d, dim


def _need_dim(op, d):
    if not _is_dim(d):
        raise op_error(SampanValueError, op, f"dim {d!r}", "an int dim")
    return int(d)


def index_select(input, dim=None, index=None, *, axis=None):
    """Slices along `dim` picked by a 1-d integer index, in PyTorch's order
    ``index_select(x, dim, index)`` (numpy's ``index_select(x, index, axis=0)`` works
    too). Example: ``sampan.index_select(emb, 0, ids)``."""
    dim, index = _dim_index("index_select", dim, index, axis, 0)
    x, index = _t(input), _t(index)
    d = _need_dim("index_select", dim)
    if x.ndim == 0:                         # one slot, as in PyTorch (see _scalar_slot)
        from .shape import reshape
        _scalar_slot("index_select", d, index)
        y = apply(INDEX_SELECT, (reshape(x, (1,)), reshape(index, (1,))), {"axis": 0})
        return reshape(y, ())
    return apply(INDEX_SELECT, (x, index), {"axis": d % x.ndim})


def _scalar_slot(op, d, index, src=None):
    """Check an index op's call on a 0-d input, which PyTorch reads as one slot along dim
    0 (or -1): a 0-d or 1-d index of one entry and a 0-d source; else a sampan error
    naming the op, not a bare ZeroDivisionError from ``dim % 0``."""
    n = int(np.prod(index.shape, dtype=np.int64))
    if d not in (0, -1) or index.ndim > 1 or n != 1 or (src is not None and src.ndim != 0):
        raise op_error(ShapeError, op, f"dim {d}, index of shape {tuple(index.shape)}" + (
            "" if src is None else f" and source of shape {tuple(src.shape)}") + " for a "
            "0-d input", "dim 0 or -1, a 0-d or 1-d index of one entry" + (
                "" if src is None else " and a 0-d source"))


def index_add(input, dim=None, index=None, source=None, *, alpha=1, axis=None):
    """`input` with `alpha * source` added at `index` along `dim` (duplicates accumulate).
    PyTorch's order ``index_add(x, dim, index, source)``; the older
    ``index_add(x, index, source, axis=0)`` works too. Example:
    ``sampan.index_add(x, 0, sampan.tensor([0, 0]), rows)``."""
    if dim is None or _is_dim(dim):
        d = pick("index_add", "dim", dim, "axis", axis, 0)
    else:                                   # (x, index, source[, axis])
        d = pick("index_add", "dim", source, "axis", axis, 0)
        index, source = dim, index
    x, index, src = _t(input), _t(index), _t(source)
    if alpha != 1:
        from .elementwise import mul
        src = mul(src, alpha)
    d = _need_dim("index_add", d)
    if x.ndim == 0:
        return _index_add_0d(x, d, index, src)
    return apply(INDEX_ADD, (x, index, src), {"axis": d % x.ndim})


def _index_add_0d(x, d, index, src):
    """A 0-d input is one slot along dim 0 (or -1), as in PyTorch: index 0 (0-d or one
    entry) adds a 0-d source; the op runs on the 1-element view of each."""
    from .shape import reshape
    _scalar_slot("index_add", d, index, src)
    y = apply(INDEX_ADD, (reshape(x, (1,)), reshape(index, (1,)), reshape(src, (1,))),
              {"axis": 0})
    return reshape(y, ())


def _gather_shapes(op, x, idx, axis, src=None):
    """PyTorch's gather/scatter shape contract: index of the input's ndim, no larger than
    the input in every dim but `axis` (it may be smaller: no broadcasting), and for
    scatter a source of the index's shape."""
    _check_index(op, idx)
    xs, js = tuple(x.shape), tuple(idx.shape)
    if len(js) != len(xs):
        raise op_error(ShapeError, op, f"input {xs} and index {js}",
                       "an index with the same number of dims as the input")
    for d, (n, m) in enumerate(zip(xs, js)):
        if d != axis and isinstance(n, int) and isinstance(m, int) and m > n:
            raise op_error(ShapeError, op, f"input {xs} and index {js}",
                           f"index.shape[{d}] <= input.shape[{d}] in every dim but axis "
                           f"{axis} (PyTorch's gather: the index is not broadcast)")
    if src is not None and tuple(src.shape) != js:
        raise op_error(ShapeError, op, f"index {js} and source {tuple(src.shape)}",
                       "a source of the index's shape")


def _tal_rule(x, idx, axis):
    _gather_shapes("take_along_axis", x, idx, axis)
    return Spec(tuple(idx.shape), x.dtype)


def _gather_index(op, a, i, axis, src=None):
    """The numpy index tuple of gather/scatter: `i` along `axis`, the position itself in
    every other dim (so a smaller index reads the leading block, as torch.gather does).
    The shape contract is checked here too (eager runs the kernel without the rule), and
    out-of-range entries raise before numpy would wrap negative ones."""
    _gather_shapes(op, a, i, axis, src)
    _check_range(op, i, a.shape[axis], axis, a.shape)
    grids = np.indices(i.shape, sparse=True)
    return tuple(i if d == axis else grids[d] for d in range(a.ndim))


def _tal_kernel(a, i, axis):
    return a[_gather_index("take_along_axis", a, i, axis)]


def _scatter_add_kernel(a, i, src, axis):
    out = a.copy()
    np.add.at(out, _gather_index("scatter_add", a, i, axis, src), src)
    return out


def _gather_samples():
    r = rng(45)
    return [Sample((randf(r, 3, 4), np.array([[0, 3], [1, 1], [2, 0]])), {"axis": 1},
                   diff=(0,)),
            # an index smaller than the input in the other dims (PyTorch's gather)
            Sample((randf(r, 3, 4), np.array([[0], [3]])), {"axis": 1}, diff=(0,)),
            Sample((randf(r, 4, 3, 5), np.array([[[3, 0]], [[1, 1]]])), {"axis": 0},
                   diff=(0,)),
            Sample((randf(r, 3, 4), np.zeros((0, 2), np.int64)), {"axis": 1}, diff=(0,))]


def _scatter_samples():
    r = rng(46)
    return [Sample((randf(r, 3, 4), np.array([[0, 3], [1, 1], [2, 0]]), randf(r, 3, 2)),
                   {"axis": 1}, diff=(0, 2)),
            Sample((randf(r, 3, 4), np.array([[0], [3]]), randf(r, 2, 1)), {"axis": 1},
                   diff=(0, 2)),
            Sample((randf(r, 4, 3), np.array([[3, 3, 0], [1, 3, 2]]), randf(r, 2, 3)),
                   {"axis": 0}, diff=(0, 2))]


def _scatter_rule(x, idx, src, axis):
    _gather_shapes("scatter_add", x, idx, axis, src)
    return Spec(tuple(x.shape), x.dtype)


TAKE_ALONG_AXIS = defop(
    "take_along_axis", _tal_rule, kernel=_tal_kernel, saves=(1,), indexes=True,
    nondiff_inputs=(1,), onnx="GatherElements", flops=lambda *a, **k: 0,
    grad=lambda g, y, x, i, axis: (scatter_add(_zeros_like(x), i, g, axis), None),
    samples=_gather_samples)

SCATTER_ADD = defop(
    "scatter_add", _scatter_rule, kernel=_scatter_add_kernel,
    saves=(1,), nondiff_inputs=(1,), onnx="ScatterElements", flops=lambda *a, **k: 0,
    grad=lambda g, y, x, i, src, axis: (g, None, take_along_axis(g, i, axis)),
    samples=_scatter_samples)


def take_along_axis(x, index, axis):
    """numpy's name for PyTorch's `gather` (numpy's argument order): ``out[i][j] =
    x[index[i][j]][j]`` for axis 0 (likewise for other axes). `index` has x's ndim and may
    be smaller than x in the other dims; it is not broadcast. Example:
    ``sampan.take_along_axis(x, idx, 1)``."""
    x, index = _t(x), _t(index)
    return apply(TAKE_ALONG_AXIS, (x, index), {"axis": _need_dim("gather", axis) % x.ndim})


def gather(input, dim=None, index=None, *, axis=None, sparse_grad=False):
    """PyTorch's gather, ``gather(x, dim, index)``: ``out[i][j] = x[index[i][j]][j]`` for
    dim 0. numpy's order ``gather(x, index, axis)`` works too (the second argument decides:
    an int is the dim). Example: ``sampan.gather(x, 1, idx)``."""
    dim, index = _dim_index("gather", dim, index, axis)
    return take_along_axis(input, index, dim)


def scatter_add(input, dim=None, index=None, src=None, *, axis=None):
    """`input` with `src` (of the index's shape) added at `index` along `dim`, duplicates
    accumulating. PyTorch's order ``scatter_add(x, dim, index, src)``; the older
    ``scatter_add(x, index, src, axis)`` works too (an int second argument is the dim).
    Example: ``sampan.scatter_add(x, 1, idx, src)``."""
    if dim is None or _is_dim(dim):
        d = pick("scatter_add", "dim", dim, "axis", axis)
    else:                                   # (x, index, src, axis)
        d = pick("scatter_add", "dim", src, "axis", axis)
        index, src = dim, index
    x, index, src = _t(input), _t(index), _t(src)
    return apply(SCATTER_ADD, (x, index, src), {"axis": _need_dim("scatter_add", d) % x.ndim})
