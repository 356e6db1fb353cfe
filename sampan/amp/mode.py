"""`autocast`: mixed precision as a dispatch mode, with the policy read from the op table.

Each op's `OpDef.amp` says what it does under autocast: "lower" ops (matmul, convolutions,
einsum) get their float32 inputs cast to the autocast dtype, "float32" ops (log_softmax,
the cross-entropy op, layer norm's statistics, exp/log/pow, sums and means) get their
bfloat16/float16 inputs cast up to float32, and "follow" ops run on whatever they are
given. PyTorch's CPU autocast puts matmul/linear/conv/bmm/einsum in its lower list and the
losses, prod, linear algebra and max_unpool2d in its float32 list, as here; softmax,
log_softmax, layer_norm, exp/log/pow, sum and mean it leaves to follow their inputs, where
sampan computes them in float32 (as PyTorch's CUDA autocast does: they are where bfloat16
loses the most), except softmax, which follows as in PyTorch's CPU autocast: its bfloat16
kernels compute each row in float32 and round once, the bytes of the float32 rule rounded
back, so attention's bf16 scores -> softmax -> bf16 matmul no longer round-trips through a
float32 copy of the (batch, heads, seq, seq) probabilities (and of their gradient).

The mode runs before the tracer, so under `sampan.jit` the casts are traced and the
fusion pass folds them into its kernels. The casts are differentiable: gradients reach
float32 master weights as float32.

Example::

    >>> with sampan.amp.autocast(sampan.bfloat16):
    ...     y = x @ w            # bfloat16
    ...     p = sampan.softmax(y, -1)   # float32
"""
from __future__ import annotations

import functools
import threading

from .. import dtypes as _dt
from ..autograd.tape import Node
from ..errors import SampanValueError
from ..ops import modes as _modes
from ..ops.registry import STATE
from ..tensor import Tensor

_LOW = (_dt.bfloat16, _dt.float16)
_F32 = _dt.float32
_TLS = threading.local()


def _stack():
    s = getattr(_TLS, "stack", None)
    if s is None:
        s = _TLS.stack = []
    return s


def _cast_inputs(op, inputs):
    """`inputs` cast per the innermost autocast's dtype and `op.amp` (the one policy)."""
    pol = op.amp
    top = _TLS.stack[-1] if getattr(_TLS, "stack", None) else None
    if pol == "follow" or top is None:   # top None: an enabled=False block
        return inputs
    from ..ops.elementwise import cast
    if pol == "lower":
        name = top.name
        want = top.dtype
        return tuple(_lowered(t, name) if ((d := t._data.dtype) == _F32
                                           or (d in _LOW and d != want)) else t
                     for t in inputs)
    # "float32"
    return tuple(cast(t, "float32") if t._data.dtype in _LOW else t for t in inputs)


# weight casts: "made" counts conversions of a parameter, "reused" the uses served by the
# parameter's cast of its current version (`_lowered`)
STATS = {"made": 0, "reused": 0}


def _lowered(t, name):
    """`cast(t, name)`, where a parameter (a leaf that requires grad, not a view) is
    converted once per version of its storage: the optimiser's step (and every in-place
    write) bumps the version, so a weight used many times in a step, or in many steps
    of an inference loop, is cast once, not per use. Each use still gets its own cast
    node on the tape (its gradient reaches the float32 weight). Tracing records a cast
    node per use (CSE merges them)."""
    from ..ops.elementwise import CAST, cast
    if t._node is not None or not t.requires_grad or t._base is not None \
            or STATE.tracer is not None:
        return cast(t, name)
    c = t.__dict__.get("_amp_cast")
    if c is None or c[0] != t._version or c[1] is not t._data or c[2] != name:
        y = cast(t, name)
        t._amp_cast = (t._version, t._data, name, y._data)
        STATS["made"] += 1
        return y
    STATS["reused"] += 1
    y = Tensor.__new__(Tensor)
    y._data = c[3]
    if STATE.grad_enabled:
        y._node = Node(CAST, (t,), {"dtype": name}, (y,))
        y.requires_grad = True
    return y


def _mode(op, inputs, attrs, call_next):
    """The dispatch mode: casts inputs per the innermost autocast's dtype and `op.amp`."""
    if op.amp == "follow":
        return call_next(op, inputs, attrs)
    return call_next(op, _cast_inputs(op, inputs), attrs)


# a frontend's operand that is an input of the op in PyTorch (a bias): the same casts
# (`sampan.ops.modes.as_inputs_of`)
_mode.cast_inputs = _cast_inputs


def _sync(st):
    """The mode is pushed while some block of this thread's stack is enabled: a lone
    ``autocast(enabled=False)`` leaves dispatch on its one-flag fast path."""
    want = any(p is not None for p in st)
    if want and not getattr(_TLS, "pushed", False):
        _modes.push_mode(_mode)
        _TLS.pushed = True
    elif not want and getattr(_TLS, "pushed", False):
        _modes.pop_mode(_mode)
        _TLS.pushed = False


class _Policy:
    __slots__ = ("dtype", "name")

    def __init__(self, dtype):
        self.dtype = dtype
        self.name = _dt.dtype_name(dtype)


class autocast:
    """Run ops in mixed precision inside a `with` block (or a decorated function).

    `dtype` is `sampan.bfloat16` (default) or `sampan.float16`; `enabled=False` turns an
    outer autocast off inside this block. Thread-local and nestable, as PyTorch's.
    Weights stay float32; each is cast once per version of its storage (once per
    optimiser step, see `_lowered`), not per use. Call `backward` outside the block.

    Example::

        >>> with sampan.amp.autocast(dtype=sampan.bfloat16):
        ...     loss = sampan.cross_entropy(model(x), y)
        >>> loss.backward()
    """

    def __init__(self, dtype=None, enabled: bool = True):
        d = _dt.bfloat16 if dtype is None else _as_low(dtype)
        self.dtype = d
        self.enabled = bool(enabled)
        self._depth = []

    def __enter__(self):
        st = _stack()
        st.append(_Policy(self.dtype) if self.enabled else None)
        self._depth.append(len(st))
        _sync(st)
        return self

    def __exit__(self, *exc):
        st = _stack()
        depth = self._depth.pop()
        del st[depth - 1:]
        _sync(st)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.dtype, self.enabled):
                return fn(*args, **kwargs)
        return wrapper

    def __repr__(self):
        return f"autocast(dtype={_dt.dtype_name(self.dtype)}, enabled={self.enabled})"


def _as_low(dtype):
    try:
        d = _dt.as_dtype(dtype)
    except Exception:  # noqa: BLE001 - any unknown spelling
        d = None
    if d not in _LOW:
        raise SampanValueError(f"sampan.amp.autocast: dtype {dtype!r}; expected "
                               "sampan.bfloat16 or sampan.float16")
    return d


def is_autocast_enabled() -> bool:
    """Whether ops on this thread run under an enabled autocast now."""
    st = getattr(_TLS, "stack", None)
    return bool(st) and st[-1] is not None


def get_autocast_dtype():
    """The innermost enabled autocast's dtype on this thread (None outside autocast)."""
    st = getattr(_TLS, "stack", None)
    return st[-1].dtype if st and st[-1] is not None else None


def policy(op_name: str) -> str:
    """The op table's autocast policy of `op_name` ("lower", "float32" or "follow")."""
    from ..ops.registry import get_op
    return get_op(op_name).amp
