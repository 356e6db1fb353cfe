"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay."""
from __future__ import annotations

import numpy as np

from sampan.autograd.tape import bump_version
from sampan.errors import SampanValueError

from . import _fused
from . import functional as F
from .optimizer import Optimizer, grads_of, required

__all__ = ["SGD"]

_mul = np.multiply
_add = np.add


class SGD(Optimizer):
    """Stochastic gradient descent, the update rule of PyTorch's `torch.optim.SGD`.

    With momentum ``m``: ``b = m*b + (1-dampening)*g`` (``b = g`` on the first step),
    then ``p -= lr * (g + m*b if nesterov else b)``; weight decay adds ``wd*p`` to ``g``.

    Example::

        >>> opt = sampan.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    _sparse_grads = True  # zero rows of a sparse grad change nothing (torch allows it)

    def __init__(self, params, lr=required, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov,
                                  "maximize": maximize})

    def _check_group(self, g):
        if g["lr"] < 0:
            raise SampanValueError(f"SGD: invalid learning rate {g['lr']} (expected >= 0)")
        if g["momentum"] < 0:
            raise SampanValueError(f"SGD: invalid momentum {g['momentum']} (expected >= 0)")
        if g["weight_decay"] < 0:
            raise SampanValueError(f"SGD: invalid weight_decay {g['weight_decay']}")
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise SampanValueError("SGD: Nesterov momentum needs momentum > 0 and "
                                   "dampening = 0")

    def _init_state(self, shape, dtype, group):
        return {"momentum_buffer": np.zeros(shape, dtype)} if group["momentum"] else {}

    def _needs_started(self, group):
        return bool(group["momentum"] and group["dampening"])

    def _traced_update(self, p, grad, st, group, lr):
        buf = st.get("momentum_buffer")
        damp = group["dampening"]
        started = st.get("_started")
        if started is not None:  # the first step takes the gradient undamped
            damp = started * damp
        new, nb = F.sgd_update(p, grad, buf, lr=lr, momentum=group["momentum"],
                               dampening=damp, weight_decay=group["weight_decay"],
                               nesterov=group["nesterov"], maximize=group["maximize"])
        if nb is not None:
            buf.copy_(nb)
        if started is not None:
            started.fill_(1.0)
        p.copy_(new)

    def _update_group(self, group):
        lr = group["lr"]
        momentum = group["momentum"]
        keep = 1.0 - group["dampening"]
        wd = group["weight_decay"]
        nesterov = group["nesterov"]
        maximize = group["maximize"]
        state = self.state
        for p, w, g in grads_of(self, group, wd, maximize):
            if momentum:
                s = state.get(p)
                if s is None:
                    buf = np.array(g, copy=True)
                    state[p] = {"momentum_buffer": buf}
                elif keep == 1.0 and not nesterov and _fused.usable(w, g, s["momentum_buffer"]):
                    _fused.sgd_momentum(w, g, s["momentum_buffer"], momentum, lr)
                    bump_version(p)
                    continue
                else:
                    buf = s["momentum_buffer"]
                    _mul(buf, momentum, out=buf)
                    if keep != 1.0:
                        t = self._buffer(g, 2)
                        _mul(g, keep, out=t)
                        _add(buf, t, out=buf)
                    else:
                        _add(buf, g, out=buf)
                if nesterov:
                    t = self._buffer(g, 2)
                    _mul(buf, momentum, out=t)
                    _add(g, t, out=t)
                    g = t
                else:
                    g = buf
            t = self._buffer(g, 3)
            _mul(g, lr, out=t)
            np.subtract(w, t, out=w)
            bump_version(p)
