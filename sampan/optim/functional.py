"""Pure update rules written with sampan ops: inputs in, new tensors out.

The eager optimisers do not call these (they update numpy storage in place, which is
faster); these exist so that `sampan.jit` can trace an optimiser step into a graph.
Each function returns new values for the parameter and its state and mutates nothing;
the tests check that each agrees with its eager optimiser. `step` counts from 1 (the
step being taken) and may be a Python int or a 0-d tensor (traced as an input); so may
`lr` (and SGD's `dampening`). Scalars derived from such tensors are computed in their
dtype (float64 for the optimisers' counters, as the eager Python floats are) and cast
to the parameter's dtype just before they meet it, as numpy does with Python floats.

Example::

    >>> import sampan.optim.functional as F
    >>> p2, m2, v2, _ = F.adam_update(p, g, m, v, 1, lr=1e-3, beta1=0.9, beta2=0.999,
    ...                               eps=1e-8)
"""
from __future__ import annotations

import math

from sampan.tensor import Tensor

__all__ = ["adagrad_update", "adam_update", "rmsprop_update", "sgd_update"]


def _sqrt(x):
    from ..ops.elementwise import sqrt
    return sqrt(x)


def _scalar_sqrt(x):
    return _sqrt(x) if isinstance(x, Tensor) else math.sqrt(x)


def _like(x, ref):
    """`x` (a Python number or a 0-d tensor) in the dtype of tensor `ref`."""
    if isinstance(x, Tensor) and x.dtype != ref.dtype:
        from ..ops.elementwise import cast
        return cast(x, ref.dtype)
    return x


def _decay(param, grad, weight_decay, maximize):
    g = -grad if maximize else grad
    if weight_decay:
        g = g + param * weight_decay
    return g


def sgd_update(param, grad, momentum_buffer=None, *, lr, momentum=0.0, dampening=0.0,
               weight_decay=0.0, nesterov=False, maximize=False):
    """One SGD step; returns ``(new_param, new_momentum_buffer)``.

    Pass ``momentum_buffer=None`` on the first step (the buffer starts as the gradient).
    The returned buffer is None when `momentum` is 0.

    Example::

        >>> p2, buf = sgd_update(p, g, None, lr=0.1, momentum=0.9)
    """
    g = _decay(param, grad, weight_decay, maximize)
    buf = None
    if momentum:
        if momentum_buffer is None:
            buf = g
        else:
            buf = momentum_buffer * momentum + g * _like(1.0 - dampening, g)
        g = g + buf * momentum if nesterov else buf
    return param - g * _like(lr, param), buf


def adam_update(param, grad, exp_avg, exp_avg_sq, step, *, lr=1e-3, beta1=0.9, beta2=0.999,
                eps=1e-8, weight_decay=0.0, amsgrad=False, max_exp_avg_sq=None,
                decoupled=False, maximize=False):
    """One Adam (or AdamW with ``decoupled=True``) step.

    Returns ``(new_param, new_exp_avg, new_exp_avg_sq, new_max_exp_avg_sq)``; the last
    is None unless `amsgrad` (then pass the running maximum in `max_exp_avg_sq`).

    Example::

        >>> p2, m2, v2, _ = adam_update(p, g, m, v, 1, lr=1e-3)
    """
    if decoupled:
        if weight_decay:
            param = param * _like(1.0 - lr * weight_decay, param)
        g = _decay(param, grad, 0.0, maximize)
    else:
        g = _decay(param, grad, weight_decay, maximize)
    m = exp_avg + (g - exp_avg) * (1.0 - beta1)
    v = exp_avg_sq * beta2 + (g * g) * (1.0 - beta2)
    vmax = None
    denom_src = v
    if amsgrad:
        from ..ops.elementwise import maximum
        vmax = v if max_exp_avg_sq is None else maximum(max_exp_avg_sq, v)
        denom_src = vmax
    step_size = _like(lr / (1.0 - beta1 ** step), param)
    bc2_sqrt = _like(_scalar_sqrt(1.0 - beta2 ** step), param)
    denom = _sqrt(denom_src) / bc2_sqrt + eps
    return param - (m / denom) * step_size, m, v, vmax


def adagrad_update(param, grad, state_sum, step, *, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                   eps=1e-10, maximize=False):
    """One Adagrad step; returns ``(new_param, new_sum)``.

    Example::

        >>> p2, s2 = adagrad_update(p, g, s, 1, lr=0.05)
    """
    g = _decay(param, grad, weight_decay, maximize)
    clr = _like(lr / (1.0 + (step - 1) * lr_decay), param)
    new_sum = state_sum + g * g
    return param - (g / (_sqrt(new_sum) + eps)) * clr, new_sum


def rmsprop_update(param, grad, square_avg, grad_avg=None, momentum_buffer=None, *, lr=1e-2,
                   alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                   maximize=False):
    """One RMSprop step; returns ``(new_param, square_avg, grad_avg, momentum_buffer)``.

    `grad_avg` is used (and returned) only when `centered`; `momentum_buffer` only when
    `momentum` > 0 (pass zeros on the first step, as the eager optimiser starts there).

    Example::

        >>> p2, sq, _, _ = rmsprop_update(p, g, sq, lr=1e-3)
    """
    g = _decay(param, grad, weight_decay, maximize)
    sq = square_avg * alpha + (g * g) * (1.0 - alpha)
    ga = None
    if centered:
        ga = grad_avg + (g - grad_avg) * (1.0 - alpha)
        avg = _sqrt(sq - ga * ga) + eps
    else:
        avg = _sqrt(sq) + eps
    buf = None
    lr = _like(lr, param)
    if momentum > 0:
        buf = momentum_buffer * momentum + g / avg
        return param - buf * lr, sq, ga, buf
    return param - (g / avg) * lr, sq, ga, buf
