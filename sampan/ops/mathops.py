"""(issue 17) Elementwise math ops PyTorch users reach for: inverse trigonometric and
hyperbolic functions, log2/log10/exp2, trunc, atan2, logaddexp, fmod/remainder, lerp,
copysign, hypot, xlogy, heaviside, the special functions (lgamma, digamma/polygamma,
erfinv, erfc, kernels in `_special.py`) and the float predicates (isnan ..., signbit).
Composites (frac, clamp_min/max, addcmul/addcdiv, nan_to_num, isclose) and the Python
predicates allclose/equal are in `_mathcomp.py`; trunc and the float predicates they are made
of in `_mathpred.py` (both re-exported here).

One `defop` block per op: rule, numpy kernel, gradient with ops, scalar form for the
fusion generator (`fuse="always"`: the scalar form calls what numpy's kernel calls, libm
or plain arithmetic; `""`: no scalar form numba can compile, the op runs its kernel
between fused groups), FLOPs, ONNX name, samples.

dtypes follow PyTorch: integer and bool inputs of the float functions give the default
float dtype (``sampan.tan(int_tensor)`` is float32), fmod/remainder/trunc keep integer
dtypes, the predicates give bool, and logaddexp/hypot/lerp reject integers as torch does.

`EXPORTS` lists the functions exported as `sampan.<name>`, `METHODS` the Tensor methods
(name -> function) and `INPLACE` the in-place methods (name -> out-of-place function),
both bound by `sampan/_tensor_methods.py`."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, op_error
from ..tensor import Tensor, apply
from . import _special
from ._util import Sample, elementwise_rule, numel_flops, randf, rng, unbroadcast
from .elementwise import (_as_kernel, _bflops, _const, _unary_fn, add, binary, cast, cos, div,
                          eq, exp, le, logical_and, mul, neg, operands, sign, sin, sqrt, sub,
                          where)
from .elementwise import mod as _mod
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, defop

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


# ---------------------------------------------------------------------- samples & helpers
def _usamples(lo, hi, seed):
    """Two samples of a unary op with values in [lo, hi): a (3, 4) and a (5,) array."""
    def samples():
        r = rng(seed)
        return [Sample((randf(r, 3, 4, low=lo, high=hi),)),
                Sample((randf(r, 5, low=lo, high=hi),))]
    return samples


def _bsamples(lo, hi, blo, bhi, seed):
    """Two samples of a binary op: (3, 4) with (4,) broadcast, and a 0-d with (2, 3)."""
    def samples():
        r = rng(seed)
        return [Sample((randf(r, 3, 4, low=lo, high=hi), randf(r, 4, low=blo, high=bhi))),
                Sample((randf(r, low=lo, high=hi), randf(r, 2, 3, low=blo, high=bhi)))]
    return samples


def _as_kernel2(f):
    """A binary kernel computing half types in float32 and rounding back (as torch)."""
    def k(a, b):
        if a.dtype == _dt.bfloat16 or a.dtype == np.float16:
            return f(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
        return f(a, b)
    return k


def _float_pair(a, b):
    """Promoted operands, integers and bools to the default float dtype (atan2 ...)."""
    a, b = operands(a, b)
    if not _is_float(a):
        d = _dt.get_default_dtype()
        a, b = cast(a, d), cast(b, d)
    return a, b


def _unary(name, kernel, scalar, grad, onnx, lo, hi, seed, fuse="always", out_grad=False):
    """defop of a float unary op (`out_grad`: its gradient reads only the output)."""
    return defop(name, elementwise_rule(name, float_only=True), kernel=_as_kernel(kernel),
                 kind="elementwise", fuse=fuse, scalar=scalar, grad=grad, flops=numel_flops,
                 onnx=onnx, samples=_usamples(lo, hi, seed),
                 saves=() if out_grad else None, save_output=out_grad)


def _rsq(x, s):
    """sqrt(1 - x*x) for s = None (asin, acos), else sqrt(x*x + s) (asinh, acosh)."""
    return sqrt(sub(1.0, mul(x, x))) if s is None else sqrt(add(mul(x, x), s))


# ---------------------------------------------------------------------- unary float ops
TAN = _unary("tan", np.tan, "tan(a)", lambda g, y, a: mul(g, add(mul(y, y), 1.0)), "Tan",
             -1.2, 1.2, 20, out_grad=True)
ASIN = _unary("asin", np.arcsin, "asin(a)", lambda g, y, a: div(g, _rsq(a, None)), "Asin",
              -0.9, 0.9, 21)
ACOS = _unary("acos", np.arccos, "acos(a)", lambda g, y, a: neg(div(g, _rsq(a, None))), "Acos",
              -0.9, 0.9, 22)
ATAN = _unary("atan", np.arctan, "atan(a)", lambda g, y, a: div(g, add(mul(a, a), 1.0)),
              "Atan", -3, 3, 23)
SINH = _unary("sinh", np.sinh, "sinh(a)", lambda g, y, a: mul(g, cosh(a)), "Sinh", -2, 2, 24)
COSH = _unary("cosh", np.cosh, "cosh(a)", lambda g, y, a: mul(g, sinh(a)), "Cosh", -2, 2, 25)
ASINH = _unary("asinh", np.arcsinh, "asinh(a)", lambda g, y, a: div(g, _rsq(a, 1.0)), "Asinh",
               -3, 3, 26)
ACOSH = _unary("acosh", np.arccosh, "acosh(a)",
               lambda g, y, a: div(g, _rsq(a, -1.0)), "Acosh", 1.2, 4, 27)
ATANH = _unary("atanh", np.arctanh, "atanh(a)", lambda g, y, a: div(g, sub(1.0, mul(a, a))),
               "Atanh", -0.9, 0.9, 28)
LOG2 = _unary("log2", np.log2, "log2(a)", lambda g, y, a: div(g, mul(a, _LN2)), NO_ONNX,
              0.3, 4, 29)
LOG10 = _unary("log10", np.log10, "log10(a)", lambda g, y, a: div(g, mul(a, _LN10)), NO_ONNX,
               0.3, 4, 30)
EXP2 = _unary("exp2", np.exp2, "exp2(a)", lambda g, y, a: mul(g, mul(y, _LN2)), NO_ONNX,
              -3, 3, 31, out_grad=True)
ERFC = _unary("erfc", _special.erfc_kernel, "erfc(a)",
              lambda g, y, a: neg(mul(g, mul(exp(neg(mul(a, a))), 2.0 / math.sqrt(math.pi)))),
              NO_ONNX, -2, 2, 32)
# lgamma's scalar form is libm's lgamma (numba's math.lgamma), as its eager kernel
LGAMMA = _unary("lgamma", _special.lgamma_kernel, "lgamma(a)",
                lambda g, y, a: mul(g, digamma(a)), NO_ONNX, 0.2, 5, 33)
# erfinv's Halley iteration has no scalar form numba's generator can write: never fused
ERFINV = _unary("erfinv", _special.erfinv_kernel, "erfinv(a)",
                lambda g, y, a: mul(g, mul(exp(mul(y, y)), math.sqrt(math.pi) / 2.0)),
                NO_ONNX, -0.95, 0.95, 34, fuse="", out_grad=True)


def _polygamma_samples():
    r = rng(35)
    return [Sample((randf(r, 3, 4, low=0.2, high=6),), {"n": 0}),
            Sample((randf(r, 5, low=0.3, high=4),), {"n": 1})]


# polygamma (digamma at n = 0): a series with a data-dependent loop count; never fused
POLYGAMMA = defop("polygamma", elementwise_rule("polygamma", float_only=True),
                  kernel=_special.polygamma_kernel, kind="elementwise", fuse="",
                  scalar="polygamma(a)", flops=numel_flops, onnx=NO_ONNX,
                  grad=lambda g, y, a, n: mul(g, polygamma(n + 1, a)),
                  samples=_polygamma_samples)

def _sinc_kernel(a):
    px = a * a.dtype.type(math.pi)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(a == 0, a.dtype.type(1), np.sin(px) / px).astype(a.dtype, copy=False)


def _sinc_grad(g, y, a):
    # (cos(pi a) pi a - sin(pi a)) / (pi a^2), 0 at a == 0 (torch's rule); the division
    # by a safe a keeps every branch finite for the second order
    safe = where(eq(a, 0.0), 1.0, a)
    px = mul(safe, math.pi)
    d = div(sub(mul(px, cos(px)), sin(px)), mul(px, safe))
    return mul(g, where(eq(a, 0.0), 0.0, d))


SINC = _unary("sinc", _sinc_kernel, "1 if a == 0 else sin(a * 3.141592653589793) / "
              "(a * 3.141592653589793)", _sinc_grad, NO_ONNX, -2.5, 2.5, 37)

tan = _unary_fn(TAN, "Tangent. Example: ``sampan.tan(x)``")
sinc = _unary_fn(SINC, "sin(pi x) / (pi x), 1 at 0 (normalised, as torch and numpy). "
                       "Example: ``sampan.sinc(x)``")
asin = _unary_fn(ASIN, "Inverse sine (nan outside [-1, 1]). Example: ``sampan.asin(x)``")
acos = _unary_fn(ACOS, "Inverse cosine. Example: ``sampan.acos(x)``")
atan = _unary_fn(ATAN, "Inverse tangent. Example: ``sampan.atan(x)``")
sinh = _unary_fn(SINH, "Hyperbolic sine. Example: ``sampan.sinh(x)``")
cosh = _unary_fn(COSH, "Hyperbolic cosine. Example: ``sampan.cosh(x)``")
asinh = _unary_fn(ASINH, "Inverse hyperbolic sine. Example: ``sampan.asinh(x)``")
acosh = _unary_fn(ACOSH, "Inverse hyperbolic cosine (x >= 1). Example: ``sampan.acosh(x)``")
atanh = _unary_fn(ATANH, "Inverse hyperbolic tangent. Example: ``sampan.atanh(x)``")
log2 = _unary_fn(LOG2, "Base-2 logarithm. Example: ``sampan.log2(x)``")
log10 = _unary_fn(LOG10, "Base-10 logarithm. Example: ``sampan.log10(x)``")
exp2 = _unary_fn(EXP2, "2**x. Example: ``sampan.exp2(x)``")
erfc = _unary_fn(ERFC, "1 - erf(x), accurate where erf(x) is near 1. Example: "
                       "``sampan.erfc(x)``")
lgamma = _unary_fn(LGAMMA, "log|Gamma(x)| (inf at the poles). Example: ``sampan.lgamma(x)``")
erfinv = _unary_fn(ERFINV, "Inverse error function on [-1, 1] (float64-accurate). Example: "
                           "``sampan.erfinv(x)``")
arcsin, arccos, arctan = asin, acos, atan
arcsinh, arccosh, arctanh = asinh, acosh, atanh


def polygamma(n, input):
    """The n-th derivative of digamma (n = 0 is digamma itself), torch's argument order.

    Example: ``sampan.polygamma(1, x)`` (trigamma)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise op_error(SampanValueError, "polygamma", f"n={n!r}", "an integer n >= 0")
    x = _tensor(input)
    if not _is_float(x):
        x = cast(x, _dt.get_default_dtype())
    return apply(POLYGAMMA, (x,), {"n": int(n)})


