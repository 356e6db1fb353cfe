"""Import handlers for ONNX's elementwise math, comparison and logic ops, the variadic
Sum/Mean/Max/Min, Clip, Where, Einsum and Det.

Binary ops broadcast as numpy does (opset 7 on); before opset 7 a `broadcast=1` node
aligned B with A starting at `axis` (or at the trailing dims), which `_legacy` restates as
a reshape. ONNX's integer rules are kept: Div of integers truncates toward zero, Mod with
fmod=0 takes the divisor's sign and with fmod=1 the dividend's, Pow's result has the
base's type whatever the exponent's.
"""
from __future__ import annotations

import sampan

from ... import dtypes as _dt
from . import onnx_op


def _legacy(ctx, node, a, b):
    """Opset < 7 `broadcast=1`: B's dims line up with A's from `axis` (default: the
    trailing dims); later opsets broadcast as numpy does."""
    if ctx.opset >= 7 or not node.attr("broadcast", 0) or b.ndim == 0:
        return a, b
    axis = node.attr("axis", a.ndim - b.ndim)
    if axis < 0:
        axis += a.ndim
    if axis + b.ndim > a.ndim:
        raise ctx.error(f"broadcast=1 with axis={axis}: B of shape {list(b.shape)} does not fit "
                        f"in A of shape {list(a.shape)}")
    return a, sampan.reshape(b, tuple(b.shape) + (1,) * (a.ndim - axis - b.ndim))


def _same(ctx, a, b):
    """ONNX binary ops take one type for both inputs; say so instead of promoting."""
    if a.dtype != b.dtype:
        raise ctx.error(f"inputs have types {a.dtype} and {b.dtype}; the op takes one type "
                        "for both")


def _binary(op_type, fn, since=1):
    @onnx_op(op_type, since=since)
    def handler(ctx, node, a, b):
        a, b = _legacy(ctx, node, a, b)
        _same(ctx, a, b)
        return fn(a, b)
    handler.__name__ = op_type.lower()
    return handler


for _t, _f in [("Add", sampan.add), ("Sub", sampan.sub), ("Mul", sampan.mul),
               ("Equal", sampan.eq), ("Less", sampan.lt), ("Greater", sampan.gt),
               ("And", sampan.logical_and), ("Or", sampan.logical_or),
               ("Xor", sampan.logical_xor)]:
    _binary(_t, _f)
for _t, _f in [("LessOrEqual", sampan.le), ("GreaterOrEqual", sampan.ge)]:
    _binary(_t, _f, since=12)


@onnx_op("Div", since=1)
def div(ctx, node, a, b):
    a, b = _legacy(ctx, node, a, b)
    _same(ctx, a, b)
    if _dt.is_floating(a.dtype):
        return sampan.div(a, b)
    # integers truncate toward zero: a - fmod(a, b) is an exact multiple of b
    return sampan.floor_divide(sampan.sub(a, sampan.fmod(a, b)), b)


@onnx_op("Mod", since=10)
def mod(ctx, node, a, b):
    _same(ctx, a, b)
    if node.attr("fmod", 0):
        return sampan.fmod(a, b)
    # floats with fmod=0 are refused by opsets < 26's checker but read as later opsets
    # define them: Python's modulo, the divisor's sign
    return sampan.remainder(a, b)


@onnx_op("Pow", since=1)
def pow_(ctx, node, x, y):
    x, y = _legacy(ctx, node, x, y)
    # the result has the base's type; compute in the wider of the two, then cast back
    r = sampan.pow(x, y)
    return r if r.dtype == x.dtype else sampan.cast(r, x.dtype)


# ---------------------------------------------------------------------- bits
# sampan has no bitwise kernels, so the bit ops are integer arithmetic on sampan ops
# (traceable; exact in two's complement, where floor division by 2 is an arithmetic shift)
_BITS = {_dt.uint8: 8, _dt.int8: 8, _dt.int16: 16, _dt.int32: 32, _dt.int64: 64}


