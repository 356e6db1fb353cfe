"""Sorting primitives: sort and topk (values and int64 indices), argsort.

Orders are stable: equal values keep their input order, ascending or descending (the
descending order sorts the reversed input and maps the positions back, so no negation
is needed and unsigned/integer inputs work). NaN sorts as the largest value, as in
PyTorch. The gradient of the values routes `g` back through the indices: for sort the
inverse permutation (a gather), for topk a scatter-add into zeros.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt, return_types
from ..errors import ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, norm_axis, pick, randf, rng
from .registry import NOT_DIFFERENTIABLE, Spec, defop

_I64 = np.dtype(np.int64)


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _key(x):
    # bfloat16/float16 compare exactly as float32 and numpy sorts float32 much faster
    return x.astype(np.float32) if x.dtype == _dt.bfloat16 or x.dtype == np.float16 else x


def _order(key, axis, descending):
    """Stable sorting permutation of `key` along `axis` (int64)."""
    if not descending:
        return np.argsort(key, axis=axis, kind="stable").astype(np.int64, copy=False)
    n = key.shape[axis]
    idx = np.argsort(np.flip(key, axis), axis=axis, kind="stable")
    return (n - 1) - np.flip(idx, axis).astype(np.int64)


def _axis_rule(op, x, axis):
    if not 0 <= axis < max(len(x.shape), 1):
        raise op_error(ShapeError, op, f"axis {axis} for a {len(x.shape)}-d input",
                       "a normalised axis in range")


# ---------------------------------------------------------------------- sort / argsort
def _sort_rule(x, axis, descending):
    _axis_rule("sort", x, axis)
    return Spec(tuple(x.shape), x.dtype), Spec(tuple(x.shape), _I64)


def _sort_kernel(x, axis, descending):
    idx = _order(_key(x), axis, descending)
    return np.take_along_axis(x, idx, axis=axis), idx


def _sort_grad(g, y, x, axis, descending):
    from .index import take_along_axis
    inverse = apply(ARGSORT, (y[1],), {"axis": axis, "descending": False})
    return (take_along_axis(g[0], inverse, axis),)


def _sort_flops(x, axis, descending):
    n = x.shape[axis] if isinstance(x.shape[axis], int) else 1
    total = 1
    for d in x.shape:
        total *= d if isinstance(d, int) else 1
    return int(total * max(np.log2(max(n, 1)), 1))


def _sort_samples():
    r = rng(80)
    ints = r.permutation(12).reshape(3, 4) % 5     # ties, no gradient
    return [Sample((randf(r, 3, 5),), {"axis": 1, "descending": False}),
            Sample((randf(r, 4, 3, 2),), {"axis": 0, "descending": True}),
            Sample((randf(r, 6),), {"axis": 0, "descending": True}),
            Sample((ints,), {"axis": 1, "descending": True}, diff=()),
            Sample((randf(r, 0, 3),), {"axis": 1, "descending": False})]


SORT = defop("sort", _sort_rule, kernel=_sort_kernel, grad=_sort_grad, n_out=2, saves=(),
             save_output=True, nondiff_inputs=(), flops=_sort_flops, onnx="TopK",
             samples=_sort_samples)
ARGSORT = defop("argsort", lambda x, axis, descending: Spec(tuple(x.shape), _I64),
                kernel=lambda x, axis, descending: _order(_key(x), axis, descending),
                grad=NOT_DIFFERENTIABLE, flops=_sort_flops, onnx="TopK",
                samples=lambda: [Sample(s.args, s.attrs, diff=()) for s in _sort_samples()])


# ---------------------------------------------------------------------- topk
def _topk_rule(x, k, axis, largest, sorted):
    _axis_rule("topk", x, axis)
    n = x.shape[axis]
    if isinstance(n, int) and not 0 <= k <= n:
        raise op_error(ShapeError, "topk", f"k={k} for an axis of length {n}",
                       f"0 <= k <= {n}")
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    return Spec(shape, x.dtype), Spec(shape, _I64)


def _topk_kernel(x, k, axis, largest, sorted):
    key = _key(x)
    n = x.shape[axis]
    if 0 < k < n:
        # select with argpartition (O(n)), then sort only the k winners; ordering the
        # winners by position first makes ties come out in input order
        kth = n - k if largest else k - 1
        part = np.argpartition(key, kth, axis=axis)
        part = np.take(part, np.arange(n - k, n) if largest else np.arange(k), axis=axis)
        part = np.sort(part, axis=axis)
        o = _order(np.take_along_axis(key, part, axis=axis), axis, largest)
        idx = np.take_along_axis(part, o, axis=axis).astype(np.int64, copy=False)
    else:
        idx = _order(key, axis, largest)
        idx = idx if k == n else np.take(idx, np.arange(0), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx


def _topk_grad(g, y, x, k, axis, largest, sorted):
    from .creation import zeros_like
    from .index import scatter_add
    return (scatter_add(zeros_like(x), y[1], g[0], axis),)


def _topk_flops(x, k, axis, largest, sorted):
    total = 1
    for d in x.shape:
        total *= d if isinstance(d, int) else 1
    return total


def _topk_samples():
    r = rng(81)
    return [Sample((randf(r, 3, 6),), {"k": 2, "axis": 1, "largest": True, "sorted": True}),
            Sample((randf(r, 5, 4),), {"k": 3, "axis": 0, "largest": False, "sorted": True}),
            Sample((randf(r, 2, 7, 3),), {"k": 7, "axis": 1, "largest": True, "sorted": True}),
            Sample((randf(r, 3, 4),), {"k": 0, "axis": 1, "largest": True, "sorted": True}),
            Sample((r.permutation(10).reshape(2, 5),),
                   {"k": 2, "axis": 1, "largest": False, "sorted": True}, diff=()),
            Sample((randf(r, 0, 4),), {"k": 1, "axis": 1, "largest": True, "sorted": True})]


TOPK = defop("topk", _topk_rule, kernel=_topk_kernel, grad=_topk_grad, n_out=2, saves=(),
             save_output=True, flops=_topk_flops, onnx="TopK", samples=_topk_samples)


# ---------------------------------------------------------------------- frontends
def _prep(x, axis, op):
    x = _t(x)
    if x.ndim == 0:
        return x, 0, True
    return x, norm_axis(axis, x.ndim, op)[0], False


def _unzero(outs, scalar):
    if not scalar:
        return outs
    from .shape import reshape
    return tuple(reshape(o, ()) for o in outs)


def _dim(op, dim, axis):
    if axis is not None:
        return axis if dim is None else pick(op, "dim", dim, "axis", axis)
    return -1 if dim is None else dim


def sort(x, dim=None, descending=False, stable=False, *, axis=None):
    """Sorted values and their int64 indices along `dim` (default -1), as a
    ``(values, indices)`` named tuple. Always stable (so `stable=` changes nothing).

    Example::

        >>> v, i = sampan.sort(sampan.tensor([3.0, 1.0, 2.0]))
        >>> v.tolist(), i.tolist()
        ([1.0, 2.0, 3.0], [1, 2, 0])
    """
    from .shape import reshape
    x, axis, scalar = _prep(x, _dim("sort", dim, axis), "sort")
    xs = reshape(x, (1,)) if scalar else x
    outs = apply(SORT, (xs,), {"axis": axis, "descending": bool(descending)})
    return return_types.sort(*_unzero(outs, scalar))


def argsort(x, dim=None, descending=False, stable=False, *, axis=None):
    """Indices that sort `x` along `dim` (default -1; stable, int64).

    Example::

        >>> sampan.argsort(sampan.tensor([3.0, 1.0, 2.0])).tolist()
        [1, 2, 0]
    """
    from .shape import reshape
    x, axis, scalar = _prep(x, _dim("argsort", dim, axis), "argsort")
    if scalar:
        return reshape(apply(ARGSORT, (reshape(x, (1,)),), {"axis": 0,
                                                           "descending": bool(descending)}), ())
    return apply(ARGSORT, (x,), {"axis": axis, "descending": bool(descending)})


def topk(x, k, dim=None, largest=True, sorted=True, *, axis=None):
    """The `k` largest (or smallest) values along `dim` (default -1) and their int64
    indices, as a ``(values, indices)`` named tuple.

    Results always come sorted (a valid order for sorted=False too).

    Example::

        >>> v, i = sampan.topk(sampan.tensor([1.0, 5.0, 3.0]), 2)
        >>> v.tolist(), i.tolist()
        ([5.0, 3.0], [1, 2])
    """
    from .shape import reshape
    x, axis, scalar = _prep(x, _dim("topk", dim, axis), "topk")
    xs = reshape(x, (1,)) if scalar else x
    attrs = {"k": int(k), "axis": axis, "largest": bool(largest), "sorted": bool(sorted)}
    TOPK.shape_rule(Spec(tuple(xs.shape), xs.dtype), **attrs)   # a bad k would not fail
    outs = apply(TOPK, (xs,), attrs)
    return return_types.topk(*_unzero(outs, scalar))