def digamma(input):
    """psi(x) = d/dx lgamma(x) (-inf at 0, nan at negative integers). Example:
    ``sampan.digamma(x)``."""
    return polygamma(0, input)


# ---------------------------------------------------------------------- trunc, predicates
# (in `_mathpred.py`, below the composites made of them; imported here, where they were
# defined, so the op table keeps its order)
from ._mathpred import (ISFINITE, ISINF, ISNAN, ISNEGINF, ISPOSINF, SIGNBIT,  # noqa: E402,F401
                        TRUNC, _is_float, _tensor, fix, isfinite, isinf, isnan, isneginf,
                        isposinf, need_float, signbit, trunc)


# ---------------------------------------------------------------------- binary ops
def _atan2_grad(g, y, a, b):
    d = add(mul(a, a), mul(b, b))
    return (unbroadcast(div(mul(g, b), d), a.shape) if a.requires_grad else None,
            unbroadcast(neg(div(mul(g, a), d)), b.shape) if b.requires_grad else None)


def _logaddexp_grad(ex):
    def grad(g, y, a, b):
        return (unbroadcast(div(g, add(ex(sub(b, a)), 1.0)), a.shape) if a.requires_grad
                else None,
                unbroadcast(div(g, add(ex(sub(a, b)), 1.0)), b.shape) if b.requires_grad
                else None)
    return grad


