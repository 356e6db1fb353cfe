"""(issue 17) Scans: cumprod, cummax/cummin, logcumsumexp (primitives), diff (a composite);
the order statistics (median, quantile, mode, kthvalue, searchsorted …) are in `_order.py`
and exported from here.

`EXPORTS` lists the functions exported as `sampan.<name>`, `METHODS` the Tensor methods and
`INPLACE` the in-place methods (bound by `sampan/_tensor_methods.py`)."""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor, apply
from . import _order
from ._nb import njit
from ._util import Sample, norm_axis, pick, randf, rng
from .composite import COMPOSITES
from .registry import NO_ONNX, Spec, defop

_I64 = np.dtype(np.int64)
ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _low(a):
    return a.dtype == _dt.bfloat16 or a.dtype == np.float16


def _flops(x, **k):
    n = 1
    for d in x.shape:
        n *= d if isinstance(d, int) else 1
    return n


def _axis_ok(op, x, axis):
    if not 0 <= axis < max(len(x.shape), 1):
        raise op_error(ShapeError, op, f"axis {axis} for a {len(x.shape)}-d input",
                       "a normalised axis in range")


def _scan_axis(op, x, dim, axis):
    """The normalised axis of a scan: `dim=` (or `axis=`) is required, as in PyTorch."""
    d = pick(op, "dim", dim, "axis", axis)
    if d is None:
        raise op_error(SampanValueError, op, "no dim", "dim= (the dim to scan along)")
    return norm_axis(d, max(x.ndim, 1), op)[0]


def _revcumsum(t, axis):
    from .reduce import cumsum
    from .shape import flip
    return flip(cumsum(flip(t, (axis,)), axis), (axis,))


# ---------------------------------------------------------------------- cumprod
def _cumprod_rule(x, axis):
    _axis_ok("cumprod", x, axis)
    return Spec(tuple(x.shape), x.dtype)


def _cumprod_kernel(a, axis):
    if _low(a):
        return np.cumprod(a, axis=axis, dtype=np.float32).astype(a.dtype)
    return np.cumprod(a, axis=axis)


def _cumprod_grad_value(g, y, x, axis):
    # d y_j / d x_i = prod_{k <= j, k != i} x_k. Before the first zero of a row that is
    # y_j / x_i; at the first zero it is the cumprod with that zero replaced by 1; after
    # it, every product holds the zero. Right in value; after the first zero not in its
    # derivative (see _cumprod_grad)
    from .elementwise import cast, div, eq, logical_and, mul, where
    from .reduce import cumsum
    zero = eq(x, 0.0)
    nz = cumsum(cast(zero, "int64"), axis)
    before = eq(nz, 0)
    first = logical_and(zero, eq(nz, 1))
    plain = div(_revcumsum(mul(g, y), axis), where(zero, 1.0, x))
    x1 = where(first, 1.0, x)                # the first zero replaced by 1
    y1 = cumprod(x1, axis)
    at_first = _revcumsum(mul(g, y1), axis)
    return before, first, plain, at_first, x1, y1


def _cumprod_grad(g, y, x, axis):
    # After the first zero z of a row the gradient is 0, but not constant: it is
    # x_z * (the same gradient of the row with x_z replaced by 1), whose derivative in x_z
    # double backward needs (a constant 0 there gave wrong second derivatives). The
    # factor is needed in value only (its derivative is multiplied by x_z = 0), so it is
    # the value formula once more, not this rule recursively
    from .elementwise import mul, where
    from .reduce import sum as rsum
    before, first, plain, at_first, x1, y1 = _cumprod_grad_value(g, y, x, axis)
    before1, first1, plain1, at_first1, _, _ = _cumprod_grad_value(g, y1, x1, axis)
    after = where(before1, plain1, where(first1, at_first1, 0.0))
    xz = rsum(where(first, x, 0.0), axis, keepdim=True)       # x at the first zero (0)
    return (where(before, plain, where(first, at_first, mul(xz, after))),)


CUMPROD = defop(
    "cumprod", _cumprod_rule, kernel=_cumprod_kernel, grad=_cumprod_grad, save_output=True,
    onnx=NO_ONNX, flops=_flops,
    samples=lambda: [Sample((randf(rng(170), 3, 4),), {"axis": 1}),
                     # zeros: one, two in a row and a row without any
                     Sample((np.array([[1.5, 0.0, 2.0, -1.0], [0.0, 0.5, 0.0, 3.0],
                                       [2.0, -0.5, 1.5, 1.2]]),), {"axis": 1})], amp="float32")


