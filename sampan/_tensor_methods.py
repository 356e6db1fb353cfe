"""Python operators and methods of Tensor, bound to the op frontends.

Kept apart from tensor.py so that Tensor itself stays a small data class and every
method is visibly the same function users can call as ``sampan.<name>``."""
from __future__ import annotations

import numpy as np

from .autograd.tape import bump_version
from .errors import AutogradError, ShapeError, op_error
from .ops import composite as C
from .ops import creation, elementwise as E, index as I, linalg as L, reduce as R, shape as S
from .ops import sort as O
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
    "cumsum": R.cumsum, "reshape": S.reshape, "permute": S.permute,
    "transpose": S.transpose, "swapaxes": S.swapaxes, "swapdims": S.swapdims,
    "expand": S.expand, "broadcast_to": S.expand,
    "squeeze": S.squeeze, "unsqueeze": S.unsqueeze, "flatten": S.flatten, "flip": S.flip,
    "split": S.split, "chunk": S.chunk, "narrow": S.narrow,
    "index_select": I.index_select, "gather": lambda self, axis, index: I.take_along_axis(
        self, index, axis), "take_along_axis": I.take_along_axis,
    "softmax": C.softmax, "log_softmax": C.log_softmax, "logsumexp": C.logsumexp,
    "var": C.var, "std": C.std, "sort": O.sort, "argsort": O.argsort, "topk": O.topk,
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
def _inplace(self, result, name="in-place op"):
    """Write `result` into self's storage and make the tape see it as a new op.

    Through a view (``y[0].mul_(3)``, ``out[:, :2].sigmoid_()``) the write is recorded
    on the base's history, as PyTorch's CopySlices does: ``base <- unview(base, result)``
    (setitem, reshape back ...: ops with gradients), and the view's history becomes
    "view of the new base"; so gradients through the base and through other views see
    the new values."""
    _check_fits(self, result, name)
    if STATE.tracer is not None:  # functionalised by the tracer (also for captured tensors)
        return STATE.tracer.inplace(self, result, name)
    grad = STATE.grad_enabled
    view = self._view
    if grad:
        check_inplace_target(self, name)
    data = result._data
    if data.dtype != self._data.dtype:
        data = data.astype(self._data.dtype)
    if not self._data.flags.writeable:
        raise op_error(AutogradError, name, f"a read-only (broadcast) view of shape "
                       f"{tuple(self.shape)}", "a tensor that owns or views writable memory",
                       "clone() it first")
    node = result._node
    if node is not None and grad:
        node.preserve_input(self)     # before the write: the rule may read self's old value
    np.copyto(self._data, np.broadcast_to(data, self._data.shape))
    bump_version(self)
    if not grad:
        return self
    if view is not None and (node is not None or view[0].requires_grad):
        rebase_view(self, result, name)
    elif node is not None:
        # history continues from the out-of-place result's node
        self._node, self._idx = result._node, result._idx
        self.requires_grad = True
        result._node.rebind_output(result._idx, self)
    elif self.requires_grad:
        # overwritten by values that need no gradient (zero_, fill_, copy_ of a constant):
        # self's old history gets a zero gradient, not the gradient of self
        _take_history(self, S.setitem(self, Ellipsis, _as_target(self, result)))
    return self


def _check_fits(t, result, name):
    """An in-place op writes into t: its out-of-place result must broadcast to t's shape
    (``s.add_(v)`` with s 0-d and v of shape (1,) cannot grow s), as in PyTorch."""
    rs, ts = tuple(result.shape), tuple(t.shape)
    if rs == ts:
        return
    ok = len(rs) <= len(ts) and all(a == 1 or a == b or not isinstance(a, int) or
                                    not isinstance(b, int) for a, b in zip(rs[::-1], ts[::-1]))
    if not ok:
        raise op_error(ShapeError, name, f"a result of shape {rs} to write into a tensor of "
                       f"shape {ts}", "a result that broadcasts to the tensor's shape (an "
                       "in-place op cannot change it)")


def check_inplace_target(t, name="in-place op"):
    """Raise for in-place ops autograd cannot record (grad mode on): on a leaf that
    requires grad, or on a view of one (its gradient would be lost, as in PyTorch)."""
    view = t._view
    if view is not None:
        b = view[0]
        if b.requires_grad and b._node is None:
            raise op_error(
                AutogradError, name, f"a view (shape {tuple(t.shape)}) of a leaf tensor "
                f"(shape {tuple(b.shape)}) that requires grad", "a tensor computed by ops "
                "while grad is on", "wrap it in sampan.no_grad() (e.g. for an optimizer "
                "update), or clone() the leaf first")
    elif t.requires_grad and t._node is None:
        raise op_error(
            AutogradError, name, f"a leaf tensor (shape {tuple(t.shape)}) that requires grad",
            "a tensor computed by ops while grad is on", "wrap it in sampan.no_grad() "
            "(e.g. for optimizer updates) or use an out-of-place op")


def _as_target(t, r):
    """`r` with t's dtype and shape, by ops (so its history is kept)."""
    if r.dtype != t.dtype:
        r = E.cast(r, t.dtype)
    if tuple(r.shape) != tuple(t.shape):
        r = S.expand(r, tuple(t.shape))
    return r


