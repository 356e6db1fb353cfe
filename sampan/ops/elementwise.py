"""Elementwise primitives: one block per op (rule, kernel, gradient, scalar form, FLOPs,
ONNX mapping, samples). Python-facing functions promote dtypes and wrap scalars
before calling `apply`, so every kernel sees inputs of one dtype."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..ir.symint import SymFloat, SymInt
from ..tensor import Tensor, apply, wrap
from ._util import (Sample, binary_samples, elementwise_rule, numel_flops, randf, rng,
                    unary_samples, unbroadcast)
from ._nb import FASTMATH_IEEE, HAVE_NUMBA, njit, run_flat
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, STATE, Spec, defop

_isfloat = _dt.is_floating
_SYMBOLIC = (SymInt, SymFloat)


# ---------------------------------------------------------------------- frontends
_CONSTS: dict = {}


def _const(value, dtype):
    """A scalar constant; the read-only 0-d arrays are cached per (value, dtype). A
    symbolic size (a SymInt while jit traces dynamic dims) stays symbolic: a node."""
    if type(value) in _SYMBOLIC and STATE.tracer is not None:
        return STATE.tracer.sym_scalar(value, dtype)
    key = (type(value), value, dtype)
    a = _CONSTS.get(key)
    if a is None:
        a = np.asarray(value, dtype=dtype)
        a.flags.writeable = False
        if len(_CONSTS) < 4096:
            _CONSTS[key] = a
    return wrap(a)


def _array_operand(x):
    """A numpy array met as an operand: a tensor of its dtype (0-d: a Python scalar)."""
    return x.item() if x.ndim == 0 else Tensor(x)


def operands(a, b):
    """Promote two operands (tensors, numpy arrays or Python scalars) to one dtype."""
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            da, db = a._data.dtype, b._data.dtype
            if da is db or da == db:
                return a, b
            # a 0-d tensor is weaker than one with dims (PyTorch's rule, dtypes.py)
            d = _dt.operand_dtype(da, a._data.ndim == 0, db, b._data.ndim == 0)
            return (a if da == d else cast(a, d)), (b if db == d else cast(b, d))
        if type(b) is np.ndarray:
            return operands(a, _array_operand(b))
        d = _dt.scalar_dtype(b, a._data.dtype)
        return (a if d == a._data.dtype else cast(a, d)), _const(b, d)
    if isinstance(b, Tensor):
        if type(a) is np.ndarray:
            return operands(_array_operand(a), b)
        d = _dt.scalar_dtype(a, b._data.dtype)
        return _const(a, d), (b if d == b._data.dtype else cast(b, d))
    return Tensor(a), Tensor(b)


_FLOAT_DTYPES = frozenset(d for d in _dt.DTYPES.values() if _dt.is_floating(d))


def _float_operand(x):
    x = x if isinstance(x, Tensor) else Tensor(x)
    return x if x._data.dtype in _FLOAT_DTYPES else cast(x, _dt.get_default_dtype())


_EMPTY = {}


def binary(op, a, b):
    if type(a) is Tensor and type(b) is Tensor and a._data.dtype is b._data.dtype:
        return apply(op, (a, b), _EMPTY)
    a, b = operands(a, b)
    return apply(op, (a, b), _EMPTY)


def _binary_fn(op, doc):
    def f(a, b):
        return binary(op, a, b)
    f.__name__ = op.name
    f.__doc__ = doc
    return f


def _unary_fn(op, doc, float_only=True):
    empty = {}

    def f(x):
        if type(x) is not Tensor or x._data.dtype not in _FLOAT_DTYPES:
            x = _float_operand(x) if float_only else (x if isinstance(x, Tensor) else Tensor(x))
        return apply(op, (x,), empty)
    f.__name__ = op.name
    f.__doc__ = doc
    return f


# ---------------------------------------------------------------------- binary arithmetic
def _bflops(a, b, **_):
    from ._util import broadcast_shapes
    return numel_flops(Spec(broadcast_shapes("flops", a.shape, b.shape), a.dtype))


ADD = defop("add", elementwise_rule("add"), kernel=np.add, fuse="always", kind="elementwise",
            scalar="a + b",
            grad=lambda g, y, a, b: (unbroadcast(g, a.shape), unbroadcast(g, b.shape)),
            saves=(), flops=_bflops, onnx="Add", samples=binary_samples())
SUB = defop("sub", elementwise_rule("sub"), kernel=np.subtract, fuse="always", kind="elementwise",
            scalar="a - b", saves=(), flops=_bflops, onnx="Sub", samples=binary_samples(),
            grad=lambda g, y, a, b: (unbroadcast(g, a.shape), unbroadcast(neg(g), b.shape)))
MUL = defop("mul", elementwise_rule("mul"), kernel=np.multiply, fuse="always", kind="elementwise",
            scalar="a * b", flops=_bflops, onnx="Mul", samples=binary_samples(),
            saves=((1,), (0,)),      # a's gradient reads b, b's reads a
            grad=lambda g, y, a, b: (
                unbroadcast(mul(g, b), a.shape) if a.requires_grad else None,
                unbroadcast(mul(g, a), b.shape) if b.requires_grad else None))
DIV = defop("div", elementwise_rule("div", float_only=True), kernel=np.true_divide,
            fuse="always", kind="elementwise", scalar="a / b", flops=_bflops, onnx="Div",
            samples=binary_samples(blow=0.5, bhigh=2.0),
            saves=((1,), (0, 1)),    # a's gradient reads b, b's reads a and b
            grad=lambda g, y, a, b: (
                unbroadcast(div(g, b), a.shape) if a.requires_grad else None,
                unbroadcast(neg(div(mul(g, a), mul(b, b))), b.shape) if b.requires_grad
                else None))


def _pow_grad(g, y, a, b):
    # d/da a**b = b * a**(b-1), which is 0 where b == 0 (PyTorch's rule): 0 * 0**-1 gave
    # NaN at a == 0. The exponent is made safe (1 where b == 0) rather than the product
    # masked, so no branch holds an inf that a second-order gradient would reach.
    safe_b = where(eq(b, 0), ones_like_(b), b)
    ga = mul(g, mul(b, pow(a, sub(safe_b, 1))))
    safe = where(gt(a, 0), a, ones_like_(a))
    gb = mul(g, mul(pow(a, b), where(gt(a, 0), log(safe), zeros_like_(a))))
    return unbroadcast(ga, a.shape), unbroadcast(gb, b.shape)


POW = defop("pow", elementwise_rule("pow"), kernel=np.power, kind="elementwise",
            scalar="a ** b", flops=_bflops, onnx="Pow", grad=_pow_grad,
            samples=binary_samples(low=0.5, high=2.0), amp="float32")


def _minmax_grad(cmp):
    def grad(g, y, a, b):
        half = _const(0.5, g.dtype)
        w = where(cmp(a, b), ones_like_(g), where(eq(a, b), expand_like(half, g),
                                                  zeros_like_(g)))
        return unbroadcast(mul(g, w), a.shape), unbroadcast(mul(g, sub(1.0, w)), b.shape)
    return grad


MAXIMUM = defop("maximum", elementwise_rule("maximum"), kernel=np.maximum, fuse="always",
                kind="elementwise",
                scalar="max(a, b)", flops=_bflops, onnx="Max", samples=binary_samples(),
                grad=_minmax_grad(lambda a, b: gt(a, b)))
MINIMUM = defop("minimum", elementwise_rule("minimum"), kernel=np.minimum, fuse="always",
                kind="elementwise",
                scalar="min(a, b)", flops=_bflops, onnx="Min", samples=binary_samples(),
                grad=_minmax_grad(lambda a, b: lt(a, b)))


def _int_samples():
    r = rng(3)
    return [Sample((r.integers(-9, 9, (3, 4)), r.integers(1, 5, (4,))))]


FLOOR_DIVIDE = defop("floor_divide", elementwise_rule("floor_divide"), kernel=np.floor_divide,
                     kind="elementwise", scalar="a // b", grad=NOT_DIFFERENTIABLE,
                     flops=_bflops, onnx=NO_ONNX, samples=_int_samples)


def _mod_samples():
    r = rng(3)
    return _int_samples() + [Sample((randf(r, 3, 4, low=-5, high=5),
                                     randf(r, 4, low=0.7, high=2.0)))]


# torch.remainder's gradients: g for a, -g * floor(a / b) for b
MOD = defop("mod", elementwise_rule("mod"), kernel=np.mod, kind="elementwise", scalar="a % b",
            grad=lambda g, y, a, b: (
                unbroadcast(g, a.shape) if a.requires_grad else None,
                unbroadcast(neg(mul(g, floor_divide(a, b))), b.shape) if b.requires_grad
                else None),
            flops=_bflops, onnx="Mod", samples=_mod_samples)

add = _binary_fn(ADD, "Elementwise a + b with broadcasting. Example: ``sampan.add(x, 1.0)``")
sub = _binary_fn(SUB, "Elementwise a - b. Example: ``sampan.sub(x, y)``")
mul = _binary_fn(MUL, "Elementwise a * b. Example: ``sampan.mul(x, 2.0)``")
maximum = _binary_fn(MAXIMUM, "Elementwise maximum (ties split the gradient).")
minimum = _binary_fn(MINIMUM, "Elementwise minimum (ties split the gradient).")
floor_divide = _binary_fn(FLOOR_DIVIDE, "Elementwise floor(a / b).")
mod = _binary_fn(MOD, "Elementwise a mod b (sign of b, like Python).")


def div(a, b):
    """True division; integer inputs give the default float dtype. Example: ``x / 2``."""
    a, b = operands(a, b)
    if not _isfloat(a._data.dtype):
        a, b = cast(a, _dt.get_default_dtype()), cast(b, _dt.get_default_dtype())
    return apply(DIV, (a, b), {})


def pow(a, b):
    """Elementwise a ** b. Example: ``sampan.pow(x, 2)``."""
    return binary(POW, a, b)


# ---------------------------------------------------------------------- comparisons & logic
def _cmp_samples():
    r = rng(4)
    a = r.integers(-2, 3, (3, 4)).astype(np.float32)
    return [Sample((a, r.integers(-2, 3, (4,)).astype(np.float32))), Sample((a, a.copy()))]


def _bool_samples():
    r = rng(5)
    return [Sample((r.random((3, 4)) > 0.5, r.random((4,)) > 0.5))]


_CMP = {}
for _name, _k, _s, _onnx in [("eq", np.equal, "a == b", "Equal"),
                             ("ne", np.not_equal, "a != b", NO_ONNX),
                             ("lt", np.less, "a < b", "Less"),
                             ("le", np.less_equal, "a <= b", "LessOrEqual"),
                             ("gt", np.greater, "a > b", "Greater"),
                             ("ge", np.greater_equal, "a >= b", "GreaterOrEqual")]:
    _CMP[_name] = defop(_name, elementwise_rule(_name, out_dtype=np.bool_), kernel=_k,
                        kind="elementwise", fuse="always", scalar=_s, grad=NOT_DIFFERENTIABLE,
                        flops=_bflops, onnx=_onnx, samples=_cmp_samples)
for _name, _k, _s, _onnx in [("logical_and", np.logical_and, "a and b", "And"),
                             ("logical_or", np.logical_or, "a or b", "Or"),
                             ("logical_xor", np.logical_xor, "a != b", "Xor")]:
    _CMP[_name] = defop(_name, elementwise_rule(_name, out_dtype=np.bool_), kernel=_k,
                        kind="elementwise", fuse="always", scalar=_s, grad=NOT_DIFFERENTIABLE,
                        flops=_bflops, onnx=_onnx, samples=_bool_samples)

eq = _binary_fn(_CMP["eq"], "Elementwise a == b (bool).")
ne = _binary_fn(_CMP["ne"], "Elementwise a != b (bool).")
lt = _binary_fn(_CMP["lt"], "Elementwise a < b (bool).")
le = _binary_fn(_CMP["le"], "Elementwise a <= b (bool).")
gt = _binary_fn(_CMP["gt"], "Elementwise a > b (bool).")
ge = _binary_fn(_CMP["ge"], "Elementwise a >= b (bool).")


def _logic(op):
    def f(a, b):
        a = a if isinstance(a, Tensor) else Tensor(a)
        b = b if isinstance(b, Tensor) else Tensor(b)
        return apply(op, (cast(a, "bool") if a.dtype != np.bool_ else a,
                          cast(b, "bool") if b.dtype != np.bool_ else b), {})
    f.__name__ = op.name
    f.__doc__ = f"Elementwise {op.name.split('_')[1]} of truth values."
    return f


logical_and = _logic(_CMP["logical_and"])
logical_or = _logic(_CMP["logical_or"])
logical_xor = _logic(_CMP["logical_xor"])

LOGICAL_NOT = defop("logical_not", lambda a: Spec(a.shape, np.dtype(np.bool_)),
                    kernel=np.logical_not, kind="elementwise", fuse="always", scalar="not a",
                    grad=NOT_DIFFERENTIABLE, flops=numel_flops, onnx="Not",
                    samples=lambda: [Sample((rng(6).random((3, 4)) > 0.5,))])


def logical_not(x):
    """Elementwise not (bool)."""
    x = x if isinstance(x, Tensor) else Tensor(x)
    return apply(LOGICAL_NOT, (x if x.dtype == np.bool_ else cast(x, "bool"),), {})


# ---------------------------------------------------------------------- unary math
try:  # scipy's erf is exact to the last bit; fall back to math.erf per element
    from scipy.special import erf as _erf_kernel
except ImportError:  # pragma: no cover
    _erf_vec = np.vectorize(math.erf, otypes=[np.float64])

    def _erf_kernel(a):
        return _erf_vec(a).astype(a.dtype)


if HAVE_NUMBA:
    from ..backends.numba.mathlib import erf32 as _erf32

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH_IEEE)
    def _erf32_loop(a, out):
        for i in range(a.size):
            out[i] = _erf32(a[i])


def _f32_fast(*arrays):
    return HAVE_NUMBA and all(a.dtype == np.float32 for a in arrays) and arrays[0].size


def _erf_any(a):
    """erf: float32 through mathlib's vectorised erf32 (a rational fit, within 6 ulps of
    the correctly rounded value, and the value jit's fused kernels compute), ~35x faster
    than scipy's scalar erf here; float64 (and float32 without numba) through scipy."""
    if _f32_fast(a):
        return run_flat(_erf32_loop, np.float32, a)
    return _erf_kernel(a)