def cumprod(input, dim=None, *, axis=None, dtype=None):
    """Running product along `dim`; the gradient is right where the input has zeros.
    Example: ``sampan.cumprod(x, 1)``."""
    x = _t(input)
    if dtype is not None:
        from .elementwise import cast
        x = cast(x, dtype)
    a = _scan_axis("cumprod", x, dim, axis)
    if x.ndim == 0:
        return x
    return apply(CUMPROD, (x,), {"axis": a})


# ---------------------------------------------------------------------- cummax / cummin
def _cumext_rule(op):
    def rule(x, axis):
        _axis_ok(op, x, axis)
        return Spec(tuple(x.shape), x.dtype), Spec(tuple(x.shape), _I64)
    return rule


@njit(cache=True, nogil=True)
def _cumext_rows(rows, vals, idx, largest):
    for r in range(rows.shape[0]):
        cur, ci = rows[r, 0], 0
        for j in range(rows.shape[1]):
            x = rows[r, j]
            # ties take the later position; a NaN takes over and stays (as PyTorch)
            if np.isnan(x) or (not np.isnan(cur) and ((x >= cur) if largest else (x <= cur))):
                cur, ci = x, j
            vals[r, j], idx[r, j] = cur, ci


def _cumext_kernel(largest):
    def kernel(a, axis):
        m = np.moveaxis(a, axis, -1)
        shape = m.shape
        n = shape[-1]
        rows = np.ascontiguousarray(m.reshape(-1, n) if n else m.reshape(0, 0))
        key = rows.astype(np.float64) if rows.dtype.kind == "f" or _low(a) else (
            rows.view(np.uint8) if rows.dtype == np.bool_ else rows)
        vals = np.empty(key.shape, key.dtype)
        idx = np.zeros(key.shape, np.int64)
        if n:
            _cumext_rows(key, vals, idx, largest)
        # values are the input's own elements (read back through the indices)
        out = np.take_along_axis(rows, idx, axis=1) if n else rows
        return (np.ascontiguousarray(np.moveaxis(out.reshape(shape), -1, axis)),
                np.ascontiguousarray(np.moveaxis(idx.reshape(shape), -1, axis)))
    return kernel


def _cumext_grad(g, y, x, axis):
    from .creation import zeros_like
    from .index import scatter_add
    return (scatter_add(zeros_like(x), y[1], g[0], axis),)


def _cumext_samples():
    r = rng(171)
    ties = np.array([[1.0, 3.0, 3.0, 2.0, 3.0], [0.5, 0.5, -1.0, 0.5, 2.0]])
    # ties: indices checked, no finite differences (tests/ops/test_scatter_scan.py checks
    # the gradient at ties against PyTorch)
    return [Sample((randf(r, 3, 4),), {"axis": 1}), Sample((ties,), {"axis": 1}, diff=())]


CUMMAX = defop("cummax", _cumext_rule("cummax"), kernel=_cumext_kernel(True),
               grad=_cumext_grad, n_out=2, saves=(), save_output=True, onnx=NO_ONNX,
               flops=_flops, samples=_cumext_samples)
CUMMIN = defop("cummin", _cumext_rule("cummin"), kernel=_cumext_kernel(False),
               grad=_cumext_grad, n_out=2, saves=(), save_output=True, onnx=NO_ONNX,
               flops=_flops, samples=_cumext_samples)


def _cumext(op, input, dim, axis):
    from .shape import reshape
    x = _t(input)
    a = _scan_axis(op.name, x, dim, axis)
    if x.ndim == 0:
        v, i = apply(op, (reshape(x, (1,)),), {"axis": 0})
        return ValuesIndices(reshape(v, ()), reshape(i, ()))
    return ValuesIndices(*apply(op, (x,), {"axis": a}))


def cummax(input, dim=None, *, axis=None):
    """Running maximum along `dim` and the int64 index where it was found (the later one
    among ties, as PyTorch). Example: ``v, i = sampan.cummax(x, 0)``."""
    return _cumext(CUMMAX, input, dim, axis)


def cummin(input, dim=None, *, axis=None):
    """Running minimum along `dim` and the int64 index where it was found (the later one
    among ties). Example: ``v, i = sampan.cummin(x, 0)``."""
    return _cumext(CUMMIN, input, dim, axis)


# ---------------------------------------------------------------------- logcumsumexp
def _lcse_rule(x, axis):
    _axis_ok("logcumsumexp", x, axis)
    if not (x.dtype.kind == "f" or x.dtype.name == "bfloat16"):
        raise op_error(DTypeError, "logcumsumexp", f"dtype {x.dtype}", "a floating dtype")
    return Spec(tuple(x.shape), x.dtype)