def _take_history(t, new):
    t._node, t._idx = new._node, new._idx
    t.requires_grad = new.requires_grad


def rebase_view(v, result, name="in-place op"):
    """Record ``v <- result`` (v a view; its memory is written already, or, traced, is
    about to be rebound) on the history of v's base, and rebuild v from the base."""
    base, chain = v._view
    for op, _ in chain:
        if op.unview is None:
            raise op_error(AutogradError, name, f"a read-only view of shape {tuple(v.shape)} "
                           f"made by {op.name}", "a tensor that owns or views writable memory",
                           "clone() it first")
    new = _unview(base, chain, _as_target(v, result))
    traced = STATE.tracer is not None     # traced: Values are rebound (functionalised)
    grad = STATE.grad_enabled
    if grad and base.requires_grad and not new.requires_grad:
        # a view covering all of the base (.T, reshape ...) overwritten by values that need
        # no gradient: the base keeps a history that gives its old one a zero gradient
        # (as torch's CopySlices), instead of becoming a constant
        new = S.setitem(base, Ellipsis, new)
    if traced:
        base._data = new._data
    if grad:
        _take_history(base, new)
    cur = base
    for op, attrs in chain:
        cur = apply(op, (cur,), attrs)
    if traced:
        v._data = cur._data
    if grad:
        _take_history(v, cur)
    v._vsync = v._base._version
    if result._node is not None and grad:
        result._node.rebind_output(result._idx, v)   # the rule reads v's values now


def _unview(x, chain, value):
    """x with the part that `chain` (view ops) selects replaced by `value`, by ops."""
    op, attrs = chain[0]
    if len(chain) > 1:
        value = _unview(apply(op, (x,), attrs), chain[1:], value)
    return op.unview(x, value, **attrs)


def _mk_inplace(f, name):
    def m(self, *args, **kw):
        return _inplace(self, f(self, *args, **kw), name)
    m.__name__ = name
    return m


for _n, _f in {"add_": E.add, "sub_": E.sub, "mul_": E.mul, "div_": E.div, "pow_": E.pow,
               "clamp_": E.clamp, "relu_": E.relu, "tanh_": E.tanh, "exp_": E.exp,
               "neg_": E.neg, "sigmoid_": E.sigmoid}.items():
    setattr(Tensor, _n, _mk_inplace(_f, _n))
for _n, _f, _s in [("__iadd__", E.add, "+="), ("__isub__", E.sub, "-="),
                   ("__imul__", E.mul, "*="), ("__itruediv__", E.div, "/=")]:
    setattr(Tensor, _n, _mk_inplace(_f, _s))


def _zero_(self):
    return _inplace(self, creation.zeros_like(self), "zero_")


def _fill_(self, value):
    return _inplace(self, creation.full_like(self, value), "fill_")


def _copy_(self, src):
    src = src if isinstance(src, Tensor) else Tensor(src)
    # src broadcast to self's shape (not self * 0 + src: inf * 0 is NaN); a new node when
    # src has history, so that self does not take over src's node
    r = _as_target(self, src)
    if r is src and src.requires_grad and STATE.grad_enabled:
        r = S.clone(src)
    return _inplace(self, r, "copy_")


def _setitem(self, idx, value):
    _inplace(self, S.setitem(self, idx, value), "setitem")


Tensor.zero_ = _zero_
Tensor.fill_ = _fill_
Tensor.copy_ = _copy_
Tensor.__setitem__ = _setitem


def _bind_family_methods():
    """The issue-17 op families list their Tensor methods in `METHODS` (name -> function of
    self) and their in-place methods in `INPLACE` (e.g. "masked_fill_" -> masked_fill: the
    out-of-place function, whose result is written into self as the other in-place ops)."""
    from .ops import decomp, layout, mathops, scan, scatter
    for mod in (decomp, layout, mathops, scan, scatter):
        for name, fn in mod.METHODS.items():
            setattr(Tensor, name, fn)
        for name, fn in getattr(mod, "INPLACE", {}).items():
            setattr(Tensor, name, _mk_inplace(fn, name))


_bind_family_methods()


# ---------------------------------------------------------------------- PyTorch surface
def _is_dtype_arg(a):
    return isinstance(a, np.dtype) or (isinstance(a, type) and issubclass(a, np.generic))


def _view(self, *shape):
    """``x.view(2, -1)``: a reshape; ``x.view(sampan.int32)``: the same memory read as
    another dtype of the same size (eager only: not differentiable, not traceable)."""
    if len(shape) == 1 and _is_dtype_arg(shape[0]):
        return _view_dtype(self, shape[0])
    return S.reshape(self, *shape)


def _view_dtype(self, dtype):
    from . import dtypes as _dt
    from .errors import DTypeError, SampanError
    from .tensor import wrap
    d = _dt.as_dtype(dtype)
    if STATE.tracer is not None:
        raise SampanError("view(dtype): reading memory as another dtype is not traceable "
                          "inside sampan.jit; use it outside the jitted function")
    if d.itemsize != self._data.dtype.itemsize:
        raise op_error(DTypeError, "view", f"dtype {self.dtype} -> {d}",
                       "a dtype of the same element size")
    t = wrap(self._data.view(d))
    t._base = self._base if self._base is not None else self
    return t


