"""`sampan.nn.init`: fill tensors in place from seeded random streams.

Numbers come from the Philox stream of a sampan `Generator` key (the default
generator unless one is passed), so ``sampan.manual_seed(s)`` makes every
initialisation reproducible. Fan-in/fan-out follow sampan's layouts: a 2-d
weight is a Linear weight ``(in, out)``; a weight with more dims is a conv weight
``(out, in/groups, *kernel)``.

Example::

    >>> w = sampan.empty(64, 32)
    >>> nn.init.kaiming_uniform_(w, nonlinearity="relu")
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tape import bump_version
from ..errors import SampanValueError
from ..ops.random import _stream, default_generator
from ..tensor import Tensor

__all__ = ["calculate_gain", "uniform_", "normal_", "constant_", "zeros_", "ones_", "eye_",
           "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
           "trunc_normal_", "orthogonal_", "fan_in_and_fan_out"]


def _rng(generator):
    # the same (seed, counter) key a random op would take; built here rather than via
    # next_key() because initialisation always runs eagerly, even inside a trace
    g = generator or default_generator
    key = np.array([g.seed, g.counter], dtype=np.int64)
    g.counter += 1
    return _stream(key)


def _fill(t: Tensor, values) -> Tensor:
    # written straight into storage: initialisation is not part of any graph
    np.copyto(t._data, np.asarray(values).astype(t.dtype, copy=False))
    bump_version(t)
    return t


def fan_in_and_fan_out(t) -> tuple:
    """(fan_in, fan_out) of a weight in sampan's layout (see module docstring)."""
    shape = tuple(t.shape)
    if len(shape) < 2:
        raise SampanValueError(f"nn.init: fan in/out needs a tensor with >= 2 dims; got "
                               f"shape {shape}")
    if len(shape) == 2:
        return shape[0], shape[1]
    rf = int(np.prod(shape[2:]))
    return shape[1] * rf, shape[0] * rf


def calculate_gain(nonlinearity: str, param=None) -> float:
    """Recommended gain for an activation (PyTorch's table). Example:
    ``calculate_gain("relu")`` is sqrt(2)."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose2d", "sigmoid",
                        "identity"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise SampanValueError(f"calculate_gain: got nonlinearity {nonlinearity!r}; expected one "
                           "of linear, sigmoid, tanh, relu, leaky_relu, selu, conv*")


def uniform_(t, a=0.0, b=1.0, generator=None):
    """Fill with U(a, b). Example: ``nn.init.uniform_(w, -0.1, 0.1)``."""
    return _fill(t, _rng(generator).uniform(a, b, size=t.shape))


def normal_(t, mean=0.0, std=1.0, generator=None):
    """Fill with N(mean, std²). Example: ``nn.init.normal_(w, std=0.02)``."""
    return _fill(t, _rng(generator).standard_normal(size=t.shape) * std + mean)


def constant_(t, value):
    """Fill with `value`."""
    return _fill(t, np.full(t.shape, value))


def zeros_(t):
    return constant_(t, 0.0)


def ones_(t):
    return constant_(t, 1.0)


def eye_(t):
    """Identity matrix (2-d tensors)."""
    if t.ndim != 2:
        raise SampanValueError(f"eye_: got shape {tuple(t.shape)}; expected a 2-d tensor")
    return _fill(t, np.eye(*t.shape))


def xavier_uniform_(t, gain=1.0, generator=None):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fi, fo = fan_in_and_fan_out(t)
    a = gain * math.sqrt(6.0 / (fi + fo))
    return uniform_(t, -a, a, generator)


def xavier_normal_(t, gain=1.0, generator=None):
    """N(0, std²) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fi, fo = fan_in_and_fan_out(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fi + fo)), generator)


def _kaiming_std(t, a, mode, nonlinearity):
    fi, fo = fan_in_and_fan_out(t)
    if mode not in ("fan_in", "fan_out"):
        raise SampanValueError(f"kaiming init: got mode {mode!r}; expected 'fan_in' or "
                               "'fan_out'")
    fan = fi if mode == "fan_in" else fo
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(t, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """U(-b, b) with b = gain * sqrt(3 / fan) (He et al.)."""
    b = math.sqrt(3.0) * _kaiming_std(t, a, mode, nonlinearity)
    return uniform_(t, -b, b, generator)


def kaiming_normal_(t, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """N(0, std²) with std = gain / sqrt(fan) (He et al.)."""
    return normal_(t, 0.0, _kaiming_std(t, a, mode, nonlinearity), generator)


def trunc_normal_(t, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """N(mean, std²) truncated to [a, b] (absolute bounds, as in PyTorch), sampled by
    inverting the normal CDF on the truncated range."""
    from scipy.special import ndtr, ndtri
    lo, hi = ndtr((a - mean) / std), ndtr((b - mean) / std)
    u = _rng(generator).uniform(lo, hi, size=t.shape)
    v = ndtri(np.clip(u, 1e-12, 1 - 1e-12)) * std + mean
    return _fill(t, np.clip(v, a, b))


def orthogonal_(t, gain=1.0, generator=None):
    """A (semi-)orthogonal matrix (QR of a Gaussian matrix, signs fixed); tensors with
    more dims are flattened to (shape[0], rest)."""
    if t.ndim < 2:
        raise SampanValueError(f"orthogonal_: got shape {tuple(t.shape)}; expected >= 2 dims")
    rows, cols = t.shape[0], int(np.prod(t.shape[1:]))
    m = _rng(generator).standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(m)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill(t, (gain * q).reshape(t.shape))
