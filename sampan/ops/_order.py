"""(issue 17) Order statistics: median/nanmedian, quantile/nanquantile and msort (composites
over the stable sort), mode, kthvalue and searchsorted (primitives), bucketize. Exported
through `scan.py`.

Index choice among ties follows PyTorch's CPU kernels: median takes the stable sort's
position (ties in input order), mode the last occurrence of the most frequent value (the
smallest such value), kthvalue the element PyTorch's quickselect leaves at position k."""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..ir.symint import deciding
from ..tensor import Tensor, apply
from ._nb import njit
from ._util import Sample, norm_axis, pick, randf, rng
from .composite import COMPOSITES
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, Spec, defop

_I64 = np.dtype(np.int64)
ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _isfloat(d):
    return d.kind == "f" or d == _dt.bfloat16


def _flops(x, *a, **k):
    n = 1
    for d in x.shape:
        n *= d if isinstance(d, int) else 1
    return n


def _reduced(shape, axis, keepdim):
    return tuple(1 if i == axis else d for i, d in enumerate(shape)) if keepdim else tuple(
        d for i, d in enumerate(shape) if i != axis)


def _rows(a, axis):
    """`a` with `axis` moved last, as (rows, n) float64 (NaN compares as in PyTorch)."""
    m = np.moveaxis(a, axis, -1)
    return m.reshape(-1, m.shape[-1]), m.shape[:-1]


def _finish(vals, idx, lead, a, axis, keepdim):
    vals = vals.reshape(lead).astype(a.dtype)
    idx = idx.reshape(lead)
    if keepdim:
        vals, idx = np.expand_dims(vals, axis), np.expand_dims(idx, axis)
    return vals, idx


def _select_grad(g, y, x, *a, axis, keepdim, **k):
    """Gradient of a value-selecting reduction: g to the selected index."""
    from .creation import zeros_like
    from .index import scatter_add
    from .shape import unsqueeze
    gv, idx = g[0], y[1]
    if not keepdim:
        gv, idx = unsqueeze(gv, axis), unsqueeze(idx, axis)
    return (scatter_add(zeros_like(x), idx, gv, axis),)


def _sel_rule(op):
    def rule(x, *a, axis, keepdim, k=None):
        if not 0 <= axis < max(len(x.shape), 1):
            raise op_error(ShapeError, op, f"axis {axis} for a {len(x.shape)}-d input",
                           "a normalised axis in range")
        n = x.shape[axis]
        if isinstance(n, int) and (n == 0 or (k is not None and not 1 <= k <= n)):
            raise op_error(SampanValueError, op, f"k={k} for a dim of length {n}"
                           if k is not None else "an empty dim", f"1 <= k <= {n}"
                           if k is not None else "a non-empty dim")
        s = _reduced(tuple(x.shape), axis, keepdim)
        return Spec(s, x.dtype), Spec(s, _I64)
    return rule


# ---------------------------------------------------------------------- mode
def _mode_kernel(a, axis, keepdim):
    rows, lead = _rows(a, axis)
    nr, n = rows.shape
    order = np.argsort(rows, axis=1, kind="stable")
    srt = np.take_along_axis(rows, order, axis=1)
    run = np.zeros((nr, n), np.int64)             # the run of equal values each is in
    run[:, 1:] = np.cumsum(srt[:, 1:] != srt[:, :-1], axis=1)
    counts = np.zeros((nr, n), np.int64)
    np.add.at(counts, (np.arange(nr)[:, None], run), 1)
    best = np.argmax(counts, axis=1)[:, None]     # the first (smallest) most frequent value
    inbest = run == best
    idx = np.where(inbest, order, -1).max(axis=1)   # its last occurrence
    vals = rows[np.arange(nr), idx]
    return _finish(vals, idx.astype(np.int64), lead, a, axis, keepdim)


MODE = defop(
    "mode", _sel_rule("mode"), kernel=_mode_kernel, grad=_select_grad, n_out=2, saves=(),
    save_output=True, onnx=NO_ONNX, flops=_flops,
    samples=lambda: [Sample((np.array([[2.0, 1.0, 2.0, 1.0, 5.0, 1.0],
                                       [3.0, 0.5, 0.5, 3.0, 1.0, 4.0]]),),
                            {"axis": 1, "keepdim": False}, diff=()),   # ties: no gradcheck
                     Sample((np.array([[1, 2, 2], [1, 1, 2], [3, 2, 2]]),),
                            {"axis": 0, "keepdim": True})])


