"""(issue 17) Ops whose output shape depends on the data: nonzero, unique,
unique_consecutive, bincount (and histc, whose shape does not). Their shape rules return
a symbolic dim (a str), so `sampan.jit` stops with "depends on the data"; eager runs them.
Exported through `scatter.py`."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, randf, rng
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, Spec, defop

_I64 = np.dtype(np.int64)


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _zflops(*a, **k):
    return 0


def _ints(r, *shape, high=4):
    return r.integers(0, high, size=shape).astype(np.int64)


# ---------------------------------------------------------------------- nonzero
NONZERO = defop(
    "nonzero", lambda x: Spec(("nonzero", len(x.shape)), _I64),
    kernel=lambda a: np.argwhere(a).astype(np.int64), grad=NOT_DIFFERENTIABLE,
    onnx="NonZero", flops=_zflops,
    samples=lambda: [Sample((np.array([[0.0, 1.0, 0.0], [2.0, 0.0, -1.0]]),)),
                     Sample((_ints(rng(160), 2, 2, 3, high=2) > 0,))])


def nonzero(input, *, as_tuple=False):
    """The indices of the nonzero elements: an int64 (n, ndim) tensor, or with
    ``as_tuple=True`` one 1-d tensor per dim. Eager only (the count depends on the data).
    Example: ``sampan.nonzero(sampan.tensor([0, 3, 0, 4]))`` -> [[1], [3]]."""
    from .shape import getitem, reshape
    x = _t(input)
    if as_tuple:
        xs = reshape(x, (1,)) if x.ndim == 0 else x
        nz = apply(NONZERO, (xs,), {})
        return tuple(getitem(nz, (slice(None), d)) for d in range(xs.ndim))
    return apply(NONZERO, (x,), {})


def argwhere(input):
    """The indices of the nonzero elements as an int64 (n, ndim) tensor (`nonzero`)."""
    return nonzero(input)


# ---------------------------------------------------------------------- unique
def _uniq_dim(op, x, dim):
    if dim is not None and not -len(x.shape) <= dim < max(len(x.shape), 1):
        raise op_error(ShapeError, op, f"dim {dim} for a {len(x.shape)}-d input",
                       f"a dim in [{-len(x.shape)}, {len(x.shape)})")


def _unique_rule(x, sorted=True, dim=None):
    _uniq_dim("unique", x, dim)
    if dim is None:
        return (Spec(("unique",), x.dtype), Spec(tuple(x.shape), _I64),
                Spec(("unique",), _I64))
    s = list(x.shape)
    d = dim % len(s)
    n = s[d]
    s[d] = "unique"
    return Spec(tuple(s), x.dtype), Spec((n,), _I64), Spec(("unique",), _I64)


def _unique_kernel(a, sorted=True, dim=None):
    if dim is None:
        # each NaN is its own value, as in PyTorch (numpy would merge them)
        v, inv, cnt = np.unique(a.reshape(-1), return_inverse=True, return_counts=True,
                                equal_nan=False)
        return v, inv.reshape(a.shape).astype(np.int64), cnt.astype(np.int64)
    d = dim % a.ndim
    moved = np.moveaxis(a, d, 0)
    rows = moved.reshape(moved.shape[0], -1)
    if rows.shape[0] == 0:
        return a.copy(), np.zeros(0, np.int64), np.zeros(0, np.int64)
    # lexicographic order of the slices, as PyTorch's unique(dim=)
    order = np.lexsort(rows.T[::-1]) if rows.shape[1] else np.arange(rows.shape[0])
    srt = rows[order]
    new = np.ones(len(srt), bool)
    if len(srt) > 1:
        new[1:] = np.any(srt[1:] != srt[:-1], axis=1)
    group = np.cumsum(new) - 1
    inv = np.empty(len(srt), np.int64)
    inv[order] = group
    starts = np.flatnonzero(new)
    cnt = np.diff(np.append(starts, len(srt))).astype(np.int64)
    vals = moved[order[starts]]
    return np.ascontiguousarray(np.moveaxis(vals, 0, d)), inv, cnt


def _unique_samples():
    r = rng(161)
    return [Sample((_ints(r, 3, 4),), {"sorted": True, "dim": None}),
            Sample((np.array([[1, 2], [0, 5], [1, 2], [0, 5], [0, 4]]),),
                   {"sorted": True, "dim": 0})]


UNIQUE = defop("unique", _unique_rule, kernel=_unique_kernel, grad=NOT_DIFFERENTIABLE,
               n_out=3, onnx="Unique", flops=_zflops, samples=_unique_samples)


def _ucons_rule(x, dim=None):
    _uniq_dim("unique_consecutive", x, dim)
    if dim is None:
        return (Spec(("unique",), x.dtype), Spec(tuple(x.shape), _I64),
                Spec(("unique",), _I64))
    s = list(x.shape)
    d = dim % len(s)
    n = s[d]
    s[d] = "unique"
    return Spec(tuple(s), x.dtype), Spec((n,), _I64), Spec(("unique",), _I64)


def _ucons_kernel(a, dim=None):
    if dim is None:
        moved = a.reshape(-1, 1)
    else:
        moved = np.moveaxis(a, dim % a.ndim, 0)
    rows = moved.reshape(moved.shape[0], -1)
    new = np.ones(rows.shape[0], bool)
    if rows.shape[0] > 1:
        new[1:] = np.any(rows[1:] != rows[:-1], axis=1)
    inv = (np.cumsum(new) - 1).astype(np.int64)
    starts = np.flatnonzero(new)
    cnt = np.diff(np.append(starts, rows.shape[0])).astype(np.int64)
    if dim is None:
        return a.reshape(-1)[starts], inv.reshape(a.shape), cnt
    d = dim % a.ndim
    return np.ascontiguousarray(np.moveaxis(moved[starts], 0, d)), inv, cnt


UNIQUE_CONSECUTIVE = defop(
    "unique_consecutive", _ucons_rule, kernel=_ucons_kernel, grad=NOT_DIFFERENTIABLE,
    n_out=3, onnx=NO_ONNX, flops=_zflops,
    samples=lambda: [Sample((np.array([1, 1, 2, 2, 3, 1, 1, 2]),), {"dim": None}),
                     Sample((np.array([[1, 2], [1, 2], [0, 5], [1, 2]]),), {"dim": 0})])


def _pick_outs(outs, return_inverse, return_counts):
    out = [outs[0]]
    if return_inverse:
        out.append(outs[1])
    if return_counts:
        out.append(outs[2])
    return outs[0] if len(out) == 1 else tuple(out)


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct values (sorted; ``sorted=False`` also sorts, one of the orders PyTorch
    allows), with the inverse indices and counts on request; with `dim`, the distinct
    slices along it. Eager only. Example: ``v, inv = sampan.unique(x, return_inverse=True)``."""
    x = _t(input)
    outs = apply(UNIQUE, (x,), {"sorted": bool(sorted), "dim": None if dim is None else
                                int(dim)})
    return _pick_outs(outs, return_inverse, return_counts)


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    """Collapse runs of equal consecutive values (or slices along `dim`). Eager only.
    Example: ``sampan.unique_consecutive(sampan.tensor([1, 1, 2, 1]))`` -> [1, 2, 1]."""
    x = _t(input)
    outs = apply(UNIQUE_CONSECUTIVE, (x,), {"dim": None if dim is None else int(dim)})
    return _pick_outs(outs, return_inverse, return_counts)


