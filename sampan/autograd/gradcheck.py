"""Numerical gradient checking in float64 (central finite differences)."""
from __future__ import annotations

import numpy as np

from ..errors import AutogradError


def _numerical_jacobian_vjp(fn, inputs, idx, v, eps):
    """d<v, fn(inputs)>/d inputs[idx] by central differences."""
    x = inputs[idx]
    base = x._data
    g = np.zeros(base.shape, np.float64)
    flat = base.reshape(-1)
    gf = g.reshape(-1)
    # grad recording stays on: gradgradcheck differentiates inside `fn`
    for k in range(flat.size):
        orig = flat[k]
        flat[k] = orig + eps
        fp = _dot(fn(*inputs), v)
        flat[k] = orig - eps
        fm = _dot(fn(*inputs), v)
        flat[k] = orig
        gf[k] = (fp - fm) / (2 * eps)
    return g


def _outs(y):
    return list(y) if isinstance(y, (tuple, list)) else [y]


def _dot(y, v):
    return sum(float(np.sum(o._data.astype(np.float64) * w)) for o, w in zip(_outs(y), v)
               if w is not None)


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, raise_exception=True, seed=0):
    """Compare autograd's vector-Jacobian product with finite differences (float64).

    Example::

        >>> x = sampan.randn(3, dtype="float64", requires_grad=True)
        >>> sampan.autograd.gradcheck(sampan.tanh, [x])
        True
    """
    from ..autograd.engine import grad
    from ..tensor import Tensor, wrap
    rng = np.random.default_rng(seed)
    inputs = [x if isinstance(x, Tensor) else Tensor(x) for x in inputs]
    diff = [i for i, x in enumerate(inputs) if x.requires_grad]
    if not diff:
        raise AutogradError("gradcheck: no input requires grad")
    for i in diff:
        if inputs[i].dtype != np.float64:
            raise AutogradError("gradcheck: inputs that require grad must be float64")
    y = _outs(fn(*inputs))
    vs = [rng.standard_normal(o.shape) if o.requires_grad else None for o in y]
    ys = [o for o, v in zip(y, vs) if v is not None]
    gos = [wrap(v.astype(o.dtype)) for o, v in zip(y, vs) if v is not None]
    analytic = grad(ys, [inputs[i] for i in diff], gos, allow_unused=True)
    for i, a in zip(diff, analytic):
        num = _numerical_jacobian_vjp(fn, inputs, i, vs, eps)
        a = np.zeros_like(num) if a is None else a._data.astype(np.float64)
        if not np.allclose(a, num, atol=atol, rtol=rtol):
            if raise_exception:
                err = np.max(np.abs(a - num))
                raise AutogradError(
                    f"gradcheck: input {i} analytic and numerical gradients differ "
                    f"(max abs diff {err:.3g})\nanalytic={a}\nnumerical={num}")
            return False
    return True


def gradgradcheck(fn, inputs, eps=1e-6, atol=1e-4, rtol=1e-3, seed=1):
    """gradcheck of the first derivative (checks second-order gradients)."""
    from ..autograd.engine import grad
    from ..tensor import Tensor, wrap
    rng = np.random.default_rng(seed)
    inputs = [x if isinstance(x, Tensor) else Tensor(x) for x in inputs]
    diff = [x for x in inputs if x.requires_grad]
    y0 = _outs(fn(*inputs))
    vs = [wrap(rng.standard_normal(o.shape)) for o in y0 if o.requires_grad]

    def first(*xs):
        ys = [o for o in _outs(fn(*xs)) if o.requires_grad]
        ins = [x for x in xs if x.requires_grad]
        gs = grad(ys, ins, vs, create_graph=True, allow_unused=True)
        return tuple(g for g in gs if g is not None and g.requires_grad)

    return gradcheck(first, inputs, eps=eps, atol=atol, rtol=rtol, seed=seed) if diff else True
