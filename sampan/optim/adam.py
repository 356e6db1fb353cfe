"""Adam and AdamW (decoupled weight decay), optionally with AMSGrad."""
from __future__ import annotations

import math

import numpy as np

from sampan.autograd.tape import bump_version
from sampan.errors import SampanValueError

from . import _fused
from . import functional as F
from .optimizer import Optimizer, grads_of

__all__ = ["Adam", "AdamW"]

_mul = np.multiply
_add = np.add
_sub = np.subtract


class Adam(Optimizer):
    """Adam (Kingma & Ba), the update rule of PyTorch's `torch.optim.Adam`.

    ``m = b1*m + (1-b1)*g``, ``v = b2*v + (1-b2)*g*g``, then
    ``p -= lr/(1-b1**t) * m / (sqrt(v)/sqrt(1-b2**t) + eps)``; with `amsgrad` the running
    maximum of ``v`` replaces ``v`` in the denominator. `weight_decay` adds ``wd*p`` to
    the gradient (L2); use `AdamW` for decoupled decay.

    Example::

        >>> opt = sampan.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, maximize=False):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay, "amsgrad": amsgrad,
                                  "maximize": maximize})

    def _check_group(self, g):
        name = type(self).__name__
        if g["lr"] < 0:
            raise SampanValueError(f"{name}: invalid learning rate {g['lr']} (expected >= 0)")
        b1, b2 = g["betas"]
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise SampanValueError(f"{name}: invalid betas {g['betas']} (each in [0, 1))")
        if g["eps"] < 0:
            raise SampanValueError(f"{name}: invalid eps {g['eps']} (expected >= 0)")
        if g["weight_decay"] < 0:
            raise SampanValueError(f"{name}: invalid weight_decay {g['weight_decay']}")

    def _init_state(self, shape, dtype, group):
        s = {"step": 0, "exp_avg": np.zeros(shape, dtype), "exp_avg_sq": np.zeros(shape, dtype)}
        if group["amsgrad"]:
            s["max_exp_avg_sq"] = np.zeros(shape, dtype)
        return s

    def _traced_update(self, p, grad, st, group, lr):
        step = st["step"].add_(1)
        b1, b2 = group["betas"]
        vmax = st.get("max_exp_avg_sq") if group["amsgrad"] else None
        new, m, v, vm = F.adam_update(
            p, grad, st["exp_avg"], st["exp_avg_sq"], step, lr=lr, beta1=b1, beta2=b2,
            eps=group["eps"], weight_decay=group["weight_decay"], amsgrad=group["amsgrad"],
            max_exp_avg_sq=vmax, decoupled=self._decoupled, maximize=group["maximize"])
        st["exp_avg"].copy_(m)
        st["exp_avg_sq"].copy_(v)
        if vm is not None:
            vmax.copy_(vm)
        p.copy_(new)

    def _update_group(self, group):
        lr = group["lr"]
        b1, b2 = group["betas"]
        eps = group["eps"]
        wd = group["weight_decay"]
        amsgrad = group["amsgrad"]
        maximize = group["maximize"]
        decoupled = self._decoupled
        one_b1 = 1.0 - b1
        one_b2 = 1.0 - b2
        state = self.state
        buffer = self._buffer
        # decoupled (AdamW) decay scales the weights instead of adding to the gradient
        for p, w, g in grads_of(self, group, 0.0 if decoupled else wd, maximize):
            s = state.get(p)
            if s is None:
                s = {"step": 0, "exp_avg": np.zeros_like(w), "exp_avg_sq": np.zeros_like(w)}
                if amsgrad:
                    s["max_exp_avg_sq"] = np.zeros_like(w)
                state[p] = s
            step = s["step"] = s["step"] + 1
            m = s["exp_avg"]
            v = s["exp_avg_sq"]
            if not amsgrad and _fused.usable(w, g, m, v):   # one pass, same rounding
                _fused.adam(w, g, m, v, 1.0 - lr * wd if decoupled else 1.0, one_b1, b2,
                            one_b2, math.sqrt(1.0 - b2 ** step), eps,
                            lr / (1.0 - b1 ** step))
                bump_version(p)
                continue
            if decoupled and wd:
                _mul(w, 1.0 - lr * wd, out=w)
            t = buffer(w, 1)
            # m <- m + (1-b1)*(g - m)   (torch's lerp, same rounding)
            _sub(g, m, out=t)
            _mul(t, one_b1, out=t)
            _add(m, t, out=m)
            # v <- b2*v + (1-b2)*g*g
            _mul(v, b2, out=v)
            _mul(g, g, out=t)
            _mul(t, one_b2, out=t)
            _add(v, t, out=v)
            if amsgrad:
                vmax = s["max_exp_avg_sq"]
                np.maximum(vmax, v, out=vmax)
                v = vmax
            step_size = lr / (1.0 - b1 ** step)
            bc2_sqrt = math.sqrt(1.0 - b2 ** step)
            # p <- p - step_size * m / (sqrt(v)/sqrt(bc2) + eps)
            np.sqrt(v, out=t)
            np.divide(t, bc2_sqrt, out=t)
            _add(t, eps, out=t)
            np.divide(m, t, out=t)
            _mul(t, step_size, out=t)
            _sub(w, t, out=w)
            bump_version(p)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as `torch.optim.AdamW`.

    Each step first shrinks the parameter, ``p *= 1 - lr*weight_decay``, then applies
    the plain Adam update; the decay never enters the moment estimates.

    Example::

        >>> opt = sampan.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    """

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, maximize=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize)