def _as_kernel(f):
    """Kernels that upcast half types to float32 and round back (for non-ufunc math)."""
    def k(a):
        if a.dtype == _dt.bfloat16 or a.dtype == np.float16:
            return f(a.astype(np.float32)).astype(a.dtype)
        return f(a)
    return k


if HAVE_NUMBA:
    @njit(cache=True, nogil=True, error_model="numpy")
    def _relu_loop(a, out):
        # np.maximum(a, 0) bit for bit (NaN kept, -0.0 -> +0.0) as selects LLVM vectorises:
        # numpy's maximum took ~4x as long here on activation-sized arrays
        z = a.dtype.type(0)
        for i in range(a.size):
            v = a[i]
            out[i] = v if v > z or v != v else z


def _relu(a):
    if HAVE_NUMBA and a.dtype in _RELU_FAST:
        return run_flat(_relu_loop, a.dtype, a)
    return np.maximum(a, a.dtype.type(0))


_RELU_FAST = {np.dtype(np.float32), np.dtype(np.float64)}


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
    ("erf", _as_kernel(_erf_any), "erf(a)",
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
if HAVE_NUMBA:
    @njit(cache=True, nogil=True, error_model="numpy")
    def _relu_grad_loop(a, g, out):
        z = g.dtype.type(0)
        for i in range(a.size):
            v = g[i]            # both loaded before the select: a vector blend, no branch
            out[i] = v if a[i] > 0 else z


def _relu_grad_kernel(a, g):
    if HAVE_NUMBA and a.shape == g.shape and a.dtype == g.dtype and g.dtype in _WHERE_FAST:
        return run_flat(_relu_grad_loop, g.dtype, a, g)
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

if HAVE_NUMBA:
    from ..backends.numba.mathlib import dgelu32 as _dgelu32

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH_IEEE)
    def _gelu32_loop(a, out):
        for i in range(a.size):
            x = a[i]
            out[i] = x * np.float32(0.5) * (np.float32(1.0) + _erf32(x * np.float32(_R2)))

    @njit(cache=True, nogil=True, error_model="numpy", fastmath=FASTMATH_IEEE)
    def _gelu_grad32_loop(a, g, out):
        for i in range(a.size):
            out[i] = g[i] * _dgelu32(a[i])