def _get_data(self):
    """``t.data``: the same memory with no history, as PyTorch. Writes through it
    (``p.data.mul_(2)``) change `t` without being recorded and without counting as an
    in-place change of `t` for autograd's saved-tensor check."""
    if STATE.tracer is not None:    # traced: a detach, so the write reaches t's Value
        return self.detach()
    from .tensor import wrap
    return wrap(self._data)


def _set_data(self, value):
    """``p.data = t``: p now holds t's memory (shape and dtype too), keeping its own
    autograd state (a leaf stays a leaf), as PyTorch."""
    from . import dtypes as _dt
    from .errors import DTypeError, SampanError
    if STATE.tracer is not None:
        raise SampanError("assigning .data inside sampan.jit is not traceable; use "
                          "x.copy_(t) under sampan.no_grad()")
    value = value if isinstance(value, Tensor) else Tensor(value)
    if self.requires_grad and not _dt.is_floating(value.dtype):
        raise op_error(DTypeError, "data", f"a tensor of dtype {value.dtype} for a tensor "
                       "that requires grad", "a floating dtype")
    self._data = value._data
    self._view, self._base = None, None


Tensor.view = _view
Tensor.data = property(_get_data, _set_data)


def _stride(self, dim=None):
    """Strides in elements (PyTorch's unit), or the stride of one dim.
    Example: ``sampan.zeros(2, 3).stride()`` is ``(3, 1)``."""
    a = self.numpy()
    item = a.itemsize
    st = tuple(s // item for s in a.strides)
    if dim is None:
        return st
    return st[S._dim_range("stride", dim, a.ndim)]


def _size(self, dim=None):
    """The shape, or the length of one dim (negative dims count from the end)."""
    s = self._data.shape
    if dim is None:
        return s
    return s[S._dim_range("size", dim, len(s))]


def _is_contiguous(self, memory_format=None):
    """Whether the elements lie in row-major order without gaps (size-1 dims' strides do
    not count, as in PyTorch)."""
    a = self._data
    return not isinstance(a, np.ndarray) or a.flags.c_contiguous


def _type(self, dtype=None):
    """``x.type()``: the type name (``"sampan.FloatTensor"``); ``x.type(dtype)``: x as
    that dtype (itself when it has it already)."""
    if dtype is None:
        return "sampan." + _TYPE_NAMES.get(self.dtype.name, self.dtype.name) + "Tensor"
    return self.to(dtype)


_TYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half",
               "bfloat16": "BFloat16", "int64": "Long", "int32": "Int", "int16": "Short",
               "int8": "Char", "uint8": "Byte", "bool": "Bool"}

Tensor.stride = _stride
Tensor.size = _size
Tensor.is_contiguous = _is_contiguous
Tensor.type = _type
Tensor.ndimension = lambda self: self.ndim
Tensor.nelement = Tensor.numel
Tensor.element_size = lambda self: self._data.dtype.itemsize
Tensor.itemsize = property(lambda self: self._data.dtype.itemsize)
Tensor.nbytes = property(lambda self: self._data.dtype.itemsize * self.numel())
Tensor.short = lambda self: self.to("int16")
Tensor.char = lambda self: self.to("int8")
Tensor.byte = lambda self: self.to("uint8")


def _new_shape(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(size)


def _new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
    """Zeros of shape `size` with this tensor's dtype (unless `dtype`): ``x.new_zeros(2, 3)``."""
    return creation.zeros(_new_shape(size), dtype=dtype or self.dtype, device=device,
                          requires_grad=requires_grad)


def _new_ones(self, *size, dtype=None, device=None, requires_grad=False):
    """Ones of shape `size` with this tensor's dtype (unless `dtype`)."""
    return creation.ones(_new_shape(size), dtype=dtype or self.dtype, device=device,
                         requires_grad=requires_grad)


def _new_empty(self, *size, dtype=None, device=None, requires_grad=False):
    """A tensor of shape `size` with this tensor's dtype (zeros, as `sampan.empty`)."""
    return _new_zeros(self, *size, dtype=dtype, device=device, requires_grad=requires_grad)


def _new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
    """`fill_value` in shape `size` with this tensor's dtype (unless `dtype`)."""
    return creation.full(tuple(size), fill_value, dtype=dtype or self.dtype, device=device,
                         requires_grad=requires_grad)


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    """A copy of `data` with this tensor's dtype (unless `dtype`), with no history."""
    if isinstance(data, Tensor):
        data = data.numpy()
    return creation.tensor(np.array(data), dtype=dtype or self.dtype, device=device,
                           requires_grad=requires_grad)


Tensor.new_zeros = _new_zeros
Tensor.new_ones = _new_ones
Tensor.new_empty = _new_empty
Tensor.new_full = _new_full
Tensor.new_tensor = _new_tensor
