"""Reductions: sum, mean, max/min (and arg-variants), prod, all/any, cumsum.

Float16/bfloat16 reductions accumulate in float32 and round the result
(numpy on ml_dtypes would otherwise accumulate in bfloat16)."""
from __future__ import annotations

import builtins

import numpy as np

from .. import dtypes as _dt, return_types
from ..tensor import Tensor, apply
from ._util import Sample, norm_axis, pick, randf, rng
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, Spec, defop
from .shape import expand, reshape


def _red_shape(x, axis, keepdims):
    axes = norm_axis(axis, len(x.shape))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def _red_rule(out_dtype=None):
    def rule(x, axis=None, keepdims=False):
        return Spec(_red_shape(x, axis, keepdims), np.dtype(out_dtype) if out_dtype else x.dtype)
    return rule


def _accumulate(f, a, axis, keepdims):
    """f (np.sum, np.mean, np.prod) over `axis`; half types accumulate in float32."""
    if a.dtype.itemsize == 2 and a.dtype.name in ("float16", "bfloat16"):
        return np.asarray(f(a, axis=axis, keepdims=keepdims, dtype=np.float32)).astype(a.dtype)
    return f(a, axis=axis, keepdims=keepdims)


def _acc_kernel(f):
    def k(a, axis=None, keepdims=False):
        return _accumulate(f, a, axis, keepdims)
    return k


def _red_flops(x, axis=None, keepdims=False):
    n = 1
    for d in x.shape:
        n *= d if isinstance(d, int) else 1
    return n


def _red_samples():
    r = rng(11)
    x = randf(r, 3, 4, 5)
    return [Sample((x,), {"axis": None, "keepdims": False}),
            Sample((x,), {"axis": (1,), "keepdims": True}),
            Sample((x,), {"axis": (0, 2), "keepdims": False}),
            Sample((randf(r, 4),), {"axis": (0,), "keepdims": False}),
            Sample((randf(r, 0, 3),), {"axis": (0,), "keepdims": False})]


def _keep_shape(x, axis):
    return tuple(1 if i in norm_axis(axis, len(x.shape)) else d for i, d in enumerate(x.shape))


def _expand_back(g, x, axis, keepdims):
    if not keepdims:
        g = reshape(g, _keep_shape(x, axis))
    return expand(g, tuple(x.shape))


def _sum_kernel(a, axis=None, keepdims=False):
    return _accumulate(np.sum, a, axis, keepdims)


SUM = defop("sum", _red_rule(), kernel=_sum_kernel, kind="reduction", scalar="a + b",
            grad=lambda g, y, x, axis=None, keepdims=False: _expand_back(g, x, axis, keepdims),
            saves=(), flops=_red_flops, onnx="ReduceSum", samples=_red_samples, amp="float32")


def _mean_grad(g, y, x, axis=None, keepdims=False):
    from .elementwise import div
    n = 1
    for i in norm_axis(axis, len(x.shape)):
        n *= x.shape[i]
    return div(_expand_back(g, x, axis, keepdims), float(builtins.max(n, 1)))


def _reduced_shape(a, axis, keepdims):
    """The shape of a reduction of array `a` over `axis` (None, an int or a tuple)."""
    if axis is None:
        axes = range(a.ndim)
    else:
        axes = [x % a.ndim for x in ((axis,) if isinstance(axis, int) else axis)]
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(a.shape))
    return tuple(d for i, d in enumerate(a.shape) if i not in axes)


def _mean_kernel(a, axis=None, keepdims=False):
    if not a.size:   # the mean of nothing is NaN (PyTorch's value), without numpy's warning
        return np.full(_reduced_shape(a, axis, keepdims), np.nan, a.dtype)
    return _accumulate(np.mean, a, axis, keepdims)


MEAN = defop("mean", _red_rule(), kernel=_mean_kernel, kind="reduction",
             scalar="a + b", grad=_mean_grad, saves=(), flops=_red_flops, onnx="ReduceMean",
             samples=lambda: _red_samples()[:4], amp="float32")


def _minmax_grad(g, y, x, axis=None, keepdims=False):
    from .elementwise import cast, div, eq, mul
    yk = y if keepdims else reshape(y, _keep_shape(x, axis))
    mask = cast(eq(x, yk), x.dtype)
    count = sum(mask, axis, keepdims=True)
    return div(mul(_expand_back(g, x, axis, keepdims), mask), count)


def _max_kernel(f):
    def k(a, axis=None, keepdims=False):
        return f(a, axis=axis, keepdims=keepdims)
    return k


def _amax_kernel(a, axis=None, keepdims=False):
    return np.max(a, axis=axis, keepdims=keepdims)


def _amin_kernel(a, axis=None, keepdims=False):
    return np.min(a, axis=axis, keepdims=keepdims)


def _minmax_samples():
    return [s for s in _red_samples() if s.args[0].size]


