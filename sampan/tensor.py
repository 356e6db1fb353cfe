"""Tensor: a numpy array plus what autograd needs.

Eager dispatch lives here too (`apply`): it is the hot path of every op, so it is
kept short: check the inputs against the op's shape rule (cached; elementwise ops skip
it, their numpy kernels check what the rule checks), run the kernel, wrap the result,
record a tape node when any input requires grad. A kernel failure is explained with
the shape rule too.
"""
from __future__ import annotations

from math import prod as _prod
from weakref import ref as _weakref

import numpy as np

from . import dtypes as _dt
from .device import CPU
from .errors import AutogradError, SampanError
from .autograd.tape import Node
from .ops.registry import NOT_DIFFERENTIABLE, STATE, check_inputs, raise_kernel_error
from .ops import modes as _modes

_ndarray = np.ndarray
_asarray = np.asarray


class Tensor:
    """An n-dimensional array with autograd.

    Example::

        >>> x = sampan.tensor([1.0, 2.0], requires_grad=True)
        >>> (x * x).sum().backward(); x.grad
        tensor([2., 4.])
    """

    __array_priority__ = 1000
    # class-level defaults keep tensor creation on the hot path to one attribute store
    requires_grad = False
    grad = None
    _node = None
    _idx = 0
    _base = None        # the tensor owning the memory (its version counter is shared)
    _view = None        # (base, ((op, attrs), ...)): how this view is made from its base
    _vsync = 0          # the base's version when this view's history was last rebuilt
    _version = 0
    _hooks = None
    _detached_from = None   # weakref to the tensor this one is a detach() of
    name = None

    def __init__(self, data, dtype=None, requires_grad=False):
        if isinstance(data, Tensor):
            data = data._data
        self._data = _to_array(data, dtype)
        if STATE.tracer is not None:  # sampan.jit: made during a trace, so local to one call
            STATE.tracer.born(self, self._data is not data, data)
        if requires_grad:
            self.requires_grad_(True)

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def device(self):
        return CPU

    @property
    def ndim(self) -> int:
        return len(self._data.shape)

    def size(self, dim=None):
        """Shape, or the length of one dimension."""
        s = self._data.shape
        return s if dim is None else s[dim]

    def numel(self) -> int:
        if type(self._data) is not _ndarray:   # traced: symbolic sizes stay symbolic
            return _prod(self._data.shape)
        return int(np.prod(self._data.shape, dtype=np.int64))

    def dim(self) -> int:
        return self.ndim

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def grad_fn(self):
        return self._node

    # ------------------------------------------------------------------ conversion
    def numpy(self) -> np.ndarray:
        """The underlying array (shares memory); raises if it needs grad tracking."""
        if STATE.tracer is not None and not isinstance(self._data, _ndarray):
            raise STATE.tracer.concrete_error(self, "numpy()/item()/float()")
        return self._data

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def item(self):
        a = self.numpy()
        if a.size != 1:
            raise SampanError(f"item(): got a tensor of shape {a.shape}; expected one element")
        return a.reshape(()).item() if a.dtype != _dt.bfloat16 else float(a.reshape(()))

    def tolist(self):
        a = self.numpy()
        if a.dtype in (_dt.bfloat16, _dt.float16):
            a = a.astype(np.float32)
        return a.tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if not _dt.is_integer(self.dtype):
            raise TypeError("only integer tensors can be used as an index")
        return int(self.item())

    def __bool__(self):
        if STATE.tracer is not None and not isinstance(self._data, _ndarray):
            return STATE.tracer.bool_of(self)
        if self._data.size != 1:
            raise SampanError(
                f"bool(): the truth value of a tensor of shape {self.shape} is ambiguous; "
                "use .any() or .all()")
        return bool(self._data.reshape(()))

    def __len__(self):
        if not self._data.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __hash__(self):
        return id(self)

    def __repr__(self):
        if not isinstance(self._data, _ndarray):
            return f"tensor(<traced {self._data!r}>)"
        a = self._data
        body = np.array2string(a.astype(np.float32) if a.dtype == _dt.bfloat16 else a,
                               separator=", ", prefix="tensor(", threshold=200)
        extra = []
        if a.dtype not in (_dt.get_default_dtype(), _dt.int64, _dt.bool_):
            extra.append(f"dtype={_dt.dtype_name(a.dtype)}")
        if self._node is not None:
            extra.append(f"grad_fn=<{self._node.op.name}>")
        elif self.requires_grad:
            extra.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extra) + ")"

    # ------------------------------------------------------------------ autograd
    def requires_grad_(self, flag: bool = True) -> "Tensor":
        """Mark a leaf tensor as requiring grad (floating dtypes only)."""
        if flag and not _dt.is_floating(self.dtype):
            raise SampanError(f"requires_grad_: got dtype {self.dtype}; "
                              "expected a floating dtype (only they have gradients)")
        if self._node is not None and not flag:
            raise AutogradError("requires_grad_(False) on a non-leaf tensor; use detach()")
        self.requires_grad = flag
        return self

    def detach(self) -> "Tensor":
        """A tensor sharing data with this one, cut from the graph."""
        t = _new(Tensor)
        t._data = self._data
        t._base = self._base if self._base is not None else self
        # weakly (a detached loss must not keep its graph alive): a trace that writes t or
        # self passes the write on to the other, as the shared memory does in eager
        t._detached_from = _weakref(self)
        if STATE.tracer is not None:
            STATE.tracer.detached(t, self)
        return t

    def detach_(self) -> "Tensor":
        self._node = None
        self.requires_grad = False
        return self

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) into every leaf's `.grad`."""
        from .autograd.engine import backward
        backward([self], None if gradient is None else [gradient], retain_graph,
                 create_graph, inputs)

    def register_hook(self, fn):
        """Call `fn(grad)` when this tensor's gradient is computed; it may return a new grad.
        Returns a handle whose ``remove()`` unregisters it.

        Example::

            >>> h = x.register_hook(lambda g: g * 2)
            >>> h.remove()
        """
        if not self.requires_grad:
            raise AutogradError("register_hook: tensor does not require grad")
        if self._node is not None:
            return self._node.add_hook(self._idx, fn)
        from .autograd.hooks import RemovableHandle
        if self._hooks is None:
            self._hooks = {}
        h = RemovableHandle(self._hooks)
        self._hooks[h.id] = fn
        return h

    def retain_grad(self):
        """Keep `.grad` on a non-leaf tensor after backward."""
        if self._node is None:
            return
        import weakref
        ref = weakref.ref(self)

        def keep(g):
            t = ref()
            if t is not None:
                t.grad = g if t.grad is None else t.grad + g
        self._node.add_hook(self._idx, keep)

    # ------------------------------------------------------------------ copies & moves
    def clone(self) -> "Tensor":
        from .ops import shape as _s
        return _s.clone(self)

    def contiguous(self) -> "Tensor":
        if isinstance(self._data, _ndarray) and self._data.flags.c_contiguous:
            return self
        return self.clone()

    def to(self, *args, dtype=None, device=None, copy=False, non_blocking=False) -> "Tensor":
        """Convert dtype and/or device: ``t.to("float64")``, ``t.to(device="cpu")``,
        ``t.to(other)`` (other's dtype and device)."""
        from .device import Device, as_device
        for a in args:
            if isinstance(a, (Device,)) or (isinstance(a, str) and a.split(":")[0] in
                                           ("cpu", "cuda")):
                device = a
            elif isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            else:
                dtype = a
        if device is not None:
            as_device(device)
        out = self
        if dtype is not None and _dt.as_dtype(dtype) != self.dtype:
            from .ops.elementwise import cast
            out = cast(self, dtype)
        elif copy:
            out = self.clone()
        return out

    def cpu(self) -> "Tensor":
        return self

    def type_as(self, other) -> "Tensor":
        return self.to(other.dtype)

    def float(self):
        return self.to(_dt.float32)

    def double(self):
        return self.to(_dt.float64)

    def half(self):
        return self.to(_dt.float16)

    def bfloat16(self):
        return self.to(_dt.bfloat16)

    def long(self):
        return self.to(_dt.int64)

    def int(self):
        return self.to(_dt.int32)

    def bool(self):
        return self.to(_dt.bool_)