# ---------------------------------------------------------------------- kthvalue
@njit(cache=True, nogil=True)
def _gt_nan(x, y):
    return (np.isnan(x) and not np.isnan(y)) or x > y


@njit(cache=True, nogil=True)
def _swap(a, ii, s, t):
    a[s], a[t] = a[t], a[s]
    ii[s], ii[t] = ii[t], ii[s]


@njit(cache=True, nogil=True)
def _quickselect(vals, idx, k):
    """Median-of-three quickselect of each row (in place, values and positions together),
    the selection scheme of PyTorch's CPU kthvalue, so ties resolve to the same index."""
    for r in range(vals.shape[0]):
        a, ii = vals[r], idx[r]
        lo, hi = 0, a.shape[0] - 1
        while hi > lo:
            if hi == lo + 1:
                if _gt_nan(a[lo], a[hi]):
                    _swap(a, ii, lo, hi)
                break
            _swap(a, ii, lo + (hi - lo) // 2, lo + 1)   # the middle element, then order
            if _gt_nan(a[lo + 1], a[hi]):                 # a[lo+1] <= a[lo] <= a[hi]
                _swap(a, ii, lo + 1, hi)
            if _gt_nan(a[lo], a[hi]):
                _swap(a, ii, lo, hi)
            if _gt_nan(a[lo + 1], a[lo]):
                _swap(a, ii, lo + 1, lo)
            i, j, piv = lo + 1, hi, a[lo]
            while True:
                i += 1
                while _gt_nan(piv, a[i]):
                    i += 1
                j -= 1
                while _gt_nan(a[j], piv):
                    j -= 1
                if j < i:
                    break
                _swap(a, ii, i, j)
            _swap(a, ii, lo, j)
            if j <= k:
                lo = i
            if j >= k:
                hi = j - 1


def _kth_kernel(a, k, axis, keepdim):
    rows, lead = _rows(a, axis)
    vals = np.array(rows, dtype=np.float64)   # a copy: the selection reorders it
    idx = np.tile(np.arange(rows.shape[1], dtype=np.int64), (rows.shape[0], 1))
    _quickselect(vals, idx, k - 1)
    # values come from the input itself (exact for int64 beyond 2**53 too)
    pos = idx[:, k - 1]
    return _finish(rows[np.arange(rows.shape[0]), pos], pos, lead, a, axis, keepdim)


KTHVALUE = defop(
    "kthvalue", _sel_rule("kthvalue"), kernel=_kth_kernel, grad=_select_grad, n_out=2,
    saves=(), save_output=True, onnx=NO_ONNX, flops=_flops,
    samples=lambda: [Sample((randf(rng(180), 3, 5),), {"k": 2, "axis": 1, "keepdim": False}),
                     Sample((np.array([[2.0, 1.0, 2.0, 1.0, 5.0, 1.0],
                                       [3.0, 3.0, 3.0, 3.0, 1.0, 1.0]]),),
                            {"k": 3, "axis": 1, "keepdim": True}, diff=())])


def _sel_front(op, input, dim, axis, keepdim, **attrs):
    from .shape import reshape
    x = _t(input)
    d = pick(op.name, "dim", dim, "axis", axis, -1)
    if x.ndim == 0:
        v, i = apply(op, (reshape(x, (1,)),), {**attrs, "axis": 0, "keepdim": False})
        return ValuesIndices(reshape(v, ()), reshape(i, ()))
    a = norm_axis(d, x.ndim, op.name)[0]
    return ValuesIndices(*apply(op, (x,), {**attrs, "axis": a, "keepdim": bool(keepdim)}))


def mode(input, dim=-1, keepdim=False, *, axis=None):
    """The most frequent value along `dim` (the smallest among equally frequent ones) and
    the index of its last occurrence, as PyTorch. Example: ``v, i = sampan.mode(x, 1)``."""
    return _sel_front(MODE, input, None if dim == -1 else dim, axis, keepdim)


def kthvalue(input, k, dim=-1, keepdim=False, *, axis=None):
    """The `k`-th smallest value along `dim` (k from 1) and its index. Example:
    ``v, i = sampan.kthvalue(x, 2, 0)``."""
    return _sel_front(KTHVALUE, input, None if dim == -1 else dim, axis, keepdim, k=int(k))


# ---------------------------------------------------------------------- median / quantile
def _sorted_along(x, axis):
    from .sort import sort
    return sort(x, axis)


def _nan_count(x, axis):
    from .elementwise import cast, ne
    from .reduce import sum
    return sum(cast(ne(x, x), "int64"), axis, keepdims=True)


def _median_dim(x, axis, keepdim, ignore_nan):
    from .creation import full
    from .elementwise import clamp, floor_divide, gt, sub, where
    from .index import take_along_axis
    from .shape import squeeze
    n = x.shape[axis]
    with deciding():
        empty = n == 0
    if empty:
        raise op_error(SampanValueError, "median", "an empty dim", "a non-empty dim")
    srt, order = _sorted_along(x, axis)
    keep = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
    if not _isfloat(x.dtype):
        k = full(keep, (n - 1) // 2, dtype="int64")
    elif ignore_nan:   # the lower median of the values that are not NaN
        k = clamp(floor_divide(sub(n - 1, _nan_count(x, axis)), 2), 0, None)
    else:              # a row with a NaN gives its first NaN (sorted last, in input order)
        nans = _nan_count(x, axis)
        k = where(gt(nans, 0), sub(n, nans), full(keep, (n - 1) // 2, dtype="int64"))
    v, i = take_along_axis(srt, k, axis), take_along_axis(order, k, axis)
    if not keepdim:
        v, i = squeeze(v, axis), squeeze(i, axis)
    return ValuesIndices(v, i)


def _median_all(x, ignore_nan):
    # PyTorch's gradient of the median of all elements is shared by the elements equal to
    # it: written as the mean of those elements, with the median itself a constant
    from .elementwise import cast, eq, where
    from .reduce import sum
    from .shape import reshape
    flat = reshape(x, (-1,))
    if flat.shape[0] == 0:
        raise op_error(SampanValueError, "median", "an empty input", "a non-empty input")
    v = _median_dim(flat, 0, False, ignore_nan).values
    if not (x.requires_grad and _isfloat(x.dtype)):
        return v
    same = eq(flat, v.detach())
    cnt = sum(cast(same, _dt.dtype_name(x.dtype)))
    picked = sum(where(same, flat, 0.0))
    from .elementwise import div
    return where(eq(cnt, 0.0), v, div(picked, where(eq(cnt, 0.0), 1.0, cnt)))


def median(input, dim=None, keepdim=False, *, axis=None):
    """The lower median (PyTorch's: the smaller of the two middle values), of all elements
    or along `dim` with its index as (values, indices); NaN where a NaN is present.
    Example: ``sampan.median(x)``, ``v, i = sampan.median(x, 1)``."""
    x = _t(input)
    d = pick("median", "dim", dim, "axis", axis)
    if d is None:
        return _median_all(x, False)
    if x.ndim == 0:
        return ValuesIndices(_median_all(x, False), Tensor(np.zeros((), np.int64)))
    return _median_dim(x, norm_axis(d, x.ndim, "median")[0], keepdim, False)


def nanmedian(input, dim=None, keepdim=False, *, axis=None):
    """`median` ignoring NaN values (NaN only where all are NaN). Example:
    ``sampan.nanmedian(x, 0)``."""
    x = _t(input)
    d = pick("nanmedian", "dim", dim, "axis", axis)
    if d is None:
        return _median_all(x, True)
    return _median_dim(x, norm_axis(d, x.ndim, "nanmedian")[0], keepdim, True)


_INTERP = ("linear", "lower", "higher", "midpoint", "nearest")


def _q_values(op, q):
    qa = np.asarray(q._data if isinstance(q, Tensor) else q, dtype=np.float64)
    if qa.ndim > 1 or not np.all((qa >= 0) & (qa <= 1)):
        raise op_error(SampanValueError, op, f"q={qa.tolist()}",
                       "a float or 1-d tensor of values in [0, 1]")
    return qa


def _quantile(op, input, q, dim, keepdim, interpolation, ignore_nan):
    from .creation import full
    from .elementwise import (add, cast, ceil, clamp, floor, gt, lt, mul, round, sub, where)
    from .index import take_along_axis
    from .shape import reshape, squeeze, stack
    x = _t(input)
    if not _isfloat(x.dtype):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a floating input")
    if interpolation not in _INTERP:
        raise op_error(SampanValueError, op, f"interpolation={interpolation!r}",
                       "one of " + ", ".join(_INTERP))
    qa = _q_values(op, q)
    nd = x.ndim
    if dim is None:
        x, a = reshape(x, (-1,)), 0
    else:
        a = norm_axis(dim, x.ndim, op)[0]
    n = x.shape[a]
    with deciding():
        empty = n == 0
    if empty:
        raise op_error(SampanValueError, op, "an empty dim", "a non-empty dim")
    srt, _ = _sorted_along(x, a)
    dt = _dt.dtype_name(x.dtype)
    keep = tuple(1 if i == a else d for i, d in enumerate(x.shape))
    nans = _nan_count(x, a)
    last = sub(sub(n, nans), 1) if ignore_nan else full(keep, n - 1, dtype="int64")
    outs = []
    for qv in qa.reshape(-1):
        rank = mul(cast(last, dt), full((), float(qv), dtype=dt))   # in x's dtype, as torch
        if interpolation == "nearest":
            lo = hi = round(rank)
        else:
            lo, hi = floor(rank), ceil(rank)
        below = take_along_axis(srt, clamp(cast(lo, "int64"), 0, n - 1), a)
        above = take_along_axis(srt, clamp(cast(hi, "int64"), 0, n - 1), a)
        if interpolation in ("lower", "nearest"):
            v = below
        elif interpolation == "higher":
            v = above
        elif interpolation == "midpoint":
            v = mul(add(below, above), 0.5)
        else:   # torch's lerp: from the nearer end
            w = sub(rank, lo)
            v = where(lt(w, 0.5), add(below, mul(w, sub(above, below))),
                      sub(above, mul(sub(above, below), sub(1.0, w))))
        if not ignore_nan:
            v = where(gt(nans, 0), float("nan"), v)
        if dim is None:
            v = reshape(v, (1,) * nd if keepdim else ())
        elif not keepdim:
            v = squeeze(v, a)
        outs.append(v)
    return stack(outs, 0) if qa.ndim == 1 else outs[0]


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """The `q`-th quantiles (a float or a 1-d tensor of them, which adds a leading dim) of
    all elements or along `dim`, interpolating as `interpolation` ("linear", "lower",
    "higher", "midpoint", "nearest"); NaN where a NaN is present. `q`'s values are read
    as constants. Example: ``sampan.quantile(x, 0.25, dim=1)``."""
    return _quantile("quantile", input, q, dim, keepdim, interpolation, False)


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """`quantile` ignoring NaN values. Example: ``sampan.nanquantile(x, 0.5)``."""
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, True)


def msort(input):
    """`input` sorted along its first dim (values only). Example: ``sampan.msort(x)``."""
    from .sort import sort
    return sort(input, 0)[0]


# ---------------------------------------------------------------------- searchsorted
def _ss_rule(seq, vals, right):
    if seq.dtype != vals.dtype:
        raise op_error(DTypeError, "searchsorted", f"sequence {seq.dtype} and values "
                       f"{vals.dtype}", "one dtype")
    ss, vs = tuple(seq.shape), tuple(vals.shape)
    if len(ss) == 0 or (len(ss) > 1 and (len(vs) != len(ss) or vs[:-1] != ss[:-1])):
        raise op_error(ShapeError, "searchsorted", f"sorted_sequence {ss} and values {vs}",
                       "a 1-d sequence, or one whose leading dims equal the values'")
    return Spec(vs, _I64)


def _ss_kernel(seq, vals, right):
    side = "right" if right else "left"
    if seq.ndim == 1:
        return np.asarray(np.searchsorted(seq, vals, side=side), np.int64)
    s2 = seq.reshape(-1, seq.shape[-1])
    v2 = vals.reshape(-1, vals.shape[-1])
    out = np.empty(v2.shape, np.int64)
    for r in range(s2.shape[0]):
        out[r] = np.searchsorted(s2[r], v2[r], side=side)
    return out.reshape(vals.shape)


SEARCHSORTED = defop(
    "searchsorted", _ss_rule, kernel=_ss_kernel, grad=NOT_DIFFERENTIABLE, onnx=NO_ONNX,
    flops=lambda s, v, **k: _flops(v),
    samples=lambda: [Sample((np.array([1.0, 2.0, 2.0, 3.0, 5.0]),
                             np.array([[0.5, 2.0, 5.0], [2.5, 3.0, 6.0]])), {"right": False}),
                     Sample((np.array([[1, 3, 3, 7], [0, 2, 4, 6]]),
                             np.array([[3, 7, 0], [4, 6, 1]])), {"right": True})])


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None,
                 sorter=None):
    """Where each value would be inserted into `sorted_sequence` (its last dim) to keep it
    sorted: before equal entries, or after them with ``right=True`` / ``side="right"``.
    Example: ``sampan.searchsorted(sampan.tensor([1, 3, 5]), sampan.tensor([3]))`` -> [1]."""
    from .elementwise import cast, operands
    from .index import take_along_axis
    if side is not None:
        if side not in ("left", "right") or (right and side == "left"):
            raise op_error(SampanValueError, "searchsorted", f"side={side!r}, right={right}",
                           "side 'left' or 'right', agreeing with right=")
        right = side == "right"
    seq = _t(sorted_sequence)
    if sorter is not None:
        seq = take_along_axis(seq, _t(sorter), seq.ndim - 1)
    seq, vals = operands(seq, input if isinstance(input, Tensor) else _t(input))
    out = apply(SEARCHSORTED, (seq, vals), {"right": bool(right)})
    return cast(out, "int32") if out_int32 else out


def bucketize(input, boundaries, *, out_int32=False, right=False):
    """The bucket of each value given 1-d sorted `boundaries`: i with boundaries[i-1] < x <=
    boundaries[i] (``right=True``: boundaries[i-1] <= x < boundaries[i]). Example:
    ``sampan.bucketize(x, sampan.tensor([0.0, 1.0]))``."""
    b = _t(boundaries)
    if b.ndim != 1:
        raise op_error(ShapeError, "bucketize", f"boundaries of shape {tuple(b.shape)}",
                       "1-d boundaries")
    return searchsorted(b, input, out_int32=out_int32, right=right)


# ---------------------------------------------------------------------- composites
def _median_vals(x, **k):
    return median(x, **k) if "dim" not in k else median(x, **k)[0]


def _nanmedian_vals(x, **k):
    return nanmedian(x, **k) if "dim" not in k else nanmedian(x, **k)[0]


def _comp():
    r = rng(181)
    x = randf(r, 3, 6, dtype=np.float64)
    xn = x.copy()
    xn[0, 2] = xn[2, 0] = xn[2, 4] = np.nan
    b = np.array([-1.0, 0.0, 0.5, 1.0])
    return {
        "median": (_median_vals, lambda: [Sample((x,), {}),
                                          Sample((x,), {"dim": 1, "keepdim": True})]),
        "nanmedian": (_nanmedian_vals, lambda: [Sample((xn,), {"dim": 1}, diff=())]),
        "quantile": (quantile, lambda: [
            Sample((x,), {"q": 0.3, "dim": 1}),
            Sample((x,), {"q": np.array([0.0, 0.25, 0.9]), "dim": 0, "keepdim": True,
                          "interpolation": "midpoint"})]),
        "nanquantile": (nanquantile, lambda: [
            Sample((xn,), {"q": 0.4, "dim": 1, "interpolation": "linear"}, diff=())]),
        "bucketize": (bucketize, lambda: [
            Sample((np.array([[-1.0, 0.2, 0.5], [1.0, 2.0, -3.0]]), b), diff=())]),
        "msort": (msort, lambda: [Sample((randf(r, 4, 3),))]),
    }


for _name, _entry in _comp().items():
    COMPOSITES[_name] = _entry

EXPORTS = ["median", "nanmedian", "quantile", "nanquantile", "mode", "kthvalue",
           "searchsorted", "bucketize", "msort"]
METHODS = {"median": median, "nanmedian": nanmedian, "quantile": quantile,
           "nanquantile": nanquantile, "mode": mode, "kthvalue": kthvalue, "msort": msort,
           "bucketize": bucketize}