def _hypot_grad(g, y, a, b):
    return (unbroadcast(div(mul(g, a), y), a.shape) if a.requires_grad else None,
            unbroadcast(div(mul(g, b), y), b.shape) if b.requires_grad else None)


def _copysign_grad(g, y, a, b):
    # y / a, 0 where a == 0 (torch's rule), as sign(a) * sign(y): no 0/0 computed
    return unbroadcast(mul(g, mul(sign(a), sign(y))), a.shape), None


def _xlogy_grad(g, y, a, b):
    ga = gb = None
    if a.requires_grad:
        ga = unbroadcast(where(logical_and(eq(a, 0.0), le(b, 0.0)), 0.0, xlogy(g, b)), a.shape)
    if b.requires_grad:
        gb = unbroadcast(div(mul(g, a), b), b.shape)
    return ga, gb


def _fmod_grad(g, y, a, b):
    return (unbroadcast(g, a.shape) if a.requires_grad else None,
            unbroadcast(neg(mul(g, trunc(div(a, b)))), b.shape) if b.requires_grad else None)


def _fmod_samples():
    r = rng(50)
    return [Sample((randf(r, 3, 4, low=-5, high=5), randf(r, 4, low=0.7, high=2.0))),
            Sample((r.integers(-9, 9, (3, 4)), r.integers(1, 5, (4,))))]