MAX = defop("max", _red_rule(), kernel=_amax_kernel, kind="reduction",
            scalar="max(a, b)", grad=_minmax_grad, save_output=True, flops=_red_flops,
            onnx="ReduceMax", samples=_minmax_samples)
MIN = defop("min", _red_rule(), kernel=_amin_kernel, kind="reduction",
            scalar="min(a, b)", grad=_minmax_grad, save_output=True, flops=_red_flops,
            onnx="ReduceMin", samples=_minmax_samples)


def _prod_grad(g, y, x, axis=None, keepdims=False):
    """d prod(x) / d x_i = the product of the other elements, zeros included (PyTorch's
    rule). y / x gave 0/0 = NaN at a zero. Written with where-masked safe operands, so
    no branch computes an inf that a zero gradient would turn into NaN, and the rule is
    itself differentiable: exact second order for any number of zeros."""
    from .elementwise import cast, div, eq, mul, sub, where
    iz = eq(x, 0.0)
    nonzero = where(iz, 1.0, x)          # the zeros replaced by 1
    zeros = where(iz, x, 1.0)            # the non-zeros replaced by 1 (values 0 or 1)
    p = prod(nonzero, axis, keepdims=True)           # product of the non-zero elements
    nz = sum(cast(iz, x.dtype), axis, keepdims=True)  # how many zeros
    # at a zero: the product of the other zeros (1 for none; for one other zero its
    # value, 0, so its derivative is right; 0 for more) times the non-zero product
    s = sum(where(iz, x, 0.0), axis, keepdims=True)
    other_zeros = where(eq(nz, 1.0), 1.0, where(eq(nz, 2.0), sub(s, x), 0.0))
    # elsewhere: (product of the zeros) * (non-zero product) / x_i
    others = where(iz, mul(p, other_zeros),
                   div(mul(prod(zeros, axis, keepdims=True), p), nonzero))
    return mul(_expand_back(g, x, axis, keepdims), others)


def _prod_samples():
    r = rng(12)
    x = randf(r, 3, 4, low=0.5, high=1.5)
    z = randf(r, 4, 5, low=0.5, high=1.5)
    z[0, 1] = 0.0                      # one zero in a row
    z[1, 0] = z[1, 3] = 0.0            # two zeros
    z[2, :3] = 0.0                     # three zeros
    return [Sample((x,), {"axis": (1,), "keepdims": False}),
            Sample((z,), {"axis": (1,), "keepdims": False}),
            Sample((z,), {"axis": None, "keepdims": False}),
            Sample((z,), {"axis": (0,), "keepdims": True})]


PROD = defop("prod", _red_rule(), kernel=_acc_kernel(np.prod), kind="reduction",
             scalar="a * b", grad=_prod_grad, flops=_red_flops,
             onnx="ReduceProd", samples=_prod_samples, amp="float32")


def _argrule(x, axis=None, keepdims=False):
    if axis is None:
        return Spec((1,) * len(x.shape) if keepdims else (), np.dtype(np.int64))
    return Spec(_red_shape(x, axis, keepdims), np.dtype(np.int64))


def _arg_samples():
    r = rng(13)
    return [Sample((randf(r, 3, 4),), {"axis": 1, "keepdims": False}),
            Sample((randf(r, 3, 4),), {"axis": None, "keepdims": False}),
            Sample((randf(r, 2, 3, 4),), {"axis": 0, "keepdims": True})]


# plain defs (not made by a factory), so `sampan deploy` can copy them into a module
def _argmax_kernel(a, axis=None, keepdims=False):
    return np.asarray(np.argmax(a, axis=axis, keepdims=keepdims), dtype=np.int64)


def _argmin_kernel(a, axis=None, keepdims=False):
    return np.asarray(np.argmin(a, axis=axis, keepdims=keepdims), dtype=np.int64)


ARGMAX = defop("argmax", _argrule, kernel=_argmax_kernel, kind="reduction",
               grad=NOT_DIFFERENTIABLE, flops=_red_flops, onnx="ArgMax", samples=_arg_samples)
ARGMIN = defop("argmin", _argrule, kernel=_argmin_kernel, kind="reduction",
               grad=NOT_DIFFERENTIABLE, flops=_red_flops, onnx="ArgMin", samples=_arg_samples)

_bool_red = [Sample((rng(14).random((3, 4)) > 0.3,), {"axis": (1,), "keepdims": False}),
             Sample((rng(15).random((3, 4)) > 0.3,), {"axis": None, "keepdims": False})]
ALL = defop("all", _red_rule(np.bool_), kernel=_max_kernel(np.all), kind="reduction",
            grad=NOT_DIFFERENTIABLE, flops=_red_flops, onnx=NO_ONNX, samples=lambda: _bool_red)
