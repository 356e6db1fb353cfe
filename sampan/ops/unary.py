"""The unary math family of the op table: exp, log, tanh, relu, erf, GELU … and the
single-op gradients of tanh, sigmoid, relu and GELU (one kernel in eager backward; their
own gradients written with ops). The binary, comparison, where and cast ops and the
frontends these use are in `elementwise`, which re-exports everything here."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ._util import Sample, elementwise_rule, numel_flops, randf, rng, unary_samples
from .elementwise import _unary_fn, add, binary, div, mul, sub
from .registry import NOT_DIFFERENTIABLE, NO_ONNX, defop


# ---------------------------------------------------------------------- unary math
try:  # scipy's erf is exact to the last bit; fall back to math.erf per element
    from scipy.special import erf as _erf_kernel
except ImportError:  # pragma: no cover
    _erf_vec = np.vectorize(math.erf, otypes=[np.float64])

    def _erf_kernel(a):
        return _erf_vec(a).astype(a.dtype)


def _as_kernel(f):
    """Kernels that upcast half types to float32 and round back (for non-ufunc math)."""
    def k(a):
        if a.dtype == _dt.bfloat16 or a.dtype == np.float16:
            return f(a.astype(np.float32)).astype(a.dtype)
        return f(a)
    return k


def _relu(a):
    return np.maximum(a, a.dtype.type(0))


def _softplus(a):
    # log(1 + e^a) without overflow; one op, so that its gradient is sigmoid(a) exactly,
    # second order included (the max/abs/log1p composite lost the curvature at a == 0,
    # where abs' gradient is 0)
    return np.logaddexp(a.dtype.type(0), a)


def _sigmoid(a):
    # 1/(1+e^-x) written to avoid overflow for very negative x
    e = np.exp(-np.abs(a))
    return np.where(a >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
# fusion (OpDef.fuse) of the unary ops below: mathlib has float32 forms of the
# transcendental ones; sin, cos, log1p, expm1, sign and round stay single kernels
_FUSE_UNARY = {"neg": "always", "abs": "always", "relu": "always", "sqrt": "always",
               "reciprocal": "always", "floor": "always", "ceil": "always", "exp": "float32",
               "log": "float32", "tanh": "float32", "erf": "float32", "sigmoid": "float32"}
# mixed precision (OpDef.amp): exponentials and logarithms compute in float32 under autocast
_AMP_UNARY = {"exp": "float32", "log": "float32", "log1p": "float32", "expm1": "float32",
              "softplus": "float32"}
_U = {}
for _name, _kernel, _scalar, _grad, _onnx, _lo, _hi, _save, _so in [
    ("neg", np.negative, "-a", lambda g, y, a: neg(g), "Neg", -2, 2, (), False),
    ("abs", np.abs, "abs(a)", lambda g, y, a: mul(g, sign(a)), "Abs", -2, 2, None, False),
    ("exp", np.exp, "exp(a)", lambda g, y, a: mul(g, y), "Exp", -2, 2, (), True),
    ("log", np.log, "log(a)", lambda g, y, a: div(g, a), "Log", 0.5, 3, None, False),
    ("sqrt", np.sqrt, "sqrt(a)", lambda g, y, a: div(g, mul(y, 2.0)), "Sqrt", 0.5, 3, (), True),
    ("sin", np.sin, "sin(a)", lambda g, y, a: mul(g, cos(a)), "Sin", -2, 2, None, False),
    ("cos", np.cos, "cos(a)", lambda g, y, a: neg(mul(g, sin(a))), "Cos", -2, 2, None, False),
    ("tanh", np.tanh, "tanh(a)", lambda g, y, a: tanh_grad(y, g), "Tanh", -2, 2, (), True),
    ("sigmoid", _sigmoid, "1 / (1 + exp(-a))", lambda g, y, a: sigmoid_grad(y, g), "Sigmoid",
     -3, 3, (), True),
    # from the output (y > 0 exactly where a > 0, NaN included): the pre-activation need
    # not be kept, and a fused bias+relu kernel writes one array instead of two
    ("relu", _relu, "max(a, 0)", lambda g, y, a: relu_grad(y, g), "Relu", -2, 2, (), True),
    ("erf", _as_kernel(_erf_kernel), "erf(a)",
     lambda g, y, a: mul(g, mul(exp(neg(mul(a, a))), _TWO_OVER_SQRT_PI)), "Erf", -2, 2, None,
     False),
    ("reciprocal", np.reciprocal, "1 / a", lambda g, y, a: neg(mul(g, mul(y, y))), "Reciprocal",
     0.5, 2, (), True),
    ("log1p", np.log1p, "log1p(a)", lambda g, y, a: div(g, add(a, 1.0)), NO_ONNX, -0.5, 2, None,
     False),
    ("expm1", np.expm1, "expm1(a)", lambda g, y, a: mul(g, add(y, 1.0)), NO_ONNX, -2, 2, (), True),
    ("softplus", _softplus, "max(a, 0) + log1p(exp(-abs(a)))",
     lambda g, y, a: mul(g, sigmoid(a)), "Softplus", -3, 3, None, False),
]:
    _U[_name] = defop(_name, elementwise_rule(_name, float_only=_name not in ("neg", "abs")),
                      kernel=_kernel, kind="elementwise", fuse=_FUSE_UNARY.get(_name, ""),
                      scalar=_scalar, grad=_grad, flops=numel_flops, onnx=_onnx,
                      samples=unary_samples(_lo, _hi), saves=_save, save_output=_so,
                      amp=_AMP_UNARY.get(_name, "follow"))

# non-differentiable (piecewise-constant) unary ops: gradient is zero
for _name, _kernel, _scalar, _onnx in [("sign", np.sign, "sign(a)", "Sign"),
                                       ("floor", np.floor, "floor(a)", "Floor"),
                                       ("ceil", np.ceil, "ceil(a)", "Ceil"),
                                       ("round", np.round, "round(a)", "Round")]:
    _U[_name] = defop(_name, elementwise_rule(_name), kernel=_kernel, kind="elementwise",
                      fuse=_FUSE_UNARY.get(_name, ""), scalar=_scalar, grad=NOT_DIFFERENTIABLE,
                      flops=numel_flops, onnx=_onnx, samples=unary_samples(-2.3, 2.3))

neg = _unary_fn(_U["neg"], "Elementwise -x.", float_only=False)
abs = _unary_fn(_U["abs"], "Elementwise |x|.", float_only=False)
exp = _unary_fn(_U["exp"], "Elementwise e**x. Example: ``sampan.exp(x)``")
log = _unary_fn(_U["log"], "Natural logarithm.")
sqrt = _unary_fn(_U["sqrt"], "Square root.")
sin = _unary_fn(_U["sin"], "Sine.")
cos = _unary_fn(_U["cos"], "Cosine.")
tanh = _unary_fn(_U["tanh"], "Hyperbolic tangent. Example: ``sampan.tanh(x)``")
sigmoid = _unary_fn(_U["sigmoid"], "Logistic sigmoid 1/(1+e^-x).")
softplus_op = _unary_fn(_U["softplus"], "log(1 + e^x), stable; gradient sigmoid(x). The "
                        "public `sampan.softplus` adds the beta scaling.")
relu = _unary_fn(_U["relu"], "max(x, 0).", float_only=False)
erf = _unary_fn(_U["erf"], "Gauss error function.")
reciprocal = _unary_fn(_U["reciprocal"], "1/x.")
log1p = _unary_fn(_U["log1p"], "log(1 + x), accurate near 0.")
expm1 = _unary_fn(_U["expm1"], "e**x - 1, accurate near 0.")
sign = _unary_fn(_U["sign"], "Sign of x (-1, 0, 1); zero gradient.", float_only=False)
floor = _unary_fn(_U["floor"], "Round down; zero gradient.", float_only=False)
ceil = _unary_fn(_U["ceil"], "Round up; zero gradient.", float_only=False)
round = _unary_fn(_U["round"], "Round half to even; zero gradient.", float_only=False)


# The gradients of tanh and sigmoid as single ops (one kernel instead of three in eager
# backward); their own gradients are written with ops, so higher orders still work.
def _tg_grad(gg, r, y, g):
    return mul(gg, mul(mul(y, g), -2.0)), mul(gg, sub(1.0, mul(y, y)))


def _sg_grad(gg, r, y, g):
    return mul(gg, mul(g, sub(1.0, mul(y, 2.0)))), mul(gg, mul(y, sub(1.0, y)))


def _ygrad_samples(lo, hi):
    def samples():
        r = rng(9)
        return [Sample((randf(r, 3, 4, low=lo, high=hi), randf(r, 3, 4))),
                Sample((randf(r, 5, low=lo, high=hi), randf(r, 5)))]
    return samples


def _one(dt):
    return dt.type(1)


TANH_GRAD = defop("tanh_grad", elementwise_rule("tanh_grad"),
                  kernel=lambda y, g: g * (_one(y.dtype) - y * y), fuse="always",
                  kind="elementwise",
                  scalar="b * (1 - a * a)", grad=_tg_grad, flops=numel_flops, onnx=NO_ONNX,
                  samples=_ygrad_samples(-0.9, 0.9))
SIGMOID_GRAD = defop("sigmoid_grad", elementwise_rule("sigmoid_grad"),
                     kernel=lambda y, g: g * y * (_one(y.dtype) - y), fuse="always",
                     kind="elementwise",
                     scalar="b * a * (1 - a)", grad=_sg_grad, flops=numel_flops, onnx=NO_ONNX,
                     samples=_ygrad_samples(0.1, 0.9))


# relu's gradient as one op: g where a > 0, else 0 (NaN inputs give 0, as gt(a, 0) did).
# It was gt + zeros + where: three ops and three passes per relu in every backward.
def _relu_grad_kernel(a, g):
    return np.where(a > 0, g, g.dtype.type(0)).astype(g.dtype, copy=False)


def _relu_grad_samples():
    r = rng(11)
    a = randf(r, 3, 4)
    a[0, 0] = np.nan
    return [Sample((a, randf(r, 3, 4))), Sample((randf(r, 5), randf(r, 5)))]


RELU_GRAD = defop("relu_grad", elementwise_rule("relu_grad"), kernel=_relu_grad_kernel,
                  fuse="always", kind="elementwise", scalar="b if a > 0 else 0",
                  grad=lambda gg, y, a, g: (None, relu_grad(a, gg)), saves=(0,),
                  flops=numel_flops, onnx=NO_ONNX, samples=_relu_grad_samples,
                  nondiff_inputs=(0,))


def relu_grad(a, g):
    """g where a > 0, else 0: the gradient of relu from its input a (or its output)."""
    return binary(RELU_GRAD, a, g)


def tanh_grad(y, g):
    """g * (1 - y**2): the gradient of tanh from its output y."""
    return binary(TANH_GRAD, y, g)


def sigmoid_grad(y, g):
    """g * y * (1 - y): the gradient of sigmoid from its output y."""
    return binary(SIGMOID_GRAD, y, g)


# ---------------------------------------------------------------------- GELU (exact, erf)
# One primitive instead of five (x*0.5*(1+erf(x/sqrt2))): eager runs one kernel and its
# gradient reads only x (the composite kept erf's and exp's intermediates), and jit
# fuses it from the scalar forms below like any elementwise op.
_R2 = 0.7071067811865476      # 1/sqrt(2)
_R2PI = 0.3989422804014327    # 1/sqrt(2*pi)
_GELU_SCALAR = "a * 0.5 * (1 + erf(a * 0.7071067811865476))"
_GELU_GRAD_SCALAR = "b * dgelu(a)"   # mathlib's dgelu32/dgelu64: Phi(a) + a * phi(a)

def _gelu_kernel(a):
    t = a.dtype.type
    return a * t(0.5) * (t(1.0) + _erf_kernel(a * t(_R2)))


def _gelu_grad_kernel(a, g):
    if a.dtype.itemsize == 2:
        # bfloat16/float16 in float32, rounded once: numpy's exp of bfloat16 gave float64
        # (issue 31: a float64 gradient under bf16 autocast, unlike its bf16 spec in jit)
        return _gelu_grad_kernel(a.astype(np.float32), g.astype(np.float32)).astype(a.dtype)
    t = a.dtype.type
    cdf = t(0.5) * (t(1.0) + _erf_kernel(a * t(_R2)))
    return g * (cdf + a * (t(_R2PI) * np.exp(a * a * t(-0.5))))


def _gelu_gg(gg, r, a, g):
    # d/da [g (cdf + a pdf)] = g pdf (2 - a^2);  d/dg = cdf + a pdf
    pdf = mul(exp(mul(mul(a, a), -0.5)), _R2PI)
    return mul(gg, mul(g, mul(pdf, sub(2.0, mul(a, a))))), gelu_grad(a, gg)


def _gelu_samples():
    r = rng(74)
    return [Sample((randf(r, 3, 5, low=-3, high=3),)), Sample((randf(r, 7, low=-1, high=1),))]


def _gelu_grad_samples():
    r = rng(75)
    return [Sample((randf(r, 3, 5, low=-3, high=3), randf(r, 3, 5))),
            Sample((randf(r, 6, low=-1, high=1), randf(r, 6)))]


GELU = defop("gelu", elementwise_rule("gelu", float_only=True), kernel=_as_kernel(_gelu_kernel),
             fuse="float32", kind="elementwise", scalar=_GELU_SCALAR,
             grad=lambda g, y, a: gelu_grad(a, g), flops=numel_flops, onnx="Gelu",
             samples=_gelu_samples, saves=(0,))
GELU_GRAD = defop("gelu_grad", elementwise_rule("gelu_grad", float_only=True),
                  kernel=_gelu_grad_kernel, fuse="float32", kind="elementwise",
                  scalar=_GELU_GRAD_SCALAR,
                  grad=_gelu_gg, flops=numel_flops, onnx=NO_ONNX, samples=_gelu_grad_samples)


gelu_exact = _unary_fn(GELU, "x * Phi(x), Phi the standard normal CDF (erf form); one "
                              "primitive op.")


def gelu_grad(a, g):
    """g * (Phi(a) + a * phi(a)): the gradient of exact GELU at a."""
    return binary(GELU_GRAD, a, g)


def rsqrt(x):
    """1/sqrt(x)."""
    return reciprocal(sqrt(x))


def square(x):
    """x*x."""
    return mul(x, x)
