"""One-pass update kernels for the eager optimisers (numba, the `jit` extra).

The numpy form of an Adam step walks the parameter's arrays ~12 times (one ufunc each);
these loops read and write each element once. Each performs the same float operations
in the same order and dtype as the numpy sequence it replaces (scalars cast to the
array dtype, as numpy does with Python floats), so results are bit-identical to it.
`usable(*arrays)` says whether the arrays qualify: one float dtype, contiguous, one
size. Without numba, or otherwise, optimisers keep their numpy sequence.
"""
from __future__ import annotations

import numpy as np

from ..ops._nb import HAVE_NUMBA, njit

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def usable(w, *arrays) -> bool:
    """Whether the fused kernels can update `w` with these same-sized arrays."""
    if not HAVE_NUMBA or w.dtype not in _FLOATS or not w.flags.c_contiguous:
        return False
    for a in arrays:
        if a.dtype != w.dtype or a.size != w.size or not a.flags.c_contiguous:
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def _sgd_momentum(w, g, buf, momentum, lr):
    for i in range(w.size):
        b = buf[i] * momentum
        b = b + g[i]
        buf[i] = b
        w[i] = w[i] - b * lr


@njit(cache=True, nogil=True, error_model="numpy")
def _sgd_plain(w, g, lr):
    for i in range(w.size):
        w[i] = w[i] - g[i] * lr


@njit(cache=True, nogil=True, error_model="numpy")
def _adam(w, g, m, v, decay, one_b1, b2, one_b2, bc2_sqrt, eps, step_size):
    for i in range(w.size):
        gi = g[i]
        mi = m[i] + (gi - m[i]) * one_b1
        vi = v[i] * b2 + (gi * gi) * one_b2
        m[i] = mi
        v[i] = vi
        t = np.sqrt(vi) / bc2_sqrt + eps
        wi = w[i] * decay
        w[i] = wi - (mi / t) * step_size


@njit(cache=True, nogil=True, error_model="numpy")
def _adagrad(w, g, acc, eps, clr):
    for i in range(w.size):
        gi = g[i]
        a = acc[i] + gi * gi
        acc[i] = a
        w[i] = w[i] - (gi / (np.sqrt(a) + eps)) * clr


def sgd_momentum(w, g, buf, momentum, lr):
    """``buf = buf*momentum + g; w -= buf*lr`` in one pass."""
    t = w.dtype.type
    _sgd_momentum(w.reshape(-1), g.reshape(-1), buf.reshape(-1), t(momentum), t(lr))


def sgd_plain(w, g, lr):
    """``w -= g*lr`` in one pass."""
    _sgd_plain(w.reshape(-1), g.reshape(-1), w.dtype.type(lr))


def adam(w, g, m, v, decay, one_b1, b2, one_b2, bc2_sqrt, eps, step_size):
    """One Adam(W) step: moments as torch (lerp for m), ``w = w*decay - step_size*m /
    (sqrt(v)/bc2_sqrt + eps)`` (decay 1 for Adam, 1-lr*wd for AdamW)."""
    t = w.dtype.type
    _adam(w.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), t(decay), t(one_b1),
          t(b2), t(one_b2), t(bc2_sqrt), t(eps), t(step_size))


def adagrad(w, g, acc, eps, clr):
    """``acc += g*g; w -= clr * g / (sqrt(acc) + eps)`` in one pass."""
    t = w.dtype.type
    _adagrad(w.reshape(-1), g.reshape(-1), acc.reshape(-1), t(eps), t(clr))