def _xlogy_samples():
    r = rng(51)
    a = randf(r, 3, 4)
    a[0, :2] = 0.0
    return [Sample((a, randf(r, 4, low=0.3, high=3))),
            Sample((randf(r, low=-2, high=2), randf(r, 2, 3, low=0.3, high=3)))]


def _binary_op(name, kernel, scalar, grad, onnx, samples, fuse="always", out_grad=False,
               nondiff=(), **kw):
    """defop of a binary op (`out_grad`: its gradient reads the output too)."""
    return defop(name, elementwise_rule(name, **kw), kernel=_as_kernel2(kernel),
                 kind="elementwise", fuse=fuse, scalar=scalar, grad=grad, flops=_bflops,
                 onnx=onnx, samples=samples, save_output=out_grad, nondiff_inputs=nondiff)


ATAN2 = _binary_op("atan2", np.arctan2, "atan2(a, b)", _atan2_grad, NO_ONNX,
                   _bsamples(-2, 2, -2, 2, 52), float_only=True)
LOGADDEXP = _binary_op("logaddexp", np.logaddexp, "logaddexp(a, b)",
                       _logaddexp_grad(exp), NO_ONNX, _bsamples(-3, 3, -3, 3, 53),
                       float_only=True)
LOGADDEXP2 = _binary_op("logaddexp2", np.logaddexp2, "logaddexp2(a, b)",
                        _logaddexp_grad(lambda t: exp2(t)), NO_ONNX,
                        _bsamples(-3, 3, -3, 3, 54), float_only=True)
HYPOT = _binary_op("hypot", np.hypot, "hypot(a, b)", _hypot_grad, NO_ONNX,
                   _bsamples(-2, 2, 0.5, 2, 55), out_grad=True, float_only=True)