def _gelu_kernel(a):
    if _f32_fast(a):   # erf32 as in `_erf_any`: the formula fused jit kernels use
        return run_flat(_gelu32_loop, np.float32, a)
    t = a.dtype.type
    return a * t(0.5) * (t(1.0) + _erf_kernel(a * t(_R2)))


def _gelu_grad_kernel(a, g):
    if _f32_fast(a, g) and a.shape == g.shape:
        return run_flat(_gelu_grad32_loop, np.float32, a, g)
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


# ---------------------------------------------------------------------- where & cast
def _where_rule(c, a, b):
    from ._util import broadcast_shapes, same_dtype
    from ..errors import DTypeError, op_error
    if c.dtype != np.bool_:
        raise op_error(DTypeError, "where", f"condition dtype {c.dtype}", "bool")
    return Spec(broadcast_shapes("where", c.shape, a.shape, b.shape), same_dtype("where", a, b))


def _where_grad(g, y, c, a, b):
    # only the branches that need a gradient (a masked fill's constant side does not),
    # with a scalar zero rather than a zeros tensor
    ga = unbroadcast(where(c, g, 0.0), a.shape) if a.requires_grad else None
    gb = unbroadcast(where(c, 0.0, g), b.shape) if b.requires_grad else None
    return None, ga, gb


