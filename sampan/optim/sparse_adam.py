"""SparseAdam: Adam on only the rows a sparse gradient touches, as `torch.optim.SparseAdam`."""
from __future__ import annotations

import math

import numpy as np

from sampan.autograd.tape import bump_version
from sampan.errors import SampanValueError, op_error

from ._eager import EagerOnly, check_range
from .optimizer import Optimizer

__all__ = ["SparseAdam"]


class SparseAdam(EagerOnly, Optimizer):
    """Masked Adam for `nn.Embedding(sparse=True)` tables, as `torch.optim.SparseAdam`.

    Each step updates the moments and the weights of only the rows the gradient covers
    (the rows looked up); other rows, and their moments, are left as they are. The step
    counter (bias correction) is per parameter, counted on the steps it had a gradient.

    Example::

        >>> emb = nn.Embedding(10000, 32, sparse=True)
        >>> opt = sampan.optim.SparseAdam(emb.parameters(), lr=1e-3)
    """

    _sparse_grads = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, maximize=False):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "maximize": maximize})

    def _check_group(self, g):
        check_range("SparseAdam", "learning rate", g["lr"])
        check_range("SparseAdam", "eps", g["eps"], lo_open=True)
        b1, b2 = g["betas"]
        check_range("SparseAdam", "beta1", b1, 0.0, 1.0, hi_open=True)
        check_range("SparseAdam", "beta2", b2, 0.0, 1.0, hi_open=True)

    def _check_sparse(self, group):
        for p in group["params"]:
            if p.grad is not None and getattr(p, "_sparse_grad_rows", None) is None:
                raise op_error(SampanValueError, "SparseAdam.step",
                               f"a dense gradient for a parameter of shape {tuple(p.shape)}",
                               "sparse gradients (from nn.Embedding(sparse=True))",
                               "Use optim.Adam for dense parameters")

    def _init_state(self, shape, dtype, group):
        return {"step": 0, "exp_avg": np.zeros(shape, dtype), "exp_avg_sq": np.zeros(shape, dtype)}

    def _update_group(self, group):
        lr, eps = group["lr"], group["eps"]
        b1, b2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            rows = p._sparse_grad_rows
            w = p._data
            s = self.state.get(p)
            if s is None:
                s = self.state[p] = self._init_state(w.shape, w.dtype, group)
            t = s["step"] = s["step"] + 1
            g = p.grad._data[rows]
            if group["maximize"]:
                g = -g
            m, v = s["exp_avg"], s["exp_avg_sq"]
            m_old, v_old = m[rows], v[rows]
            dm = (g - m_old) * (1.0 - b1)
            dv = (g * g - v_old) * (1.0 - b2)
            m[rows] = m_old + dm
            v[rows] = v_old + dv
            step_size = lr * math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
            w[rows] += -step_size * ((dm + m_old) / (np.sqrt(dv + v_old) + eps))
            bump_version(p)