# the sign's source gets no gradient (torch: zeros)
COPYSIGN = _binary_op("copysign", np.copysign, "copysign(a, b)", _copysign_grad, NO_ONNX,
                      _bsamples(0.2, 2, -2, 2, 56), out_grad=True, nondiff=(1,),
                      float_only=True)
# log's float32 form is mathlib's log32: fused in float32 with fast math only
XLOGY = _binary_op("xlogy", lambda a, b: np.where((a == 0) & (b == b), a.dtype.type(0),
                                                  a * np.log(b)).astype(a.dtype, copy=False),
                   "0 if (a == 0 and b == b) else a * log(b)", _xlogy_grad, NO_ONNX,
                   _xlogy_samples, fuse="float32", float_only=True)
# C's fmod (the sign of a), integers kept; ONNX Mod with fmod=1. numba's np.fmod of
# integers is wrong for negative operands (fmod(18, -4) gave 18): the scalar form calls
# it on magnitudes only and restores the sign, which is exact for floats as well (a zero
# a is returned as it is, keeping -0.0, unless b is 0 or nan)
_FMOD_SCALAR = ("(fmod(abs(a), abs(b)) if a > 0 else -fmod(abs(a), abs(b))) if a != 0 else "
                "(a if (b != 0 and b == b) else fmod(a, b))")
FMOD = _binary_op("fmod", np.fmod, _FMOD_SCALAR, _fmod_grad, "Mod", _fmod_samples)
# torch's rule: (a > 0) where a != 0, so heaviside(nan, v) is 0 (numpy's gives nan)
HEAVISIDE = _binary_op("heaviside", lambda a, b: np.where(a == 0, b, a > 0).astype(a.dtype),
                       "b if a == 0 else (1 if a > 0 else 0)", NOT_DIFFERENTIABLE, NO_ONNX,
                       _bsamples(-1, 1, 0, 1, 57))


def atan2(input, other):
    """The angle of (other, input) in (-pi, pi]; integers give the default float dtype.

    Example: ``sampan.atan2(y, x)``."""
    return apply(ATAN2, _float_pair(input, other), {})


def copysign(input, other):
    """|input| with the sign of other (-0.0 counts as negative). Example:
    ``sampan.copysign(x, -1.0)``."""
    return apply(COPYSIGN, _float_pair(input, other), {})


def xlogy(input, other):
    """input * log(other), 0 where input == 0 (unless other is nan). Example:
    ``sampan.xlogy(p, q)``."""
    return apply(XLOGY, _float_pair(input, other), {})


def _float_binary(op, doc):
    def f(input, other):
        a, b = operands(input, other)
        need_float(op.name, a)
        return apply(op, (a, b), {})
    f.__name__ = op.name
    f.__doc__ = doc
    return f


logaddexp = _float_binary(LOGADDEXP, "log(e**a + e**b) without overflow. Example: "
                                     "``sampan.logaddexp(a, b)``")
logaddexp2 = _float_binary(LOGADDEXP2, "log2(2**a + 2**b) without overflow. Example: "
                                       "``sampan.logaddexp2(a, b)``")
hypot = _float_binary(HYPOT, "sqrt(a**2 + b**2) without overflow. Example: "
                             "``sampan.hypot(a, b)``")


def fmod(input, other):
    """C's remainder: the sign of input (torch.fmod); integers stay integers. Example:
    ``sampan.fmod(x, 2.0)``."""
    return binary(FMOD, input, other)


def remainder(input, other):
    """Python's modulo: the sign of other (torch.remainder; the `mod` op, `%`). Example:
    ``sampan.remainder(x, 2.0)``."""
    return _mod(input, other)


def heaviside(input, values):
    """0 where input < 0, 1 where input > 0, `values` where input == 0. Example:
    ``sampan.heaviside(x, 0.5)``."""
    return binary(HEAVISIDE, input, values)


arctan2 = atan2