_new = object.__new__


def _to_array(data, dtype=None) -> np.ndarray:
    if dtype is not None:
        dtype = _dt.as_dtype(dtype)
    if isinstance(data, _ndarray):
        # a numpy array keeps its dtype (float64 stays float64, as torch.from_numpy does)
        a = data if dtype is None or data.dtype == dtype else data.astype(dtype)
    else:
        a = _asarray(data)
        if dtype is None:
            if a.dtype.kind == "f" and a.dtype != _dt.bfloat16 and a.dtype != np.float16:
                dtype = _dt.get_default_dtype()
            elif a.dtype.kind in "iu" and a.dtype != np.uint8:
                dtype = _dt.int64
        if dtype is not None and a.dtype != dtype:
            a = a.astype(dtype)
    if a.dtype not in _dt._NAMES:
        raise SampanError(f"tensor: got data of dtype {a.dtype}; expected one of "
                          f"{', '.join(_dt.DTYPES)}")
    return a


def wrap(arr) -> Tensor:
    """Wrap an ndarray without copying (internal fast path)."""
    t = _new(Tensor)
    t._data = arr
    return t


# ---------------------------------------------------------------------- dispatch
_HOOKS = _modes.HOOKS


def apply(op, inputs, attrs):
    """Run one op eagerly (or hand it to the tracer) and record it on the tape."""
    st = STATE
    if _HOOKS.active and not st.hooked:  # a profiler or autocast is on (sampan/ops/modes.py)
        return _modes.dispatch(op, inputs, attrs)
    if st.tracer is not None:
        return st.tracer.apply(op, inputs, attrs)
    if op.eager_check:
        check_inputs(op, inputs, attrs)
    if op.differentiable and st.grad_enabled:
        # a view whose base was written in place since: its history first becomes the
        # view of the base's current history (once here, for one or several outputs)
        for t in inputs:
            if t._view is not None and t._vsync != t._base._version:
                refresh_view(t)
    try:
        n = len(inputs)
        if attrs:
            out = op.kernel(*[t._data for t in inputs], **attrs)
        elif n == 2:
            out = op.kernel(inputs[0]._data, inputs[1]._data)
        elif n == 1:
            out = op.kernel(inputs[0]._data)
        else:
            out = op.kernel(*[t._data for t in inputs])
    except Exception as e:  # explain the failure with the shape rule
        raise_kernel_error(op, inputs, attrs, e)
    if op.n_out == 1:
        if type(out) is not _ndarray:
            out = _asarray(out)
        elif out.ndim > 1 and out.base is None and not out.flags.c_contiguous:
            # a fresh result in another layout (numpy keeps a transposed input's): made
            # C-contiguous, so that whether a later reshape is a view does not depend on
            # layouts the tracer cannot see (eager and jit agree on it)
            out = np.ascontiguousarray(out)
        y = _new(Tensor)
        y._data = out
        if op.view:
            x = inputs[0]
            xd = x._data
            # numpy's reshape copies a non-contiguous array: then it is no view
            if (out.base if out.base is not None else out) is (
                    xd.base if xd.base is not None else xd):
                mark_view(y, x, op, attrs)
        if op.differentiable and st.grad_enabled:
            for t in inputs:
                if t.requires_grad:
                    if op.keeps_float or out.dtype in _FLOATS:
                        y._node = Node(op, inputs, attrs, (y,))
                        y.requires_grad = True
                    break
        return y
    ys = tuple(wrap(_asarray(o)) for o in out)
    if op.differentiable and st.grad_enabled:
        for t in inputs:
            if t.requires_grad:
                _record(op, inputs, attrs, ys)
                break
    return ys


