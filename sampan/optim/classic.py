"""Adadelta, ASGD and Rprop, as the PyTorch optimisers of the same names.

Same update rules and state slots as `torch.optim`; the parameter's numpy storage is
updated in place.
"""
from __future__ import annotations

import numpy as np

from sampan.autograd.tape import bump_version
from sampan.errors import SampanValueError

from ._eager import EagerOnly, check_range
from .optimizer import Optimizer, grads_of

__all__ = ["ASGD", "Adadelta", "Rprop"]


def _f32(x: float) -> float:
    """`x` rounded as torch's float32 scalar state tensors round it."""
    return float(np.float32(x))


class Adadelta(EagerOnly, Optimizer):
    """Adadelta (Zeiler), as `torch.optim.Adadelta`.

    ``sq = rho*sq + (1-rho)*g*g``; ``d = sqrt(acc + eps) / sqrt(sq + eps) * g``;
    ``acc = rho*acc + (1-rho)*d*d``; ``p -= lr*d``.

    Example::

        >>> opt = sampan.optim.Adadelta(model.parameters(), lr=1.0, rho=0.9)
    """

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False):
        super().__init__(params, {"lr": lr, "rho": rho, "eps": eps,
                                  "weight_decay": weight_decay, "maximize": maximize})

    def _check_group(self, g):
        check_range("Adadelta", "learning rate", g["lr"])
        check_range("Adadelta", "rho", g["rho"], 0.0, 1.0)
        check_range("Adadelta", "eps", g["eps"])
        check_range("Adadelta", "weight_decay", g["weight_decay"])

    def _init_state(self, shape, dtype, group):
        return {"step": 0, "square_avg": np.zeros(shape, dtype),
                "acc_delta": np.zeros(shape, dtype)}

    def _update_group(self, group):
        lr, rho, eps = group["lr"], group["rho"], group["eps"]
        for p, w, g in grads_of(self, group, group["weight_decay"], group["maximize"]):
            s = self.state.get(p)
            if s is None:
                s = self.state[p] = self._init_state(w.shape, w.dtype, group)
            s["step"] += 1
            sq, acc = s["square_avg"], s["acc_delta"]
            sq *= rho
            sq += (1.0 - rho) * (g * g)
            delta = np.sqrt(acc + eps) / np.sqrt(sq + eps) * g
            acc *= rho
            acc += (1.0 - rho) * (delta * delta)
            w -= lr * delta
            bump_version(p)


class ASGD(EagerOnly, Optimizer):
    """Averaged SGD (Polyak & Juditsky), as `torch.optim.ASGD`.

    ``p = p*(1 - lambd*eta) - eta*g``; the average ``ax`` starts tracking ``p`` after
    `t0` steps; the rate decays as ``eta = lr / (1 + lambd*lr*t) ** alpha``. The
    averaged parameters are in ``opt.state[p]["ax"]``.

    Example::

        >>> opt = sampan.optim.ASGD(model.parameters(), lr=0.01, t0=1000)
    """

    def __init__(self, params, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0,
                 maximize=False):
        super().__init__(params, {"lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0,
                                  "weight_decay": weight_decay, "maximize": maximize})

    def _check_group(self, g):
        check_range("ASGD", "learning rate", g["lr"])
        check_range("ASGD", "weight_decay", g["weight_decay"])

    def _init_state(self, shape, dtype, group):
        return {"step": 0, "eta": _f32(group["lr"]), "mu": 1.0, "ax": np.zeros(shape, dtype)}

    def _update_group(self, group):
        lr, lambd, alpha, t0 = group["lr"], group["lambd"], group["alpha"], group["t0"]
        for p, w, g in grads_of(self, group, group["weight_decay"], group["maximize"]):
            s = self.state.get(p)
            if s is None:
                s = self.state[p] = self._init_state(w.shape, w.dtype, group)
            t = s["step"] = s["step"] + 1
            eta = s["eta"]
            w *= 1.0 - lambd * eta
            w -= eta * g
            ax = s["ax"]
            if s["mu"] != 1:
                ax += (w - ax) * s["mu"]
            else:
                ax[...] = w
            s["eta"] = _f32(lr / ((1.0 + lambd * lr * t) ** alpha))
            s["mu"] = _f32(1.0 / max(1.0, t - t0))
            bump_version(p)


class Rprop(EagerOnly, Optimizer):
    """Resilient backpropagation, as `torch.optim.Rprop`.

    Each coordinate keeps its own step size: multiplied by ``etas[1]`` while the
    gradient keeps its sign, by ``etas[0]`` when it flips (and that step is skipped),
    clamped to `step_sizes`; the parameter moves by ``-sign(g) * step``.

    Example::

        >>> opt = sampan.optim.Rprop(model.parameters(), lr=0.01, etas=(0.5, 1.2))
    """

    def __init__(self, params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0),
                 maximize=False):
        super().__init__(params, {"lr": lr, "etas": tuple(etas),
                                  "step_sizes": tuple(step_sizes), "maximize": maximize})

    def _check_group(self, g):
        check_range("Rprop", "learning rate", g["lr"])
        minus, plus = g["etas"]
        if not 0.0 < minus < 1.0 < plus:
            raise SampanValueError(f"Rprop: invalid etas {g['etas']} (expected 0 < etaminus "
                                   "< 1 < etaplus)")

    def _init_state(self, shape, dtype, group):
        return {"step": 0, "prev": np.zeros(shape, dtype),
                "step_size": np.full(shape, group["lr"], dtype)}

    def _update_group(self, group):
        minus, plus = group["etas"]
        lo, hi = group["step_sizes"]
        for p, w, g in grads_of(self, group, 0.0, group["maximize"]):
            s = self.state.get(p)
            if s is None:
                s = self.state[p] = self._init_state(w.shape, w.dtype, group)
            s["step"] += 1
            prev, size = s["prev"], s["step_size"]
            sign = np.sign(g * prev)
            factor = np.where(sign > 0, plus, np.where(sign < 0, minus, 1.0)).astype(w.dtype)
            size *= factor
            np.clip(size, lo, hi, out=size)
            g = np.where(sign < 0, 0.0, g).astype(w.dtype)  # a flip: skip this step
            w -= np.sign(g) * size
            prev[...] = g
            bump_version(p)
