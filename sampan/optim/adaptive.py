"""Adagrad and RMSprop: per-coordinate step sizes from accumulated squared gradients."""
from __future__ import annotations

import numpy as np

from sampan.autograd.tape import bump_version
from sampan.errors import SampanValueError

from . import _fused
from . import functional as F
from .optimizer import Optimizer, grads_of

__all__ = ["Adagrad", "RMSprop"]

_mul = np.multiply
_add = np.add
_sub = np.subtract
_div = np.divide


def _check_common(name, g):
    if g["lr"] < 0:
        raise SampanValueError(f"{name}: invalid learning rate {g['lr']} (expected >= 0)")
    if g["eps"] < 0:
        raise SampanValueError(f"{name}: invalid eps {g['eps']} (expected >= 0)")
    if g["weight_decay"] < 0:
        raise SampanValueError(f"{name}: invalid weight_decay {g['weight_decay']}")


class Adagrad(Optimizer):
    """Adagrad, the update rule of PyTorch's `torch.optim.Adagrad`.

    ``sum += g*g``, then ``p -= clr * g / (sqrt(sum) + eps)`` with the decayed rate
    ``clr = lr / (1 + (t-1)*lr_decay)``; `sum` starts at `initial_accumulator_value`.

    Example::

        >>> opt = sampan.optim.Adagrad(model.parameters(), lr=0.05)
    """

    _sparse_grads = True  # zero rows of a sparse grad change nothing (torch allows it)

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, maximize=False):
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value,
                                  "eps": eps, "maximize": maximize})

    def _check_group(self, g):
        _check_common("Adagrad", g)
        if g["lr_decay"] < 0:
            raise SampanValueError(f"Adagrad: invalid lr_decay {g['lr_decay']}")
        if g["initial_accumulator_value"] < 0:
            raise SampanValueError("Adagrad: invalid initial_accumulator_value "
                                   f"{g['initial_accumulator_value']}")

    def _init_state(self, shape, dtype, group):
        return {"step": 0, "sum": np.full(shape, group["initial_accumulator_value"], dtype)}

    def _traced_update(self, p, grad, st, group, lr):
        step = st["step"].add_(1)
        lr_decay = group["lr_decay"]
        new, acc = F.adagrad_update(p, grad, st["sum"], step if lr_decay else 1, lr=lr,
                                    lr_decay=lr_decay, weight_decay=group["weight_decay"],
                                    eps=group["eps"], maximize=group["maximize"])
        st["sum"].copy_(acc)
        p.copy_(new)

    def _update_group(self, group):
        lr = group["lr"]
        lr_decay = group["lr_decay"]
        wd = group["weight_decay"]
        eps = group["eps"]
        maximize = group["maximize"]
        init = group["initial_accumulator_value"]
        state = self.state
        for p, w, g in grads_of(self, group, wd, maximize):
            s = state.get(p)
            if s is None:
                s = state[p] = {"step": 0, "sum": np.full_like(w, init)}
            step = s["step"] = s["step"] + 1
            acc = s["sum"]
            clr = lr / (1.0 + (step - 1) * lr_decay)
            if _fused.usable(w, g, acc):   # one pass, same rounding
                _fused.adagrad(w, g, acc, eps, clr)
                bump_version(p)
                continue
            t = self._buffer(w, 1)
            _mul(g, g, out=t)
            _add(acc, t, out=acc)
            np.sqrt(acc, out=t)
            _add(t, eps, out=t)
            _div(g, t, out=t)
            _mul(t, clr, out=t)
            _sub(w, t, out=w)
            bump_version(p)


class RMSprop(Optimizer):
    """RMSprop, the update rule of PyTorch's `torch.optim.RMSprop`.

    ``sq = alpha*sq + (1-alpha)*g*g``; ``avg = sqrt(sq - ga*ga) + eps`` when `centered`
    (``ga`` the running mean gradient) else ``sqrt(sq) + eps``; then with momentum
    ``b = momentum*b + g/avg; p -= lr*b``, without it ``p -= lr*g/avg``.

    Example::

        >>> opt = sampan.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.9)
    """

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False, maximize=False):
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps,
                                  "weight_decay": weight_decay, "momentum": momentum,
                                  "centered": centered, "maximize": maximize})

    def _check_group(self, g):
        _check_common("RMSprop", g)
        if not 0.0 <= g["alpha"] <= 1.0:
            raise SampanValueError(f"RMSprop: invalid alpha {g['alpha']} (expected in [0, 1])")
        if g["momentum"] < 0:
            raise SampanValueError(f"RMSprop: invalid momentum {g['momentum']}")

    def _init_state(self, shape, dtype, group):
        s = {"step": 0, "square_avg": np.zeros(shape, dtype)}
        if group["momentum"] > 0:
            s["momentum_buffer"] = np.zeros(shape, dtype)
        if group["centered"]:
            s["grad_avg"] = np.zeros(shape, dtype)
        return s

    def _traced_update(self, p, grad, st, group, lr):
        st["step"].add_(1)
        ga, buf = st.get("grad_avg"), st.get("momentum_buffer")
        new, sq, ga2, buf2 = F.rmsprop_update(
            p, grad, st["square_avg"], ga, buf, lr=lr, alpha=group["alpha"], eps=group["eps"],
            weight_decay=group["weight_decay"], momentum=group["momentum"],
            centered=group["centered"], maximize=group["maximize"])
        st["square_avg"].copy_(sq)
        if ga2 is not None:
            ga.copy_(ga2)
        if buf2 is not None:
            buf.copy_(buf2)
        p.copy_(new)

    def _update_group(self, group):
        lr = group["lr"]
        alpha = group["alpha"]
        one_alpha = 1.0 - alpha
        eps = group["eps"]
        wd = group["weight_decay"]
        momentum = group["momentum"]
        centered = group["centered"]
        maximize = group["maximize"]
        state = self.state
        for p, w, g in grads_of(self, group, wd, maximize):
            s = state.get(p)
            if s is None:
                s = state[p] = {"step": 0, "square_avg": np.zeros_like(w)}
                if momentum > 0:
                    s["momentum_buffer"] = np.zeros_like(w)
                if centered:
                    s["grad_avg"] = np.zeros_like(w)
            s["step"] += 1
            sq = s["square_avg"]
            t = self._buffer(w, 1)
            _mul(sq, alpha, out=sq)
            _mul(g, g, out=t)
            _mul(t, one_alpha, out=t)
            _add(sq, t, out=sq)
            if centered:
                ga = s["grad_avg"]
                _sub(g, ga, out=t)  # ga <- ga + (1-alpha)*(g - ga), torch's lerp
                _mul(t, one_alpha, out=t)
                _add(ga, t, out=ga)
                _mul(ga, ga, out=t)
                _sub(sq, t, out=t)
                np.sqrt(t, out=t)
            else:
                np.sqrt(sq, out=t)
            _add(t, eps, out=t)
            _div(g, t, out=t)
            if momentum > 0:
                buf = s["momentum_buffer"]
                _mul(buf, momentum, out=buf)
                _add(buf, t, out=buf)
                _mul(buf, lr, out=t)
            else:
                _mul(t, lr, out=t)
            _sub(w, t, out=w)
            bump_version(p)