def _lcse_kernel(a, axis):
    if _low(a):
        return np.logaddexp.accumulate(a.astype(np.float32), axis=axis).astype(a.dtype)
    return np.logaddexp.accumulate(a, axis=axis)


def _lcse_grad(g, y, x, axis):
    # d/dx_i = sum_{j >= i} g_j exp(x_i - y_j): the positive and negative parts of g each as
    # a reversed logcumsumexp of log|g_j| - y_j, so that nothing overflows.
    # A term with y_j = -inf (all of x_0..x_j are -inf) is 0, not exp(-inf + inf) = nan: a
    # part with no entries of its sign is all -inf, and this rule, differentiated again
    # through the inner logcumsumexp, meets exactly that (double backward was nan there and
    # the masks below turned the nan into a silently wrong 0)
    from .elementwise import add, eq, exp, gt, log, lt, neg, sub, where
    from .shape import flip
    ninf = float("-inf")
    dead = eq(y, ninf)

    def part(mask, mag):
        keep = where(mask, log(where(mask, mag, 1.0)), ninf)
        z = where(dead, ninf, sub(keep, where(dead, 0.0, y)))
        r = flip(logcumsumexp(flip(z, (axis,)), axis), (axis,))
        return exp(add(x, r))
    return (sub(part(gt(g, 0.0), g), part(lt(g, 0.0), neg(g))),)


LOGCUMSUMEXP = defop(
    "logcumsumexp", _lcse_rule, kernel=_lcse_kernel, grad=_lcse_grad, save_output=True,
    onnx=NO_ONNX, flops=_flops,
    samples=lambda: [Sample((randf(rng(172), 3, 4),), {"axis": 1}),
                     Sample((np.array([[-30.0, 2.0, 40.0], [1.0, 1.0, -5.0]]),), {"axis": 0})],
                     amp="float32")


def logcumsumexp(input, dim=None, *, axis=None):
    """log(cumsum(exp(x))) along `dim`, computed stably. Example:
    ``sampan.logcumsumexp(x, 1)``."""
    x = _t(input)
    a = _scan_axis("logcumsumexp", x, dim, axis)
    if x.ndim == 0:
        return x
    return apply(LOGCUMSUMEXP, (x,), {"axis": a})


# ---------------------------------------------------------------------- diff
def diff(input, n=1, dim=-1, prepend=None, append=None, *, axis=None):
    """The `n`-th forward difference along `dim`, after joining `prepend` and `append` to
    the input there. Example: ``sampan.diff(sampan.tensor([1, 4, 9]))`` -> [3, 5]."""
    from .elementwise import logical_xor, sub
    from .shape import concat, narrow
    x = _t(input)
    d = pick("diff", "dim", None if dim == -1 else dim, "axis", axis, -1)
    if x.ndim == 0:
        raise op_error(ShapeError, "diff", "a 0-d input", "an input with at least one dim")
    a = norm_axis(d, x.ndim, "diff")[0]
    parts = [_t(p) for p in (prepend,) if p is not None] + [x] + [
        _t(p) for p in (append,) if p is not None]
    if len(parts) > 1:
        x = concat(parts, a)
    for _ in range(int(n)):
        m = x.shape[a]
        if m == 0:
            break
        hi, lo = narrow(x, a, 1, m - 1), narrow(x, a, 0, m - 1)
        x = logical_xor(hi, lo) if x.dtype == np.bool_ else sub(hi, lo)
    return x


def _diff_samples():
    r = rng(173)
    return [Sample((randf(r, 3, 5),), {"n": 2, "dim": 1}),
            Sample((randf(r, 2, 3), randf(r, 1, 3), randf(r, 2, 3)), {"n": 1, "dim": 0})]


def _diff_args(x, prepend=None, append=None, **k):
    return diff(x, prepend=prepend, append=append, **k)


COMPOSITES["diff"] = (_diff_args, _diff_samples)

EXPORTS = ["cumprod", "cummax", "cummin", "logcumsumexp", "diff"] + _order.EXPORTS
METHODS = {"cumprod": cumprod, "cummax": cummax, "cummin": cummin,
           "logcumsumexp": logcumsumexp, "diff": diff, **_order.METHODS}
INPLACE = {"cumprod_": cumprod}
globals().update({n: getattr(_order, n) for n in _order.EXPORTS})
