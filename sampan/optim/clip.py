"""Gradient clipping: by global norm and by value, in place on `.grad`."""
from __future__ import annotations

import math

import numpy as np

from sampan.errors import SampanValueError
from sampan.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _with_grads(parameters):
    """The parameters (a tensor or an iterable, read once) that have a gradient, and
    whether any gradient is a traced value (inside sampan.jit): the clipping is then
    written with ops, which the tracer records."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    ps = [p for p in parameters if p.grad is not None]
    return ps, any(not isinstance(p.grad._data, np.ndarray) for p in ps)


def _traced_norm_clip(ps, max_norm, norm_type, error_if_nonfinite):
    from sampan.autograd import no_grad
    from sampan.ops.elementwise import abs as _abs, add, div, minimum, mul, sqrt
    from sampan.ops.reduce import amax, sum as _sum
    from sampan.ops.shape import stack
    if error_if_nonfinite:
        raise SampanValueError("clip_grad_norm_(error_if_nonfinite=True) needs the norm's "
                               "value, which a traced step does not have; check the returned "
                               "norm after the call instead")
    with no_grad():
        gs = [p.grad for p in ps]
        if math.isinf(norm_type):
            total = amax(stack([amax(_abs(g)) for g in gs]))
        elif norm_type == 2.0:
            total = sqrt(_sum(stack([_sum(mul(g, g)) for g in gs])))
        else:
            parts = [_sum(_abs(g) ** norm_type) for g in gs]
            total = _sum(stack(parts)) ** (1.0 / norm_type)
        # min(1, max_norm / (norm + 1e-6)) on every gradient: a factor of exactly 1 leaves
        # them bit-identical, as the eager path's "no scaling when below max_norm"
        coef = minimum(div(max_norm, add(total, 1e-6)), 1.0)
        for p in ps:
            p.grad = mul(p.grad, coef)
    return total


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scale all gradients together so that their joint norm is at most `max_norm`.

    The norm is taken over every gradient as if concatenated into one vector; each
    gradient is multiplied by ``min(1, max_norm / (norm + 1e-6))`` (PyTorch's rule).
    Returns the norm before clipping as a 0-d tensor.

    Example::

        >>> loss.backward()
        >>> total = sampan.optim.clip_grad_norm_(model.parameters(), max_norm=1.0)
    """
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    ps, traced = _with_grads(parameters)
    if traced:
        return _traced_norm_clip(ps, max_norm, norm_type, error_if_nonfinite)
    grads = [p.grad._data for p in ps]
    if not grads:
        return Tensor(np.zeros((), dtype=np.float32))
    dtype = np.result_type(*[g.dtype for g in grads])
    if math.isinf(norm_type):
        norms = [np.max(np.abs(g)) if g.size else g.dtype.type(0) for g in grads]
        total = np.max(np.asarray(norms, dtype=dtype))
    elif norm_type == 2.0:
        total = math.sqrt(sum(float(np.vdot(g.ravel(), g.ravel())) for g in grads))
    else:
        parts = [np.sum(np.abs(g).astype(dtype, copy=False) ** norm_type) for g in grads]
        total = float(np.sum(np.asarray(parts, dtype=dtype))) ** (1.0 / norm_type)
    total = dtype.type(total)
    if error_if_nonfinite and not np.isfinite(total):
        raise SampanValueError(f"clip_grad_norm_: the total gradient norm (order {norm_type}) "
                               "is non-finite; pass error_if_nonfinite=False to clip anyway")
    coef = min(max_norm / (float(total) + 1e-6), 1.0)
    if coef < 1.0:
        for g in grads:
            np.multiply(g, g.dtype.type(coef), out=g)
    return Tensor(np.asarray(total))


def clip_grad_value_(parameters, clip_value):
    """Clamp every gradient element into ``[-clip_value, clip_value]`` in place.

    Example::

        >>> loss.backward(); sampan.optim.clip_grad_value_(model.parameters(), 0.5)
    """
    c = float(clip_value)
    if c < 0:
        raise SampanValueError(f"clip_grad_value_: clip_value {c} must be >= 0")
    ps, traced = _with_grads(parameters)
    if traced:
        from sampan.autograd import no_grad
        from sampan.ops.elementwise import clamp
        with no_grad():
            for p in ps:
                p.grad = clamp(p.grad, -c, c)
        return
    for p in ps:
        np.clip(p.grad._data, -c, c, out=p.grad._data)
