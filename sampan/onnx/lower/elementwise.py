"""Elementwise and math ops: ONNX's one-op mappings where they mean the same (the op
table's strings), formulas of ONNX ops where ONNX has no op (log2, atan2, xlogy ...).

ONNX's binary ops take one dtype; sampan's promote, so the inputs are cast to the
output's dtype first (to their common dtype for comparisons)."""
from __future__ import annotations

import math

import numpy as np

from ._register import register_lowering

_ARITH = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
          "maximum": "Max", "minimum": "Min"}
_CMP = {"eq": "Equal", "gt": "Greater", "ge": "GreaterOrEqual", "lt": "Less",
        "le": "LessOrEqual", "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}


def as_dtype(ctx, x, dtype):
    """`x` cast to `dtype` unless it has it already."""
    dtype = np.dtype(dtype)
    return x if ctx.spec(x).dtype == dtype else ctx.cast(x, dtype)


def common(ctx, *xs):
    """The inputs cast to their common (numpy result) dtype."""
    dt = np.result_type(*[ctx.spec(x).dtype for x in xs])
    return [as_dtype(ctx, x, dt) for x in xs]


def to_out(ctx, *xs):
    """The inputs cast to the output's dtype (sampan's promotion decided it: a float32
    tensor times a float64 scalar stays float32)."""
    return [as_dtype(ctx, x, ctx.out_dtype) for x in xs]


def _binary(onnx_op):
    def lower(ctx, a, b):
        return ctx.emit(onnx_op, to_out(ctx, a, b))
    return lower


def _compare(onnx_op):
    def lower(ctx, a, b):
        return ctx.emit(onnx_op, common(ctx, a, b))
    return lower


for _name, _t in _ARITH.items():
    register_lowering(_name)(_binary(_t))
for _name, _t in _CMP.items():
    register_lowering(_name)(_compare(_t))


def num(ctx, value, like):
    """A scalar constant of `like`'s dtype."""
    return ctx.scalar(value, ctx.spec(like).dtype if isinstance(like, str) else like)


def E(ctx, op, *ins, **attrs):
    return ctx.emit(op, list(ins), **attrs)


@register_lowering("ne")
def _ne(ctx, a, b):
    return E(ctx, "Not", E(ctx, "Equal", *common(ctx, a, b)))


@register_lowering("cast")
def _cast(ctx, x, *, dtype):
    from ...dtypes import as_dtype as _as
    return ctx.cast(x, _as(dtype))


@register_lowering("where")
def _where(ctx, c, a, b):
    a, b = to_out(ctx, a, b)
    return E(ctx, "Where", as_dtype(ctx, c, bool), a, b)


@register_lowering("gelu")
def _gelu(ctx, x):
    if ctx.opset >= 20:
        return E(ctx, "Gelu", x)
    h = E(ctx, "Erf", E(ctx, "Mul", x, num(ctx, 1 / math.sqrt(2), x)))
    return E(ctx, "Mul", E(ctx, "Mul", x, num(ctx, 0.5, x)), E(ctx, "Add", h, num(ctx, 1, x)))


@register_lowering("isnan")
def _isnan(ctx, x):
    if ctx.spec(x).dtype.kind not in "f":
        return _false(ctx, x)
    return E(ctx, "IsNaN", x)


def _false(ctx, x):
    return E(ctx, "Not", E(ctx, "Equal", x, x))


def _isinf(pos, neg):
    def lower(ctx, x):
        if ctx.spec(x).dtype.kind not in "f":
            return _false(ctx, x)
        return E(ctx, "IsInf", x, detect_positive=int(pos), detect_negative=int(neg))
    return lower


register_lowering("isinf")(_isinf(True, True))
register_lowering("isposinf")(_isinf(True, False))
register_lowering("isneginf")(_isinf(False, True))


@register_lowering("isfinite")
def _isfinite(ctx, x):
    if ctx.spec(x).dtype.kind not in "f":
        return E(ctx, "Equal", x, x)
    return E(ctx, "Not", E(ctx, "Or", E(ctx, "IsNaN", x), E(ctx, "IsInf", x)))


@register_lowering("signbit")
def _signbit(ctx, x):
    if ctx.spec(x).dtype.kind not in "f":
        return E(ctx, "Less", x, num(ctx, 0, x))
    # -0.0 has its sign bit set: 1 / -0.0 is -inf
    neg_zero = E(ctx, "And", E(ctx, "Equal", x, num(ctx, 0, x)),
                 E(ctx, "Less", E(ctx, "Reciprocal", x), num(ctx, 0, x)))
    return E(ctx, "Or", E(ctx, "Less", x, num(ctx, 0, x)), neg_zero)


@register_lowering("copysign")
def _copysign(ctx, a, b):
    a, b = common(ctx, a, b)
    neg = _signbit(ctx, b)
    m = E(ctx, "Abs", a)
    return E(ctx, "Where", neg, E(ctx, "Neg", m), m)


@register_lowering("fmod")
def _fmod(ctx, a, b):
    return E(ctx, "Mod", *common(ctx, a, b), fmod=1)


@register_lowering("mod")
def _mod(ctx, a, b):
    a, b = common(ctx, a, b)
    if ctx.spec(a).dtype.kind in "iu":
        return E(ctx, "Mod", a, b, fmod=0)
    # Python's modulo has the divisor's sign: fix up C's fmod where the signs differ
    r = E(ctx, "Mod", a, b, fmod=1)
    zero = num(ctx, 0, a)
    fix = E(ctx, "And", E(ctx, "Not", E(ctx, "Equal", r, zero)),
            E(ctx, "Xor", E(ctx, "Less", r, zero), E(ctx, "Less", b, zero)))
    return E(ctx, "Where", fix, E(ctx, "Add", r, b), r)


@register_lowering("floor_divide")
def _floor_divide(ctx, a, b):
    a, b = common(ctx, a, b)
    if ctx.spec(a).dtype.kind in "f":
        return E(ctx, "Floor", E(ctx, "Div", a, b))
    q = E(ctx, "Div", a, b)                 # ONNX integer Div truncates
    zero = num(ctx, 0, a)
    r = E(ctx, "Sub", a, E(ctx, "Mul", q, b))
    fix = E(ctx, "And", E(ctx, "Not", E(ctx, "Equal", r, zero)),
            E(ctx, "Xor", E(ctx, "Less", r, zero), E(ctx, "Less", b, zero)))
    return E(ctx, "Sub", q, ctx.cast(fix, ctx.spec(a).dtype))


@register_lowering("trunc")
def _trunc(ctx, x):
    if ctx.spec(x).dtype.kind not in "f":
        return E(ctx, "Identity", x)
    return E(ctx, "Where", E(ctx, "Less", x, num(ctx, 0, x)), E(ctx, "Ceil", x),
             E(ctx, "Floor", x))


@register_lowering("expm1")
def _expm1(ctx, x):
    # Kahan's form: (u - 1) * x / log(u) keeps the digits exp(x) - 1 loses near 0
    u = E(ctx, "Exp", x)
    um1 = E(ctx, "Sub", u, num(ctx, 1, x))
    r = E(ctx, "Div", E(ctx, "Mul", um1, x), E(ctx, "Log", u))
    r = E(ctx, "Where", E(ctx, "Equal", um1, num(ctx, -1, x)), um1, r)
    r = E(ctx, "Where", E(ctx, "IsInf", u), u, r)
    return E(ctx, "Where", E(ctx, "Equal", u, num(ctx, 1, x)), x, r)


@register_lowering("log1p")
def _log1p(ctx, x):
    # Goldberg's form: log(u) * x / (u - 1) with u = 1 + x, exact where u rounds to 1
    u = E(ctx, "Add", x, num(ctx, 1, x))
    um1 = E(ctx, "Sub", u, num(ctx, 1, x))
    r = E(ctx, "Div", E(ctx, "Mul", E(ctx, "Log", u), x), um1)
    r = E(ctx, "Where", E(ctx, "IsInf", u), u, r)
    return E(ctx, "Where", E(ctx, "Equal", um1, num(ctx, 0, x)), x, r)


def _log_base(base):
    def lower(ctx, x):
        return E(ctx, "Div", E(ctx, "Log", x), num(ctx, math.log(base), x))
    return lower


register_lowering("log2")(_log_base(2))
register_lowering("log10")(_log_base(10))


@register_lowering("exp2")
def _exp2(ctx, x):
    return E(ctx, "Exp", E(ctx, "Mul", x, num(ctx, math.log(2), x)))


@register_lowering("erfc")
def _erfc(ctx, x):
    return E(ctx, "Sub", num(ctx, 1, x), E(ctx, "Erf", x))


@register_lowering("hypot")
def _hypot(ctx, a, b):
    a, b = common(ctx, a, b)
    return E(ctx, "Sqrt", E(ctx, "Add", E(ctx, "Mul", a, a), E(ctx, "Mul", b, b)))


@register_lowering("atan2")
def _atan2(ctx, y, x):
    y, x = common(ctx, y, x)
    zero = num(ctx, 0, x)
    base = E(ctx, "Atan", E(ctx, "Div", y, x))
    pi = num(ctx, math.pi, x)
    # x < 0: add pi with y's sign; x == 0: +-pi/2 (0 when y == 0 too)
    sgn_pi = E(ctx, "Where", _signbit(ctx, y), E(ctx, "Neg", pi), pi)
    left = E(ctx, "Add", base, sgn_pi)
    half = E(ctx, "Mul", E(ctx, "Sign", y), num(ctx, math.pi / 2, x))
    at_zero = E(ctx, "Where", E(ctx, "Equal", y, zero),
                E(ctx, "Where", _signbit(ctx, x), sgn_pi, E(ctx, "Mul", y, zero)), half)
    r = E(ctx, "Where", E(ctx, "Less", x, zero), left, base)
    return E(ctx, "Where", E(ctx, "Equal", x, zero), at_zero, r)


@register_lowering("heaviside")
def _heaviside(ctx, x, v):
    x, v = common(ctx, x, v)
    zero = num(ctx, 0, x)
    step = E(ctx, "Where", E(ctx, "Greater", x, zero), num(ctx, 1, x),
             E(ctx, "Where", E(ctx, "Less", x, zero), zero, x))   # NaN stays NaN
    return E(ctx, "Where", E(ctx, "Equal", x, zero), v, step)


@register_lowering("lerp")
def _lerp(ctx, a, b, w):
    a, b, w = common(ctx, a, b, w)
    d = E(ctx, "Sub", b, a)
    lo = E(ctx, "Add", a, E(ctx, "Mul", w, d))
    hi = E(ctx, "Sub", b, E(ctx, "Mul", d, E(ctx, "Sub", num(ctx, 1, w), w)))
    return E(ctx, "Where", E(ctx, "Less", E(ctx, "Abs", w), num(ctx, 0.5, w)), lo, hi)


def _logaddexp(base):
    def lower(ctx, a, b):
        a, b = common(ctx, a, b)
        m = E(ctx, "Max", a, b)
        d = E(ctx, "Neg", E(ctx, "Abs", E(ctx, "Sub", a, b)))
        if base == 2:
            d = E(ctx, "Mul", d, num(ctx, math.log(2), a))
        s = E(ctx, "Log", E(ctx, "Add", num(ctx, 1, a), E(ctx, "Exp", d)))
        if base == 2:
            s = E(ctx, "Div", s, num(ctx, math.log(2), a))
        r = E(ctx, "Add", m, s)
        # an infinite max is the result (-inf and -inf would give NaN)
        return E(ctx, "Where", E(ctx, "IsInf", m), m, r)
    return lower


register_lowering("logaddexp")(_logaddexp(math.e))
register_lowering("logaddexp2")(_logaddexp(2))


@register_lowering("xlogy")
def _xlogy(ctx, x, y):
    x, y = common(ctx, x, y)
    zero = num(ctx, 0, x)
    r = E(ctx, "Where", E(ctx, "Equal", x, zero), zero, E(ctx, "Mul", x, E(ctx, "Log", y)))
    return E(ctx, "Where", E(ctx, "IsNaN", y), y, r)


@register_lowering("sinc")
def _sinc(ctx, x):
    px = E(ctx, "Mul", x, num(ctx, math.pi, x))
    return E(ctx, "Where", E(ctx, "Equal", x, num(ctx, 0, x)), num(ctx, 1, x),
             E(ctx, "Div", E(ctx, "Sin", px), px))


@register_lowering("full")
def _full(ctx, *, shape, value, dtype):
    from ...dtypes import as_dtype as _as
    dt = _as(dtype)
    if isinstance(value, str):   # a symbolic fill value ('$0.5/batch', see jit.dynamic)
        v = ctx.scalar(value, dt)
        return v if not shape else E(ctx, "Expand", v, ctx.ints(shape))
    if all(isinstance(d, int) for d in shape):
        return E(ctx, "Identity", ctx.const(np.full(shape, value, dt)))
    return E(ctx, "Expand", ctx.scalar(value, dt), ctx.ints(shape))


def _int_identity(onnx_op, kinds="biu"):
    """`onnx_op` for floats; the identity where the op changes nothing (ceil of an int)."""
    def lower(ctx, x):
        if ctx.spec(x).dtype.kind in kinds:
            return E(ctx, "Identity", x)
        return E(ctx, onnx_op, x)
    return lower


for _name, _t in [("ceil", "Ceil"), ("floor", "Floor"), ("round", "Round")]:
    register_lowering(_name)(_int_identity(_t))
register_lowering("abs")(_int_identity("Abs", "bu"))
register_lowering("sign")(_int_identity("Sign", "b"))


@register_lowering("neg")
def _neg(ctx, x):
    k = ctx.spec(x).dtype.kind
    if k == "b":
        ctx.fail("negation of a bool tensor")
    if k == "u":      # numpy wraps around: 0 - x
        return E(ctx, "Sub", num(ctx, 0, x), x)
    return E(ctx, "Neg", x)


@register_lowering("logical_not")
def _not(ctx, x):
    return E(ctx, "Not", as_dtype(ctx, x, bool))


for _name in ("logical_and", "logical_or", "logical_xor"):
    def _logical(ctx, a, b, _t=_CMP[_name]):
        return E(ctx, _t, as_dtype(ctx, a, bool), as_dtype(ctx, b, bool))
    register_lowering(_name)(_logical)
