"""Gather/scatter primitives: index_select, index_add, take_along_axis (gather),
scatter_add."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, SampanIndexError, ShapeError, op_error
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
    _check_range("index_select", i, a.shape[axis], axis, a.shape)
    return np.take(a, i, axis=axis)


INDEX_SELECT = defop(
    "index_select", _index_select_rule, kernel=_index_select_kernel,
    saves=(1,), nondiff_inputs=(1,), onnx="Gather", flops=lambda *a, **k: 0,
    grad=lambda g, y, x, i, axis: (index_add(_zeros_like(x), i, g, axis), None),
    samples=lambda: [Sample((randf(rng(41), 5, 3), np.array([4, 0, 0, 2])), {"axis": 0},
                            diff=(0,)),
                     Sample((randf(rng(42), 2, 4), np.array([3, 1])), {"axis": 1}, diff=(0,))])


def _zeros_like(x):
    from .creation import zeros_like
    return zeros_like(x)


def _index_add_kernel(a, i, src, axis):
    out = a.copy()
    if axis == 0 and a.ndim == 2 and src.ndim == 2 and a.dtype in (np.float32, np.float64) \
            and src.dtype == a.dtype:
        from . import sparse
        if sparse.HAVE_NUMBA:  # embedding gradients: a numba row loop, ~30x np.add.at
            ii = np.ascontiguousarray(i, np.int64).reshape(-1)
            if ii.size and ii.min() < 0:  # numpy-style negative indices
                ii = np.where(ii < 0, ii + a.shape[0], ii)
            sparse._check_range(ii, a.shape[0])
            sparse._scatter_add_rows(np.ascontiguousarray(src), ii, out)
            return out
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


def index_select(x, dim, index=None, *, axis=None):
    """Slices along `dim` picked by an integer index: PyTorch's order
    ``index_select(x, dim, index)``; the older ``index_select(x, index, axis)`` (an index
    first) works too. Example: ``emb.index_select(0, ids)``."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        dim, index = index, dim        # the older order: (x, index, axis)
    if axis is not None:
        dim = axis if dim is None else pick("index_select", "dim", dim, "axis", axis)
    axis = 0 if dim is None else int(dim)
    x, index = _t(x), _t(index)
    return apply(INDEX_SELECT, (x, index), {"axis": axis % x.ndim})


def index_add(x, index, src, axis=0):
    """Functional `x` with `src` added at `index` along `axis` (duplicates accumulate)."""
    x, index, src = _t(x), _t(index), _t(src)
    return apply(INDEX_ADD, (x, index, src), {"axis": axis % x.ndim})


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
    "take_along_axis", _tal_rule, kernel=_tal_kernel, saves=(1,),
    nondiff_inputs=(1,), onnx="GatherElements", flops=lambda *a, **k: 0,
    grad=lambda g, y, x, i, axis: (scatter_add(_zeros_like(x), i, g, axis), None),
    samples=_gather_samples)

SCATTER_ADD = defop(
    "scatter_add", _scatter_rule, kernel=_scatter_add_kernel,
    saves=(1,), nondiff_inputs=(1,), onnx="ScatterElements", flops=lambda *a, **k: 0,
    grad=lambda g, y, x, i, src, axis: (g, None, take_along_axis(g, i, axis)),
    samples=_scatter_samples)


def take_along_axis(x, index, axis):
    """PyTorch's `gather`: ``out[i][j] = x[index[i][j]][j]`` for axis 0 (likewise for other
    axes). `index` has x's ndim and may be smaller than x in the other dims; it is not
    broadcast. Example: ``sampan.gather(x, idx, 1)``."""
    x, index = _t(x), _t(index)
    return apply(TAKE_ALONG_AXIS, (x, index), {"axis": axis % x.ndim})


gather = take_along_axis


def scatter_add(x, index, src, axis):
    """Functional scatter-add (PyTorch's): `x` with `src` (of the index's shape) added at
    `index` along `axis`."""
    x, index, src = _t(x), _t(index), _t(src)
    return apply(SCATTER_ADD, (x, index, src), {"axis": axis % x.ndim})