# ---------------------------------------------------------------------- bincount / histc
def _bincount_rule(x, *w, minlength=0):
    if len(x.shape) != 1 or x.dtype.kind not in "iu":
        raise op_error(DTypeError, "bincount", f"{x.dtype}{list(x.shape)}",
                       "a 1-d tensor of non-negative integers")
    if w and tuple(w[0].shape) != tuple(x.shape):
        raise op_error(ShapeError, "bincount", f"input {tuple(x.shape)} and weights "
                       f"{tuple(w[0].shape)}", "weights of the input's shape")
    if minlength < 0:
        raise op_error(SampanValueError, "bincount", f"minlength={minlength}", "minlength >= 0")
    dt = _I64 if not w else (w[0].dtype if w[0].dtype.kind == "f" else np.dtype(np.float64))
    return Spec(("bins",), dt)


def _bincount_kernel(a, *w, minlength=0):
    if a.size and a.min() < 0:
        raise op_error(SampanValueError, "bincount", f"a negative entry {int(a.min())}",
                       "non-negative integers")
    if not w:
        return np.bincount(a, minlength=minlength).astype(np.int64)
    wd = w[0].dtype if w[0].dtype.kind == "f" else np.dtype(np.float64)
    return np.bincount(a, weights=w[0].astype(np.float64), minlength=minlength).astype(wd)


