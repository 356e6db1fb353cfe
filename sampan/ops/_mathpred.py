"""trunc and the float predicates (isnan, isinf, isfinite, isposinf, isneginf, signbit),
with `need_float`: the primitives of `mathops` that its composites (`_mathcomp.py`) are
made of. Defined here, below both, and re-exported by `mathops` (the family module), so
the composites need not import the module that exports them."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, elementwise_rule, numel_flops, randf, rng
from .elementwise import _FLOAT_DTYPES, _unary_fn, cast, zeros_like_
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, defop


def _tensor(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _is_float(t):
    return t._data.dtype in _FLOAT_DTYPES


def need_float(name, *ts):
    """Raise DTypeError unless every tensor is floating (ops torch gives no integer
    kernel: logaddexp, hypot, lerp, frac, addcdiv)."""
    for t in ts:
        if not _is_float(t):
            raise op_error(DTypeError, name, f"dtype {t.dtype}", "a floating dtype",
                           "cast it first, e.g. x.float()")


# ---------------------------------------------------------------------- trunc (keeps ints)
def _trunc_kernel(a):
    return np.trunc(a) if _dt.is_floating(a.dtype) else a.copy()


def _trunc_samples():
    r = rng(36)
    return [Sample((randf(r, 3, 4, low=-3.3, high=3.3),)),
            Sample((r.integers(-9, 9, (5,)),))]


# zero gradient (as torch: a training graph through trunc gets zeros, not an error)
TRUNC = defop("trunc", elementwise_rule("trunc"), kernel=_trunc_kernel, kind="elementwise",
              fuse="always", scalar="trunc(a)", grad=lambda g, y, a: zeros_like_(g), saves=(),
              flops=numel_flops, onnx=NO_ONNX, samples=_trunc_samples)
trunc = _unary_fn(TRUNC, "Round toward zero (integers unchanged); zero gradient. Example: "
                         "``sampan.trunc(x)``", float_only=False)
fix = trunc


# ---------------------------------------------------------------------- predicates (bool)
def _special_values(seed):
    def samples():
        r = rng(seed)
        a = randf(r, 2, 4, low=-3, high=3)
        a.flat[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
        return [Sample((a,)), Sample((r.integers(-5, 5, (2, 3)),))]
    return samples


def _predicate(name, kernel, scalar, onnx, seed):
    return defop(name, elementwise_rule(name, out_dtype=np.bool_), kernel=kernel,
                 kind="elementwise", fuse="always", scalar=scalar, grad=NOT_DIFFERENTIABLE,
                 flops=numel_flops, onnx=onnx, samples=_special_values(seed))


# scalar forms in arithmetic (NaN != NaN, inf - inf is NaN): valid for every dtype
ISNAN = _predicate("isnan", np.isnan, "a != a", "IsNaN", 40)
ISINF = _predicate("isinf", np.isinf, "a - a != 0 and a == a", "IsInf", 41)
ISFINITE = _predicate("isfinite", np.isfinite, "a - a == 0", NO_ONNX, 42)
ISPOSINF = _predicate("isposinf", np.isposinf, "a > 0 and a - a != 0", "IsInf", 43)
ISNEGINF = _predicate("isneginf", np.isneginf, "a < 0 and a - a != 0", "IsInf", 44)
SIGNBIT = _predicate("signbit", np.signbit, "copysign(1, a) < 0", NO_ONNX, 45)


def _pred_fn(op, doc):
    empty = {}

    def f(input):
        x = _tensor(input)
        if x._data.dtype == np.bool_ or (op is SIGNBIT and x._data.dtype.kind == "u"):
            x = cast(x, "int8")         # numpy's predicates take no bool subtraction
        return apply(op, (x,), empty)
    f.__name__ = op.name
    f.__doc__ = doc
    return f


isnan = _pred_fn(ISNAN, "Elementwise x != x (bool; integers: all False). Example: "
                        "``sampan.isnan(x)``")
isinf = _pred_fn(ISINF, "Elementwise |x| == inf (bool). Example: ``sampan.isinf(x)``")
isfinite = _pred_fn(ISFINITE, "Elementwise: neither inf nor nan (bool). Example: "
                              "``sampan.isfinite(x)``")
isposinf = _pred_fn(ISPOSINF, "Elementwise x == +inf (bool). Example: ``sampan.isposinf(x)``")
isneginf = _pred_fn(ISNEGINF, "Elementwise x == -inf (bool). Example: ``sampan.isneginf(x)``")
signbit = _pred_fn(SIGNBIT, "Elementwise: the sign bit is set (-0.0 included; bool). "
                            "Example: ``sampan.signbit(x)``")
