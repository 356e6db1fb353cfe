"""Python operators and methods of Tensor, bound to the op frontends.

Kept apart from tensor.py so that Tensor itself stays a small data class and every
method is visibly the same function users can call as ``sampan.<name>``."""
from __future__ import annotations

import numpy as np

from .autograd.tape import bump_version
from .errors import AutogradError
from .ops import composite as C
from .ops import creation, elementwise as E, index as I, linalg as L, reduce as R, shape as S
from .ops.registry import STATE
from .tensor import Tensor, apply


def _rev(f):
    def r(self, other):
        return f(other, self)
    return r


def _matmul_r(self, other):
    return L.matmul(other, self)


_ops = {
    "__add__": E.add, "__radd__": _rev(E.add), "__sub__": E.sub, "__rsub__": _rev(E.sub),
    "__mul__": E.mul, "__rmul__": _rev(E.mul), "__truediv__": E.div,
    "__rtruediv__": _rev(E.div), "__floordiv__": E.floor_divide,
    "__rfloordiv__": _rev(E.floor_divide), "__mod__": E.mod, "__rmod__": _rev(E.mod),
    "__pow__": E.pow, "__rpow__": _rev(E.pow), "__matmul__": L.matmul,
    "__rmatmul__": _matmul_r, "__eq__": E.eq, "__ne__": E.ne, "__lt__": E.lt, "__le__": E.le,
    "__gt__": E.gt, "__ge__": E.ge, "__and__": E.logical_and, "__or__": E.logical_or,
    "__xor__": E.logical_xor, "__neg__": E.neg, "__abs__": E.abs,
    "__invert__": E.logical_not, "__getitem__": S.getitem,
}
for _n, _f in _ops.items():
    setattr(Tensor, _n, _f)


def _fast_binary(op, general):
    """Operator method with the common case (two tensors of one dtype) going straight to
    dispatch; everything else (scalars, promotion) takes the op's frontend."""
    empty = {}

    def method(self, other):
        if type(other) is Tensor and self._data.dtype is other._data.dtype:
            return apply(op, (self, other), empty)
        return general(self, other)
    method.__name__ = general.__name__
    return method


for _n, _op, _f in [("__add__", E.ADD, E.add), ("__sub__", E.SUB, E.sub),
                    ("__mul__", E.MUL, E.mul)]:
    setattr(Tensor, _n, _fast_binary(_op, _f))
Tensor.__pos__ = lambda self: self

_methods = {
    "add": E.add, "sub": E.sub, "mul": E.mul, "div": E.div, "pow": E.pow, "matmul": L.matmul,
    "maximum": E.maximum, "minimum": E.minimum, "eq": E.eq, "ne": E.ne, "lt": E.lt, "le": E.le,
    "gt": E.gt, "ge": E.ge, "neg": E.neg, "abs": E.abs, "exp": E.exp, "log": E.log,
    "sqrt": E.sqrt, "rsqrt": E.rsqrt, "sin": E.sin, "cos": E.cos, "tanh": E.tanh,
    "sigmoid": E.sigmoid, "relu": E.relu, "erf": E.erf, "sign": E.sign, "floor": E.floor,
    "ceil": E.ceil, "round": E.round, "reciprocal": E.reciprocal, "log1p": E.log1p,
    "expm1": E.expm1, "square": E.square, "clamp": E.clamp, "clip": E.clamp,
    "logical_not": E.logical_not, "where": lambda self, cond, other: E.where(cond, self, other),
    "sum": R.sum, "mean": R.mean, "amax": R.amax, "amin": R.amin, "max": R.max, "min": R.min,
    "prod": R.prod, "argmax": R.argmax, "argmin": R.argmin, "all": R.all, "any": R.any,
    "cumsum": R.cumsum, "reshape": S.reshape, "view": S.reshape, "permute": S.permute,
    "transpose": S.transpose, "expand": S.expand, "broadcast_to": S.expand,
    "squeeze": S.squeeze, "unsqueeze": S.unsqueeze, "flatten": S.flatten, "flip": S.flip,
    "split": S.split, "chunk": S.chunk, "narrow": S.narrow,
    "index_select": I.index_select, "gather": lambda self, axis, index: I.take_along_axis(
        self, index, axis), "take_along_axis": I.take_along_axis,
    "softmax": C.softmax, "log_softmax": C.log_softmax, "logsumexp": C.logsumexp,
    "var": C.var, "std": C.std,
}
for _n, _f in _methods.items():
    setattr(Tensor, _n, _f)

Tensor.T = property(lambda self: S.permute(self, tuple(range(self.ndim))[::-1]))
Tensor.mT = property(lambda self: S.transpose(self, -2, -1))


def _view_as(self, other):
    return S.reshape(self, tuple(other.shape))


def _expand_as(self, other):
    return S.expand(self, tuple(other.shape))


Tensor.view_as = _view_as
Tensor.expand_as = _expand_as


# ---------------------------------------------------------------------- in-place ops
def _inplace(self, result):
    """Write `result` into self's storage and make the tape see it as a new op."""
    if STATE.tracer is not None:  # functionalised by the tracer (also for captured tensors)
        return STATE.tracer.inplace(self, result)
    if self.requires_grad and self._node is None and STATE.grad_enabled:
        raise AutogradError(
            "in-place operation on a leaf tensor that requires grad; wrap it in "
            "sampan.no_grad() (e.g. for optimizer updates) or use an out-of-place op")
    data = result._data
    if data.dtype != self._data.dtype:
        data = data.astype(self._data.dtype)
    if not self._data.flags.writeable:
        raise AutogradError("in-place operation on a read-only (broadcast) view; clone() it first")
    node = result._node
    if node is not None and STATE.grad_enabled:
        node.preserve_input(self)     # the rule may read self's old value: keep a copy
    np.copyto(self._data, np.broadcast_to(data, self._data.shape))
    bump_version(self)
    if node is not None and STATE.grad_enabled:
        # history continues from the out-of-place result's node
        self._node, self._idx = result._node, result._idx
        self.requires_grad = True
        result._node.rebind_output(result._idx, self)
    return self


def _mk_inplace(f):
    def m(self, *args, **kw):
        return _inplace(self, f(self, *args, **kw))
    return m


for _n, _f in {"add_": E.add, "sub_": E.sub, "mul_": E.mul, "div_": E.div, "pow_": E.pow,
               "clamp_": E.clamp, "relu_": E.relu, "tanh_": E.tanh, "exp_": E.exp,
               "neg_": E.neg, "sigmoid_": E.sigmoid}.items():
    setattr(Tensor, _n, _mk_inplace(_f))
for _n, _f in {"__iadd__": E.add, "__isub__": E.sub, "__imul__": E.mul,
               "__itruediv__": E.div}.items():
    setattr(Tensor, _n, _mk_inplace(_f))


def _zero_(self):
    return _inplace(self, creation.zeros_like(self))


def _fill_(self, value):
    return _inplace(self, creation.full_like(self, value))


def _copy_(self, src):
    src = src if isinstance(src, Tensor) else Tensor(src)
    return _inplace(self, E.add(E.mul(self, 0), E.cast(src, self.dtype))
                    if src.requires_grad else E.cast(src, self.dtype))


def _setitem(self, idx, value):
    _inplace(self, S.setitem(self, idx, value))


Tensor.zero_ = _zero_
Tensor.fill_ = _fill_
Tensor.copy_ = _copy_
Tensor.__setitem__ = _setitem
