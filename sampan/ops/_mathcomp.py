"""(issue 17) The composites of `mathops` (frac, clamp_min/clamp_max, addcmul/addcdiv,
nan_to_num, isclose: compositions of elementwise primitives, which the fusion pass turns
back into one kernel in jit) and the Python-bool predicates allclose and equal.
Exported through `mathops.EXPORTS`; registered in `COMPOSITES` for the op harness."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..tensor import Tensor
from ._util import Sample, randf, rng
from .composite import COMPOSITES
from .elementwise import (_FLOAT_DTYPES, abs, add, cast, clamp, div, eq, le, logical_and,
                          logical_or, mul, operands, sub, where)
from ._mathpred import isfinite, isnan, isneginf, isposinf, need_float, trunc
from .reduce import all as _all


def _tensor(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def frac(input):
    """x - trunc(x) (the sign of x); gradient 1, as torch. Example: ``sampan.frac(x)``."""
    x = _tensor(input)
    need_float("frac", x)
    return sub(x, trunc(x))


def clamp_min(input, min):
    """max(input, min), `min` a number or a tensor. Example: ``sampan.clamp_min(x, 0.0)``."""
    return clamp(input, min=min)


def clamp_max(input, max):
    """min(input, max), `max` a number or a tensor. Example: ``sampan.clamp_max(x, 1.0)``."""
    return clamp(input, max=max)


def addcmul(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 * tensor2 (torch's order of operations). Example:
    ``sampan.addcmul(x, a, b, value=0.5)``."""
    t = tensor1 if value == 1 else mul(tensor1, value)
    return add(input, mul(t, tensor2))


def addcdiv(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 / tensor2 (floating inputs only, as torch). Example:
    ``sampan.addcdiv(x, a, b, value=0.5)``."""
    need_float("addcdiv", _tensor(tensor1), _tensor(tensor2))
    t = tensor1 if value == 1 else mul(tensor1, value)
    return add(input, div(t, tensor2))


def _finfo(d):
    if d == _dt.bfloat16:
        import ml_dtypes
        return ml_dtypes.finfo(d)
    return np.finfo(d)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    """nan, +inf and -inf replaced by `nan`, `posinf` and `neginf` (default: the dtype's
    largest and lowest finite values); integer tensors come back unchanged (a copy).
    The gradient passes where the input is finite. Example: ``sampan.nan_to_num(x)``."""
    x = _tensor(input)
    if x._data.dtype not in _FLOAT_DTYPES:
        return mul(x, 1) if x.dtype != np.bool_ else logical_and(x, True)
    fi = _finfo(x._data.dtype)
    posinf = float(fi.max) if posinf is None else posinf
    neginf = float(fi.min) if neginf is None else neginf
    y = where(isnan(x), nan, x)
    y = where(isposinf(x), posinf, y)
    return where(isneginf(x), neginf, y)


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|input - other| <= atol + rtol * |other| elementwise (bool); equal infinities are
    close, nan is close to nan only with `equal_nan`. Example: ``sampan.isclose(a, b)``."""
    a, b = operands(input, other)
    close = eq(a, b)
    if equal_nan:
        close = logical_or(close, logical_and(isnan(a), isnan(b)))
    if rtol == 0 and atol == 0:
        return close
    if a._data.dtype not in _FLOAT_DTYPES:
        a, b = cast(a, _dt.get_default_dtype()), cast(b, _dt.get_default_dtype())
    # non-finite values are compared by `close` alone: zeroed before the subtraction, so
    # inf - inf computes (and warns) nowhere
    fin = logical_and(isfinite(a), isfinite(b))
    a, b = where(fin, a, 0.0), where(fin, b, 0.0)
    err = abs(sub(a, b))
    within = logical_and(isfinite(err), le(err, add(abs(mul(b, rtol)), atol)))
    return logical_or(close, logical_and(fin, within))


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Whether every element is close (see `isclose`); a Python bool. Example:
    ``sampan.allclose(a, b, atol=1e-6)``."""
    return bool(_all(isclose(input, other, rtol, atol, equal_nan)).item())


def equal(input, other):
    """True when both have the same shape and equal elements (nan is never equal); a
    Python bool. Example: ``sampan.equal(a, b)``."""
    a, b = _tensor(input), _tensor(other)
    if tuple(a.shape) != tuple(b.shape):
        return False
    return bool(_all(eq(a, b)).item())


def _nan_samples():
    # the default posinf (the dtype's max) would swamp finite differences: nan only there
    r = rng(60)
    a = randf(r, 2, 4)
    a.flat[:3] = [np.nan, np.inf, -np.inf]
    b = randf(r, 5)
    b[1] = np.nan
    return [Sample((b,)), Sample((a,), {"nan": 1.5, "posinf": 9.0, "neginf": -9.0})]


def _close_samples():
    r = rng(61)
    a = randf(r, 3, 4)
    b = a + randf(r, 3, 4, low=-1e-5, high=1e-5)
    b[0, 0], a[1, 1], b[1, 1] = np.nan, np.nan, np.nan
    a[2, 2] = b[2, 2] = np.inf
    return [Sample((a, b), diff=()),
            Sample((a, b), {"rtol": 0.0, "atol": 1e-6, "equal_nan": True}, diff=())]


def _t3(seed, lo=-2.0):
    def samples():
        r = rng(seed)
        return [Sample((randf(r, 3, 4), randf(r, 3, 4), randf(r, 4, low=lo, high=2))),
                Sample((randf(r, 3), randf(r, 2, 3), randf(r, 2, 1, low=lo, high=2)),
                       {"value": 0.5})]
    return samples


def _u(seed, lo, hi, attrs=None):
    return lambda: [Sample((randf(rng(seed), 3, 4, low=lo, high=hi),), attrs or {})]


COMPOSITES["frac"] = (frac, _u(62, -3.3, 3.3))
COMPOSITES["clamp_min"] = (clamp_min, lambda: [
    Sample((randf(rng(63), 3, 4),), {"min": 0.1}),
    Sample((randf(rng(64), 3, 4), randf(rng(65), 4)))])
COMPOSITES["clamp_max"] = (clamp_max, lambda: [
    Sample((randf(rng(66), 3, 4),), {"max": 0.1}),
    Sample((randf(rng(67), 3, 4), randf(rng(68), 4)))])
COMPOSITES["addcmul"] = (addcmul, _t3(69))
COMPOSITES["addcdiv"] = (addcdiv, _t3(70, lo=0.5))
COMPOSITES["nan_to_num"] = (nan_to_num, _nan_samples)
COMPOSITES["isclose"] = (isclose, _close_samples)