def _where_samples():
    r = rng(7)
    return [Sample((r.random((3, 4)) > 0.5, randf(r, 3, 4), randf(r, 4)), diff=(1, 2)),
            Sample((r.random((4,)) > 0.5, randf(r, 2, 1), randf(r, 2, 4)), diff=(1, 2))]


@njit(cache=True, nogil=True, error_model="numpy")
def _where_loop(c, a, b, out, full_a, full_b):
    # c repeats every c.size elements of out; a and b are full (out.size) or one value.
    # Both sides are loaded before the select, so LLVM emits a vector blend: numpy's
    # where branches per element and ran 17x slower on random masks here.
    mc = c.size
    av = a[0]
    bv = b[0]
    for r in range(out.size // mc):
        base = r * mc
        if full_a and full_b:
            for j in range(mc):
                x = a[base + j]
                y = b[base + j]
                out[base + j] = x if c[j] else y
        elif full_a:
            for j in range(mc):
                x = a[base + j]
                out[base + j] = x if c[j] else bv
        elif full_b:
            for j in range(mc):
                y = b[base + j]
                out[base + j] = av if c[j] else y
        else:
            for j in range(mc):
                out[base + j] = av if c[j] else bv


_WHERE_FAST = {np.dtype(np.float32), np.dtype(np.float64)}


def _where_kernel(c, a, b):
    """np.where, through `_where_loop` when the layout allows: a and b of one float dtype,
    each contiguous of the result's shape or a single value, and a contiguous condition
    broadcast only over leading dims."""
    if HAVE_NUMBA and a.dtype in _WHERE_FAST and b.dtype == a.dtype and c.dtype == np.bool_:
        shape = np.broadcast_shapes(c.shape, a.shape, b.shape)
        n = math.prod(shape)
        full_a, full_b = a.shape == shape, b.shape == shape
        cs = c.shape
        while cs and cs[0] == 1:
            cs = cs[1:]
        if (n and (full_a or a.size == 1) and (full_b or b.size == 1)
                and (not full_a or a.flags.c_contiguous) and (not full_b or b.flags.c_contiguous)
                and c.flags.c_contiguous and c.size and cs == shape[len(shape) - len(cs):]):
            out = np.empty(shape, a.dtype)
            _where_loop(c.reshape(-1), a.reshape(-1), b.reshape(-1), out.reshape(-1),
                        full_a, full_b)
            return out
    return np.where(c, a, b)


WHERE = defop("where", _where_rule, kernel=_where_kernel, fuse="always", kind="elementwise",
              scalar="a if c else b", grad=_where_grad, saves=(0,), flops=numel_flops,
              onnx="Where", samples=_where_samples, nondiff_inputs=(0,))


def where(cond, a, b):
    """Pick `a` where `cond` is true, else `b`. Example: ``sampan.where(x > 0, x, 0.0)``."""
    cond = cond if isinstance(cond, Tensor) else Tensor(cond)
    if cond.dtype != np.bool_:
        cond = cast(cond, "bool")
    a, b = operands(a, b)
    return apply(WHERE, (cond, a, b), {})


def _cast_kernel(a, dtype):
    d = _dt.as_dtype(dtype)
    return a if a.dtype == d else a.astype(d)


def _cast_grad(g, y, a, dtype):
    if not _isfloat(a.dtype):
        return (None,)
    return (cast(g, _dt.dtype_name(a.dtype)),)


def _cast_samples():
    r = rng(8)
    x = randf(r, 3, 4)
    return [Sample((x,), {"dtype": "float64"}), Sample((x,), {"dtype": "int32"}, diff=()),
            Sample((x,), {"dtype": "bfloat16"}), Sample((x,), {"dtype": "float16"})]


CAST = defop("cast", lambda a, dtype: Spec(a.shape, _dt.as_dtype(dtype)), kernel=_cast_kernel,
             kind="elementwise", fuse="always", scalar="cast(a)", grad=_cast_grad, saves=(),
             flops=numel_flops,
             keeps_float=False,
             onnx="Cast", samples=_cast_samples)


def cast(x, dtype):
    """Convert to `dtype` (differentiable between float dtypes). Example: ``cast(x, "f64")``."""
    x = x if isinstance(x, Tensor) else Tensor(x)
    name = _dt.dtype_name(_dt.as_dtype(dtype))
    if x.dtype == _dt.DTYPES[name]:
        return x
    return apply(CAST, (x,), {"dtype": name})


# ---------------------------------------------------------------------- small helpers
def zeros_like_(t):
    """A zero tensor shaped like t (a constant; used inside gradient rules)."""
    from .creation import zeros_like
    return zeros_like(t)


def ones_like_(t):
    from .creation import ones_like
    return ones_like(t)


def expand_like(x, like):
    from .shape import expand
    return expand(x, tuple(like.shape))


def clamp(x, min=None, max=None):
    """Limit values to [min, max] (either may be None). Example: ``clamp(x, 0.0, 1.0)``.

    The gradient passes where min <= x <= max, bounds included, and goes to a tensor
    bound where x is beyond it (PyTorch's convention; maximum/minimum would split it at
    the bounds). NaN stays NaN; with min > max every value is max."""
    if isinstance(min, Tensor) and min.requires_grad and max is not None:
        # PyTorch gives min no gradient unless min < max (at min == max neither bound
        # gets it); the value is unchanged
        min = where(lt(min, max), min, min.detach())
    if min is not None:
        x = where(lt(x, min), min, x)
    if max is not None:
        x = where(gt(x, max), max, x)
    return x


clip = clamp
