"""NAdam, RAdam and Adamax: Adam's moment estimates with other step rules.

Each follows the update of the PyTorch optimiser of the same name (`torch.optim`),
keeps the same state slots (so checkpoints read the same way) and updates the
parameter's numpy storage in place.
"""
from __future__ import annotations

import math

import numpy as np

from sampan.autograd.tape import bump_version

from ._eager import EagerOnly, check_range
from .optimizer import Optimizer, grads_of

__all__ = ["Adamax", "NAdam", "RAdam"]


def _check_adam_like(name, g):
    check_range(name, "learning rate", g["lr"])
    check_range(name, "eps", g["eps"])
    check_range(name, "weight_decay", g["weight_decay"])
    b1, b2 = g["betas"]
    check_range(name, "beta1", b1, 0.0, 1.0, hi_open=True)
    check_range(name, "beta2", b2, 0.0, 1.0, hi_open=True)


def _moments(m, v, g, b1, b2):
    """``m += (1-b1)*(g-m)`` (torch's lerp) and ``v = b2*v + (1-b2)*g*g``, in place."""
    m += (1.0 - b1) * (g - m)
    v *= b2
    v += (1.0 - b2) * (g * g)


class NAdam(EagerOnly, Optimizer):
    """Adam with Nesterov momentum (Dozat), as `torch.optim.NAdam`.

    The momentum coefficient warms up, ``mu_t = b1 * (1 - 0.5 * 0.96 ** (t *
    momentum_decay))``; the step mixes the current gradient and the first moment with
    the products of those coefficients. `decoupled_weight_decay=True` shrinks the
    weights (as AdamW) instead of adding ``wd*p`` to the gradient.

    Example::

        >>> opt = sampan.optim.NAdam(model.parameters(), lr=2e-3, momentum_decay=4e-3)
    """

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 momentum_decay=4e-3, decoupled_weight_decay=False, maximize=False):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay,
                                  "momentum_decay": momentum_decay,
                                  "decoupled_weight_decay": decoupled_weight_decay,
                                  "maximize": maximize})

    def _check_group(self, g):
        _check_adam_like("NAdam", g)
        check_range("NAdam", "momentum_decay", g["momentum_decay"])

    def _init_state(self, shape, dtype, group):
        return {"step": 0, "mu_product": 1.0, "exp_avg": np.zeros(shape, dtype),
                "exp_avg_sq": np.zeros(shape, dtype)}

    def _update_group(self, group):
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        b1, b2 = group["betas"]
        decay = group["momentum_decay"]
        decoupled = group["decoupled_weight_decay"]
        for p, w, g in grads_of(self, group, 0.0 if decoupled else wd, group["maximize"]):
            s = self.state.get(p)
            if s is None:
                s = self.state[p] = self._init_state(w.shape, w.dtype, group)
            t = s["step"] = s["step"] + 1
            if decoupled and wd:
                w *= 1.0 - lr * wd
            mu = b1 * (1.0 - 0.5 * 0.96 ** (t * decay))
            mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * decay))
            # torch keeps the running product in a float32 scalar tensor: round as it does
            prod = float(np.float32(s["mu_product"]) * np.float32(mu))
            s["mu_product"] = prod
            m, v = s["exp_avg"], s["exp_avg_sq"]
            _moments(m, v, g, b1, b2)
            denom = np.sqrt(v / (1.0 - b2 ** t)) + eps
            w += (-lr * (1.0 - mu) / (1.0 - prod)) * g / denom
            w += (-lr * mu_next / (1.0 - prod * mu_next)) * m / denom
            bump_version(p)


class RAdam(EagerOnly, Optimizer):
    """Rectified Adam (Liu et al.), as `torch.optim.RAdam`.

    While the variance of the adaptive rate is not yet tractable (``rho_t <= 5``) the
    step is plain bias-corrected momentum; afterwards Adam's step times the
    rectification term. `decoupled_weight_decay=True` shrinks the weights (AdamW-style).

    Example::

        >>> opt = sampan.optim.RAdam(model.parameters(), lr=1e-3)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled_weight_decay=False, maximize=False):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay,
                                  "decoupled_weight_decay": decoupled_weight_decay,
                                  "maximize": maximize})

    def _check_group(self, g):
        _check_adam_like("RAdam", g)

    def _init_state(self, shape, dtype, group):
        return {"step": 0, "exp_avg": np.zeros(shape, dtype),
                "exp_avg_sq": np.zeros(shape, dtype)}

    def _update_group(self, group):
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        b1, b2 = group["betas"]
        decoupled = group["decoupled_weight_decay"]
        rho_inf = 2.0 / (1.0 - b2) - 1.0
        for p, w, g in grads_of(self, group, 0.0 if decoupled else wd, group["maximize"]):
            s = self.state.get(p)
            if s is None:
                s = self.state[p] = self._init_state(w.shape, w.dtype, group)
            t = s["step"] = s["step"] + 1
            if decoupled and wd:
                w *= 1.0 - lr * wd
            m, v = s["exp_avg"], s["exp_avg_sq"]
            _moments(m, v, g, b1, b2)
            bc1 = 1.0 - b1 ** t
            bc2 = 1.0 - b2 ** t
            m_hat = m / bc1
            rho_t = rho_inf - 2.0 * t * (b2 ** t) / bc2
            if rho_t > 5.0:
                rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf
                                 / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                adaptive = math.sqrt(bc2) / (np.sqrt(v) + eps)
                w -= m_hat * lr * adaptive * rect
            else:
                w -= m_hat * lr
            bump_version(p)


class Adamax(EagerOnly, Optimizer):
    """Adam with the infinity norm (Kingma & Ba, sec. 7), as `torch.optim.Adamax`.

    ``u = max(b2*u, |g| + eps)``, then ``p -= lr/(1-b1**t) * m / u``.

    Example::

        >>> opt = sampan.optim.Adamax(model.parameters(), lr=2e-3)
    """

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 maximize=False):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay, "maximize": maximize})

    def _check_group(self, g):
        _check_adam_like("Adamax", g)

    def _init_state(self, shape, dtype, group):
        return {"step": 0, "exp_avg": np.zeros(shape, dtype), "exp_inf": np.zeros(shape, dtype)}

    def _update_group(self, group):
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        b1, b2 = group["betas"]
        for p, w, g in grads_of(self, group, wd, group["maximize"]):
            s = self.state.get(p)
            if s is None:
                s = self.state[p] = self._init_state(w.shape, w.dtype, group)
            t = s["step"] = s["step"] + 1
            m, u = s["exp_avg"], s["exp_inf"]
            m += (1.0 - b1) * (g - m)
            u *= b2
            np.maximum(u, np.abs(g) + eps, out=u)
            w -= (lr / (1.0 - b1 ** t)) * (m / u)
            bump_version(p)
