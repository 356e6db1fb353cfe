"""Gather/scatter primitives: index_select, index_add, take_along_axis (gather),
scatter_add."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, randf, rng
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


INDEX_SELECT = defop(
    "index_select", _index_select_rule, kernel=lambda a, i, axis: np.take(a, i, axis=axis),
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


def index_select(x, index, axis=0):
    """Rows (or slices along `axis`) picked by an integer index. Example: ``emb[ids]``."""
    x, index = _t(x), _t(index)
    return apply(INDEX_SELECT, (x, index), {"axis": axis % x.ndim})


def index_add(x, index, src, axis=0):
    """Functional `x` with `src` added at `index` along `axis` (duplicates accumulate)."""
    x, index, src = _t(x), _t(index), _t(src)
    return apply(INDEX_ADD, (x, index, src), {"axis": axis % x.ndim})


def _tal_rule(x, idx, axis):
    _check_index("take_along_axis", idx)
    if len(idx.shape) != len(x.shape):
        raise op_error(ShapeError, "take_along_axis",
                       f"input {tuple(x.shape)} and index {tuple(idx.shape)}",
                       "index with the same number of dims as the input")
    return Spec(tuple(idx.shape), x.dtype)


def _scatter_add_kernel(a, i, src, axis):
    out = a.copy()
    nd = a.ndim
    grids = np.indices(i.shape, sparse=True)
    idx = tuple(i if d == axis else grids[d] for d in range(nd))
    np.add.at(out, idx, src)
    return out


TAKE_ALONG_AXIS = defop(
    "take_along_axis", _tal_rule,
    kernel=lambda a, i, axis: np.take_along_axis(a, i, axis=axis), saves=(1,),
    nondiff_inputs=(1,), onnx="GatherElements", flops=lambda *a, **k: 0,
    grad=lambda g, y, x, i, axis: (scatter_add(_zeros_like(x), i, g, axis), None),
    samples=lambda: [Sample((randf(rng(45), 3, 4), np.array([[0, 3], [1, 1], [2, 0]])),
                            {"axis": 1}, diff=(0,))])

SCATTER_ADD = defop(
    "scatter_add", lambda x, i, src, axis: Spec(x.shape, x.dtype), kernel=_scatter_add_kernel,
    saves=(1,), nondiff_inputs=(1,), onnx="ScatterElements", flops=lambda *a, **k: 0,
    grad=lambda g, y, x, i, src, axis: (g, None, take_along_axis(g, i, axis)),
    samples=lambda: [Sample((randf(rng(46), 3, 4), np.array([[0, 3], [1, 1], [2, 0]]),
                             randf(rng(47), 3, 2)), {"axis": 1}, diff=(0, 2))])


def take_along_axis(x, index, axis):
    """Pick values along `axis` at `index` (same ndim). PyTorch's `gather`."""
    x, index = _t(x), _t(index)
    return apply(TAKE_ALONG_AXIS, (x, index), {"axis": axis % x.ndim})


gather = take_along_axis


def scatter_add(x, index, src, axis):
    """Functional scatter-add: `x` with `src` added at `index` along `axis`."""
    x, index, src = _t(x), _t(index), _t(src)
    return apply(SCATTER_ADD, (x, index, src), {"axis": axis % x.ndim})