# ---------------------------------------------------------------------- lerp
def _lerp_kernel(a, b, w):
    # torch's two-sided form: exact at w == 0 and at w == 1
    dt = a.dtype
    if dt == _dt.bfloat16 or dt == np.float16:
        a, b, w = a.astype(np.float32), b.astype(np.float32), w.astype(np.float32)
    one = a.dtype.type(1)
    return np.where(np.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (one - w)).astype(
        dt, copy=False)


def _lerp_grad(g, y, a, b, w):
    return (unbroadcast(mul(g, sub(1.0, w)), a.shape) if a.requires_grad else None,
            unbroadcast(mul(g, w), b.shape) if b.requires_grad else None,
            unbroadcast(mul(g, sub(b, a)), w.shape) if w.requires_grad else None)


def _lerp_samples():
    r = rng(58)
    return [Sample((randf(r, 3, 4), randf(r, 3, 4), randf(r, 4, low=-0.5, high=1.5))),
            Sample((randf(r, 2, 3), randf(r, 3), np.asarray(0.3, np.float32)))]


LERP = defop("lerp", elementwise_rule("lerp", float_only=True),
             kernel=_lerp_kernel, kind="elementwise", fuse="always",
             scalar="a + c * (b - a) if abs(c) < 0.5 else b - (b - a) * (1 - c)",
             grad=_lerp_grad, flops=lambda a, b, w, **_: 4 * _bflops(a, b), onnx=NO_ONNX,
             samples=_lerp_samples)


def lerp(input, end, weight):
    """input + weight * (end - input); `weight` a number or a tensor. Example:
    ``sampan.lerp(a, b, 0.25)``."""
    a, b = operands(input, end)
    need_float("lerp", a)
    if isinstance(weight, Tensor):
        w = weight if weight.dtype == a.dtype else cast(weight, a.dtype)
    else:
        w = _const(float(weight), a.dtype)
    return apply(LERP, (a, b, w), {})


# the composites, after the primitives they are made of (exported below by name)
from ._mathcomp import (addcdiv, addcmul, allclose, clamp_max, clamp_min, equal,  # noqa: E402,F401
                        frac, isclose, nan_to_num)


# ---------------------------------------------------------------------- exports
def _check_inplace(fn, name):
    """`fn` for an in-place method: a float result cannot be written into an integer
    tensor (torch: "result type Float can't be cast to the desired output type Long")."""
    def f(self, *args, **kw):
        r = fn(self, *args, **kw)
        if _dt.is_floating(r.dtype) and not _dt.is_floating(self.dtype):
            raise op_error(DTypeError, name, f"an in-place result of dtype {r.dtype} for a "
                           f"tensor of dtype {self.dtype}", "a result of the tensor's dtype",
                           f"use the out-of-place {name[:-1]}()")
        return r
    f.__name__ = name
    return f


_UNARY = ["tan", "asin", "acos", "atan", "arcsin", "arccos", "arctan", "sinh", "cosh", "asinh",
          "acosh", "atanh", "arcsinh", "arccosh", "arctanh", "log2", "log10", "exp2", "erfc",
          "erfinv", "lgamma", "digamma", "sinc", "trunc", "fix", "frac", "nan_to_num", "clamp_min",
          "clamp_max"]
_BINARY = ["atan2", "arctan2", "remainder", "fmod", "lerp", "addcmul", "addcdiv", "copysign",
           "hypot", "xlogy", "heaviside"]
_NO_INPLACE = ["isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "isclose",
               "allclose", "equal", "logaddexp", "logaddexp2"]
EXPORTS: list = _UNARY + _BINARY + _NO_INPLACE + ["polygamma"]
METHODS: dict = {n: globals()[n] for n in _UNARY + _BINARY + _NO_INPLACE}
METHODS["polygamma"] = lambda self, n: polygamma(n, self)
INPLACE: dict = {n + "_": _check_inplace(globals()[n], n + "_") for n in _UNARY + _BINARY}
INPLACE["polygamma_"] = _check_inplace(lambda self, n: polygamma(n, self), "polygamma_")