ANY = defop("any", _red_rule(np.bool_), kernel=_max_kernel(np.any), kind="reduction",
            grad=NOT_DIFFERENTIABLE, flops=_red_flops, onnx=NO_ONNX, samples=lambda: _bool_red)


def _cumsum_kernel(a, axis):
    if a.dtype == _dt.bfloat16 or a.dtype == np.float16:
        return np.cumsum(a, axis=axis, dtype=np.float32).astype(a.dtype)
    return np.cumsum(a, axis=axis)


def _cumsum_grad(g, y, x, axis):
    from .shape import flip
    return flip(cumsum(flip(g, (axis,)), axis), (axis,))


CUMSUM = defop("cumsum", lambda x, axis: Spec(x.shape, x.dtype), kernel=_cumsum_kernel,
               kind="opaque", grad=_cumsum_grad, saves=(), flops=_red_flops, onnx="CumSum",
               samples=lambda: [Sample((randf(rng(16), 3, 4),), {"axis": 1}),
                                Sample((randf(rng(17), 5),), {"axis": 0})], amp="float32")


# ---------------------------------------------------------------------- frontends
# Every frontend takes PyTorch's names first (`dim`, `keepdim`) and numpy's/Paddle's
# (`axis`, `keepdims`) as keywords; giving both is an error. The common call (positional
# or PyTorch names) costs two `is not None` checks.
def _axis_attr(x, axis):
    if axis is None:
        return None
    return norm_axis(axis, x.ndim, "reduce")


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _int_to_i64(x, dtype):
    """PyTorch's accumulating reductions (sum, prod, cumsum) give int64 for bool and
    integer inputs unless `dtype` says otherwise; `dtype` casts the input first."""
    from .elementwise import cast
    if dtype is not None:
        return cast(x, dtype) if _dt.as_dtype(dtype) != x.dtype else x
    d = x.dtype
    if d == np.bool_ or (d.kind in "iu" and d != _dt.int64):
        return cast(x, _dt.int64)
    return x