BINCOUNT = defop(
    "bincount", _bincount_rule, kernel=_bincount_kernel, grad=NOT_DIFFERENTIABLE,
    onnx=NO_ONNX, flops=_zflops,
    samples=lambda: [Sample((np.array([1, 1, 4, 0, 1]),), {"minlength": 0}),
                     Sample((np.array([2, 0, 2]), randf(rng(162), 3)), {"minlength": 5})])


def bincount(input, weights=None, minlength=0):
    """Counts of each value of a 1-d non-negative integer tensor (summed `weights` when
    given), at least `minlength` long. Eager only. Example:
    ``sampan.bincount(sampan.tensor([1, 1, 3]))`` -> [0, 2, 0, 1]."""
    x = _t(input)
    ins = (x,) if weights is None else (x, _t(weights))
    return apply(BINCOUNT, ins, {"minlength": int(minlength)})


def _histc_rule(x, bins, min, max):
    if not (x.dtype.kind == "f" or x.dtype.name == "bfloat16"):
        raise op_error(DTypeError, "histc", f"dtype {x.dtype}", "a floating dtype")
    if bins <= 0 or min > max:
        raise op_error(SampanValueError, "histc", f"bins={bins}, min={min}, max={max}",
                       "bins > 0 and min <= max")
    return Spec((bins,), x.dtype)


def _histc_kernel(a, bins, min, max):
    lo, hi = float(min), float(max)
    v = a.reshape(-1).astype(np.float64)
    if lo == hi and v.size:
        lo, hi = float(v.min()), float(v.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    v = v[(v >= lo) & (v <= hi)]
    i = np.floor((v - lo) * bins / (hi - lo)).astype(np.int64)
    i[i == bins] = bins - 1          # the top edge counts in the last bin
    return np.bincount(i, minlength=bins).astype(a.dtype)


HISTC = defop(
    "histc", _histc_rule, kernel=_histc_kernel, grad=NOT_DIFFERENTIABLE, onnx=NO_ONNX,
    flops=_zflops,
    samples=lambda: [Sample((randf(rng(163), 4, 5),), {"bins": 6, "min": -1.0, "max": 1.5}),
                     Sample((np.array([0.0, 1.0, 1.0, 3.0], np.float32),),
                            {"bins": 3, "min": 0.0, "max": 0.0})])


def histc(input, bins=100, min=0, max=0):
    """A histogram of `bins` equal bins over [min, max] (the data's range when both are 0);
    elements outside are ignored. Example: ``sampan.histc(x, bins=4, min=0, max=2)``."""
    return apply(HISTC, (_t(input),), {"bins": int(bins), "min": float(min),
                                       "max": float(max)})


EXPORTS = ["nonzero", "argwhere", "unique", "unique_consecutive", "bincount", "histc"]
METHODS = {"nonzero": nonzero, "argwhere": argwhere, "unique": unique,
           "unique_consecutive": unique_consecutive, "bincount": bincount, "histc": histc}
