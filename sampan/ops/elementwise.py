"""Elementwise primitives: one block per op (rule, kernel, gradient, scalar form, FLOPs,
ONNX mapping, samples). Python-facing functions promote dtypes and wrap scalars
before calling `apply`, so every kernel sees inputs of one dtype.

Here: the frontends, binary arithmetic, comparisons and logic, where and cast. The unary
math ops (exp, relu, gelu …) are in unary.py, re-exported at the end of this module."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..ir.symint import SymFloat, SymInt
from ..tensor import Tensor, apply, wrap
from ._util import (Sample, binary_samples, elementwise_rule, numel_flops, randf, rng,
                    unbroadcast)
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


def _where_kernel(c, a, b):
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
    d = np.dtype(dtype)      # a dtype name (the frontends write sampan's canonical ones)
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


# the unary family (exp, relu, gelu …) is in unary.py; its names stay importable here
from .unary import (  # noqa: E402,F401
    GELU, GELU_GRAD, RELU_GRAD, SIGMOID_GRAD, TANH_GRAD, _U, _as_kernel, _one,
    _relu, abs, ceil, cos, erf, exp, expm1, floor, gelu_exact, gelu_grad, log, log1p, neg,
    reciprocal, relu, relu_grad, round, rsqrt, sigmoid, sigmoid_grad, sign, sin, softplus_op,
    sqrt, square, tanh, tanh_grad)