def mark_view(y, x, op, attrs):
    """`y = op(x, **attrs)` aliases x's memory: remember the base and how to rebuild y
    from it, so an in-place op through y can be recorded on the base's history."""
    y._base = b = x._base if x._base is not None else x
    v = x._view
    y._view = (x, ((op, attrs),)) if v is None else (v[0], v[1] + ((op, attrs),))
    y._vsync = b._version


def refresh_view(t):
    """The base of view `t` was modified in place since t's history was made: t's values
    are now the base's, so its history becomes "view of the base's current history"
    (and, while tracing, its Value the view of the base's current Value)."""
    base, chain = t._view
    cur = base
    # the history is rebuilt even where grad is off (a traced read of the view in a
    # no_grad block): else the view would come out of it with no history at all
    prev, STATE.grad_enabled = STATE.grad_enabled, True
    try:
        for op, attrs in chain:
            cur = apply(op, (cur,), attrs)
    finally:
        STATE.grad_enabled = prev
    t._vsync = t._base._version
    if STATE.tracer is not None:       # traced: the Value is rebuilt as well
        t._data = cur._data
    t._node, t._idx = cur._node, cur._idx
    t.requires_grad = cur.requires_grad
    return t


_FLOATS = frozenset(d for d in _dt.DTYPES.values() if _dt.is_floating(d))


def _record(op, inputs, attrs, outs):
    node = Node(op, inputs, attrs, outs)
    i = 0
    for y in outs:
        if y._data.dtype in _FLOATS:
            y._node = node
            y._idx = i
            y.requires_grad = True
        i += 1


def as_tensor(x, dtype=None) -> Tensor:
    """Return `x` as a Tensor, without copying when possible."""
    if isinstance(x, Tensor):
        return x if dtype is None or x.dtype == _dt.as_dtype(dtype) else x.to(dtype)
    return Tensor(x, dtype=dtype)
