"""Tensor factories. `full`, `arange` and the random ops are nullary ops in the table,
so a traced program creates its constants and noise inside the graph."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import SampanValueError, op_error
from ..ir.symint import as_float, as_int, deciding, is_symbolic
from ..tensor import Tensor, apply, wrap
from ._util import Sample
from .registry import NOT_DIFFERENTIABLE, Spec, defop


def _shape(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(as_int(d) if not isinstance(d, str) else d for d in shape)


def _full_kernel(shape, value, dtype):
    return np.full(shape, value, dtype=np.dtype(dtype))  # a canonical name (the frontends')


FULL = defop("full", lambda shape, value, dtype: Spec(tuple(shape), _dt.as_dtype(dtype)),
             kernel=_full_kernel, grad=NOT_DIFFERENTIABLE, kind="elementwise", scalar="value",
             onnx="ConstantOfShape", flops=lambda *a, **k: 0,
             samples=lambda: [Sample((), {"shape": (2, 3), "value": 1.5, "dtype": "float32"}),
                              Sample((), {"shape": (0,), "value": 0, "dtype": "int64"})])


def _finish(t, requires_grad):
    if requires_grad:
        t.requires_grad_(True)
    return t


def full(shape, fill_value, dtype=None, requires_grad=False, device=None):
    """A tensor filled with `fill_value`: ``sampan.full((2, 3), 7.0)``."""
    if device is not None:
        from ..device import as_device
        as_device(device)
    shape = _shape((shape,) if isinstance(shape, int) else (shape,))
    if dtype is None:
        dtype = (_dt.bool_ if isinstance(fill_value, bool) else _dt.int64
                 if isinstance(fill_value, int) else _dt.get_default_dtype())
    d = _dt.as_dtype(dtype)
    v = bool(fill_value) if d == _dt.bool_ else (
        as_int(fill_value) if _dt.is_integer(d) else as_float(fill_value))
    t = apply(FULL, (), {"shape": shape, "value": v, "dtype": _dt.dtype_name(d)})
    return _finish(t, requires_grad)


def zeros(*shape, dtype=None, requires_grad=False, device=None):
    """All zeros: ``sampan.zeros(2, 3)``."""
    return full(_shape(shape), fill_value=0.0 if dtype is None else 0, dtype=dtype or
                _dt.get_default_dtype(), requires_grad=requires_grad, device=device)


def ones(*shape, dtype=None, requires_grad=False, device=None):
    """All ones: ``sampan.ones(2, 3)``."""
    return full(_shape(shape), fill_value=1, dtype=dtype or _dt.get_default_dtype(),
                requires_grad=requires_grad, device=device)


def zeros_like(t, dtype=None, requires_grad=False):
    return zeros(tuple(t.shape), dtype=dtype or t.dtype, requires_grad=requires_grad)


def ones_like(t, dtype=None, requires_grad=False):
    return ones(tuple(t.shape), dtype=dtype or t.dtype, requires_grad=requires_grad)


def full_like(t, fill_value, dtype=None, requires_grad=False):
    return full(tuple(t.shape), fill_value=fill_value, dtype=dtype or t.dtype,
                requires_grad=requires_grad)


def empty(*shape, dtype=None, requires_grad=False):
    """Uninitialised in PyTorch; zeros here (numpy allocation is as cheap)."""
    return zeros(*shape, dtype=dtype, requires_grad=requires_grad)


def _arange_len(start, stop, step):
    if all(isinstance(v, int) for v in (start, stop, step)):
        # in ints (a symbolic size stays symbolic: arange(x.shape[1]) is seq long)
        n = (stop - start + step - 1) // step if step > 0 else (start - stop - step - 1) // -step
        return n if n > 0 else 0
    return max(0, int(np.ceil((float(stop) - float(start)) / float(step))))


def _arange_rule(start, stop, step, dtype):
    return Spec((_arange_len(start, stop, step),), _dt.as_dtype(dtype))


ARANGE = defop("arange", _arange_rule,
               kernel=lambda start, stop, step, dtype: np.arange(start, stop, step,
                                                                 dtype=_dt.as_dtype(dtype)),
               grad=NOT_DIFFERENTIABLE, onnx="Range", flops=lambda *a, **k: 0,
               samples=lambda: [Sample((), {"start": 0, "stop": 5, "step": 1,
                                            "dtype": "int64"}),
                                Sample((), {"start": 0.5, "stop": 2.0, "step": 0.25,
                                            "dtype": "float32"})])


def arange(start, stop=None, step=1, dtype=None, requires_grad=False):
    """Evenly spaced values in [start, stop): ``sampan.arange(5)``."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise op_error(SampanValueError, "arange", "step 0", "a non-zero step")
    if dtype is None:
        dtype = _dt.int64 if all(isinstance(v, int) for v in (start, stop, step)) \
            else _dt.get_default_dtype()
    if is_symbolic((start, stop, step)):
        with deciding():                 # while jit traces: its comparisons are guards
            _arange_len(start, stop, step)
    t = apply(ARANGE, (), {"start": start, "stop": stop, "step": step,
                           "dtype": _dt.dtype_name(_dt.as_dtype(dtype))})
    return _finish(t, requires_grad)


def linspace(start, stop, steps, dtype=None, requires_grad=False):
    """`steps` evenly spaced values from start to stop inclusive."""
    d = _dt.as_dtype(dtype)
    return _finish(wrap(np.linspace(start, stop, steps).astype(d)), requires_grad)


def eye(n, m=None, dtype=None, requires_grad=False):
    """Identity matrix."""
    return _finish(wrap(np.eye(n, m, dtype=_dt.as_dtype(dtype))), requires_grad)


def tensor(data, dtype=None, requires_grad=False, device=None):
    """Create a tensor from data (copies). Example: ``sampan.tensor([[1., 2.], [3., 4.]])``."""
    if device is not None:
        from ..device import as_device
        as_device(device)
    if isinstance(data, Tensor):
        data = data._data.copy()
    elif isinstance(data, np.ndarray):
        data = data.copy()
    elif isinstance(data, (list, tuple)) and data and any(isinstance(x, Tensor) for x in
                                                          _flat(data)):
        data = _nested_numpy(data)
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def _flat(seq):
    for x in seq:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


def _nested_numpy(x):
    if isinstance(x, Tensor):
        return x._data
    if isinstance(x, (list, tuple)):
        return np.stack([np.asarray(_nested_numpy(v)) for v in x])
    return x


def from_numpy(a: np.ndarray) -> Tensor:
    """Wrap a numpy array without copying."""
    return Tensor(a, dtype=a.dtype)