def sum(x, dim=None, keepdim=None, dtype=None, *, axis=None, keepdims=None):
    """Sum over `dim` (int, tuple or None for all); bool and integer inputs sum in int64.

    Example::

        >>> sampan.sum(sampan.ones(2, 3), dim=1).tolist()
        [3.0, 3.0]
    """
    if axis is not None:
        dim = axis if dim is None else pick("sum", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("sum", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    if dtype is not None or x.dtype.kind in "biu":
        x = _int_to_i64(x, dtype)
    return apply(SUM, (x,), {"axis": _axis_attr(x, dim), "keepdims": bool(keepdim)})


def mean(x, dim=None, keepdim=None, dtype=None, *, axis=None, keepdims=None):
    """Mean over `dim` (integer inputs: in the default float dtype). Example: ``x.mean(0)``."""
    if axis is not None:
        dim = axis if dim is None else pick("mean", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("mean", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    if dtype is not None or not _dt.is_floating(x.dtype):
        from .elementwise import cast
        d = _dt.get_default_dtype() if dtype is None else _dt.as_dtype(dtype)
        if d != x.dtype:
            x = cast(x, d)
    return apply(MEAN, (x,), {"axis": _axis_attr(x, dim), "keepdims": bool(keepdim)})


def amax(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """Maximum over `dim` (ties share the gradient). Example: ``sampan.amax(x, dim=1)``."""
    if axis is not None:
        dim = axis if dim is None else pick("amax", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("amax", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    return apply(MAX, (x,), {"axis": _axis_attr(x, dim), "keepdims": bool(keepdim)})


def amin(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """Minimum over `dim` (ties share the gradient)."""
    if axis is not None:
        dim = axis if dim is None else pick("amin", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("amin", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    return apply(MIN, (x,), {"axis": _axis_attr(x, dim), "keepdims": bool(keepdim)})


def prod(x, dim=None, keepdim=None, dtype=None, *, axis=None, keepdims=None):
    """Product over `dim`; bool and integer inputs multiply in int64."""
    if axis is not None:
        dim = axis if dim is None else pick("prod", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("prod", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    if dtype is not None or x.dtype.kind in "biu":
        x = _int_to_i64(x, dtype)
    return apply(PROD, (x,), {"axis": _axis_attr(x, dim), "keepdims": bool(keepdim)})


def _one_axis(op, x, dim):
    if isinstance(dim, (tuple, list)):
        if len(dim) != 1:
            from ..errors import SampanValueError, op_error
            raise op_error(SampanValueError, op, f"dim={tuple(dim)}", "one int dim (or None)")
        dim = dim[0]
    return norm_axis(dim, x.ndim, op)[0]


def argmax(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """Index of the maximum (int64; over all elements when `dim` is None).
    Example: ``logits.argmax(dim=-1)``."""
    if axis is not None:
        dim = axis if dim is None else pick("argmax", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("argmax", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    ax = None if dim is None else _one_axis("argmax", x, dim)
    return apply(ARGMAX, (x,), {"axis": ax, "keepdims": bool(keepdim)})


def argmin(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """Index of the minimum (int64)."""
    if axis is not None:
        dim = axis if dim is None else pick("argmin", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("argmin", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    ax = None if dim is None else _one_axis("argmin", x, dim)
    return apply(ARGMIN, (x,), {"axis": ax, "keepdims": bool(keepdim)})


def all(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """True where every element is true (over `dim`: int, tuple or None)."""
    from .elementwise import cast
    if axis is not None:
        dim = axis if dim is None else pick("all", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("all", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    x = x if x.dtype == np.bool_ else cast(x, "bool")
    return apply(ALL, (x,), {"axis": _axis_attr(x, dim), "keepdims": bool(keepdim)})


def any(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """True where some element is true (over `dim`: int, tuple or None)."""
    from .elementwise import cast
    if axis is not None:
        dim = axis if dim is None else pick("any", "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick("any", "keepdim", keepdim, "keepdims", keepdims))
    x = _t(x)
    x = x if x.dtype == np.bool_ else cast(x, "bool")
    return apply(ANY, (x,), {"axis": _axis_attr(x, dim), "keepdims": bool(keepdim)})


def cumsum(x, dim=None, *, dtype=None, axis=None):
    """Running sum along `dim` (bool and integer inputs: in int64, as PyTorch).

    Example::

        >>> sampan.cumsum(sampan.tensor([1, 2, 3]), dim=0).tolist()
        [1, 3, 6]
    """
    if axis is not None:
        dim = axis if dim is None else pick("cumsum", "dim", dim, "axis", axis)
    x = _t(x)
    if dim is None:
        from ..errors import SampanValueError, op_error
        raise op_error(SampanValueError, "cumsum", "no dim", "dim= (or axis=)")
    if dtype is not None or x.dtype.kind in "biu":
        x = _int_to_i64(x, dtype)
    if x.ndim == 0:
        return x
    return apply(CUMSUM, (x,), {"axis": _one_axis("cumsum", x, dim)})


def _values_at(x, idx, axis, keepdims):
    """The values of `x` at the indices `idx` (keepdims form) along `axis`: their gradient
    goes to those indices only."""
    from .index import take_along_axis
    from .shape import squeeze
    v = take_along_axis(x, idx, axis)
    return v if keepdims else squeeze(v, axis)


def _minmax(name, arg, reduce_all, pair, x, dim, keepdim, axis, keepdims):
    if axis is not None:
        dim = axis if dim is None else pick(name, "dim", dim, "axis", axis)
    if keepdims is not None:
        keepdim = (keepdims if keepdim is None else
                   pick(name, "keepdim", keepdim, "keepdims", keepdims))
    if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
        x = _t(x)
        if x.ndim == 0:      # PyTorch: dim 0 (or -1) of a scalar is the scalar, index 0
            norm_axis(dim, 0, name)
            return getattr(return_types, name)(x, _t(np.zeros((), np.int64)))
        ax = norm_axis(dim, x.ndim, name)[0]
        idx = arg(x, ax, keepdim=True)
        vals = _values_at(x, idx, ax, keepdim)
        return getattr(return_types, name)(vals, idx if keepdim else _drop(idx, ax))
    if isinstance(dim, (Tensor, np.ndarray)):   # max(a, b): elementwise, as torch.max
        if keepdim is not None:
            from ..errors import SampanValueError, op_error
            raise op_error(SampanValueError, name, "a tensor `other` and keepdim",
                           f"{name}(input, other) or {name}(input, dim, keepdim)")
        return pair(x, dim)
    return reduce_all(x, dim, keepdim)


def max(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """The maximum. With an int `dim`: a ``(values, indices)`` named tuple, as PyTorch,
    whose values' gradient goes to the returned index (amax shares it among ties); with
    a tensor second argument: the elementwise maximum; else the maximum over `dim`
    (None: all, or a tuple).

    Example::

        >>> v, i = sampan.tensor([[1.0, 5.0], [4.0, 2.0]]).max(dim=1)
        >>> v.tolist(), i.tolist()
        ([5.0, 4.0], [1, 0])
    """
    from .elementwise import maximum
    return _minmax("max", argmax, amax, maximum, x, dim, keepdim, axis, keepdims)


def min(x, dim=None, keepdim=None, *, axis=None, keepdims=None):
    """The minimum: as `max` (``(values, indices)`` for an int `dim`, the elementwise
    minimum for a tensor second argument)."""
    from .elementwise import minimum
    return _minmax("min", argmin, amin, minimum, x, dim, keepdim, axis, keepdims)


def _drop(idx, axis):
    from .shape import squeeze
    return squeeze(idx, axis)