def _int_type(ctx, x):
    if x.dtype not in _BITS:
        raise ctx.error(f"inputs of type {x.dtype}; expected an integer type sampan has "
                        "(uint8, int8, int16, int32, int64: no uint16/uint32/uint64)")
    return _BITS[x.dtype]


@onnx_op("BitShift", since=11)
def bitshift(ctx, node, x, y):
    """Later opsets (26 on) add signed types: right shifts sign-extend, and a shift < 0 or
    >= the width leaves only the sign fill. Opset 11's unsigned case is the same rule."""
    _same(ctx, x, y)
    n = _int_type(ctx, x)
    direction = node.attr("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.error(f"direction={direction!r}; expected 'LEFT' or 'RIGHT'")
    valid = sampan.logical_and(sampan.ge(y, 0), sampan.lt(y, n))
    yc = sampan.where(valid, y, sampan.zeros_like(y))
    # 2**y in two halves: 2**(width-1) would overflow a signed type
    lo = sampan.floor_divide(yc, 2)
    two = sampan.full_like(yc, 2)
    p_lo, p_hi = sampan.pow(two, lo), sampan.pow(two, sampan.sub(yc, lo))
    if direction == "LEFT":      # wraps as the bits shifted out are dropped
        r = sampan.mul(sampan.mul(x, p_lo), p_hi)
        return sampan.where(valid, r, sampan.zeros_like(r))
    r = sampan.floor_divide(sampan.floor_divide(x, p_lo), p_hi)
    fill = sampan.where(sampan.lt(x, 0), sampan.full_like(x, -1), sampan.zeros_like(x)) \
        if x.dtype.kind == "i" else sampan.zeros_like(x)
    return sampan.where(valid, r, fill)


def _bits(x, n):
    """x's n bits, lowest first, each 0 or 1 in x's type."""
    out = []
    for _ in range(n):
        out.append(sampan.remainder(x, 2))
        x = sampan.floor_divide(x, 2)
    return out


def _bitwise(op_type, combine):
    @onnx_op(op_type, since=18)
    def handler(ctx, node, a, b):
        _same(ctx, a, b)
        n = _int_type(ctx, a)
        out = None
        for k, (ba, bb) in enumerate(zip(_bits(a, n), _bits(b, n))):
            # the top bit of a signed type weighs -2**(n-1)
            w = -(2 ** k) if a.dtype.kind == "i" and k == n - 1 else 2 ** k
            term = sampan.mul(combine(ba, bb), w)
            out = term if out is None else sampan.add(out, term)
        return out
    handler.__name__ = op_type.lower()


_bitwise("BitwiseAnd", sampan.mul)
_bitwise("BitwiseOr", lambda p, q: sampan.sub(sampan.add(p, q), sampan.mul(p, q)))
_bitwise("BitwiseXor", lambda p, q: sampan.sub(sampan.add(p, q), sampan.mul(sampan.mul(p, q),
                                                                             2)))


@onnx_op("BitwiseNot", since=18)
def bitwise_not(ctx, node, x):
    n = _int_type(ctx, x)
    if x.dtype.kind == "u":
        return sampan.sub(sampan.full_like(x, 2 ** n - 1), x)
    return sampan.sub(sampan.neg(x), 1)        # ~x == -x - 1 in two's complement


# ---------------------------------------------------------------------- unary math
_UNARY = {
    "Neg": sampan.neg, "Abs": sampan.abs, "Exp": sampan.exp, "Log": sampan.log,
    "Sqrt": sampan.sqrt, "Reciprocal": sampan.reciprocal, "Floor": sampan.floor,
    "Ceil": sampan.ceil, "Tanh": sampan.tanh, "Sigmoid": sampan.sigmoid, "Not": sampan.logical_not,
}
_UNARY_LATER = {   # op types added to ONNX after opset 1
    7: {"Sin": sampan.sin, "Cos": sampan.cos, "Tan": sampan.tan, "Asin": sampan.asin,
        "Acos": sampan.acos, "Atan": sampan.atan},
    9: {"Sinh": sampan.sinh, "Cosh": sampan.cosh, "Asinh": sampan.asinh,
        "Acosh": sampan.acosh, "Atanh": sampan.atanh, "Erf": sampan.erf,
        "Sign": sampan.sign, "IsNaN": sampan.isnan},
    11: {"Round": sampan.round},   # half to even, as numpy and ONNX
}


def _unary(op_type, fn, since):
    @onnx_op(op_type, since=since)
    def handler(ctx, node, x):
        return fn(x)
    handler.__name__ = op_type.lower()


for _t, _f in _UNARY.items():
    _unary(_t, _f, 1)
for _s, _table in _UNARY_LATER.items():
    for _t, _f in _table.items():
        _unary(_t, _f, _s)


@onnx_op("IsInf", since=10)
def isinf(ctx, node, x):
    neg, pos = node.attr("detect_negative", 1), node.attr("detect_positive", 1)
    if neg and pos:
        return sampan.isinf(x)
    if pos:
        return sampan.isposinf(x)
    if neg:
        return sampan.isneginf(x)
    return sampan.logical_and(sampan.isinf(x), sampan.isnan(x))     # all False


# ---------------------------------------------------------------------- variadic
def _fold(fn):
    def handler(ctx, node, *xs):
        if not xs or any(x is None for x in xs):
            raise ctx.error(f"takes one or more inputs; got {len(xs)}"
                            + (" with an empty one" if xs else ""))
        for x in xs[1:]:
            _same(ctx, xs[0], x)
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return handler


onnx_op("Sum", since=1)(_fold(sampan.add))
onnx_op("Max", since=1)(_fold(sampan.maximum))
onnx_op("Min", since=1)(_fold(sampan.minimum))


@onnx_op("Mean", since=1)
def mean(ctx, node, *xs):
    total = _fold(sampan.add)(ctx, node, *xs)
    return total if len(xs) == 1 else sampan.div(total, float(len(xs)))


# ---------------------------------------------------------------------- Clip, Where
_LOWEST = -3.4028234663852886e38     # numeric_limits<float>: opset < 11's defaults


@onnx_op("Clip", since=1)
def clip_attrs(ctx, node, x):
    return sampan.clamp(x, node.attr("min", _LOWEST), node.attr("max", -_LOWEST))


@onnx_op("Clip", since=11)
def clip(ctx, node, x, lo=None, hi=None):
    for name, b in (("min", lo), ("max", hi)):
        if b is not None and (b.ndim != 0 and b.numel() != 1 or b.dtype != x.dtype):
            raise ctx.error(f"{name} is {b.dtype}{list(b.shape)}; expected a scalar of the "
                            f"input's type {x.dtype}")
    lo = lo if lo is None or lo.ndim == 0 else sampan.reshape(lo, ())
    hi = hi if hi is None or hi.ndim == 0 else sampan.reshape(hi, ())
    return sampan.clamp(x, lo, hi)


@onnx_op("Where", since=9)
def where(ctx, node, cond, a, b):
    if cond.dtype != _dt.bool_:
        raise ctx.error(f"condition is {cond.dtype}; expected bool")
    _same(ctx, a, b)
    return sampan.where(cond, a, b)


# ---------------------------------------------------------------------- Einsum, Det
@onnx_op("Einsum", since=12)
def einsum(ctx, node, *xs):
    eq = node.attr("equation")
    if not isinstance(eq, str) or not eq:
        raise ctx.error("needs the `equation` attribute")
    return sampan.einsum(eq.replace(" ", ""), *xs)


@onnx_op("Det", since=11)
def det(ctx, node, x):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ctx.error(f"input of shape {list(x.shape)}; expected [..., M, M]")
    return sampan.linalg.det(x)

