"""Random ops with explicit generator state.

A random op takes a `key` input: an int64[2] tensor (seed, counter) drawn from a
`Generator`. The kernel builds a counter-based Philox stream from the key, so the
same key always gives the same numbers, eagerly or in a traced graph, and a traced
program can thread the key through as an ordinary input."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..tensor import Tensor, apply, wrap
from ._util import Sample
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, STATE, Spec, defop


class Generator:
    """Random state: a seed and a counter. Example: ``g = sampan.Generator(0)``."""

    def __init__(self, seed: int = 0):
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> "Generator":
        self.seed = int(seed) & 0x7FFFFFFFFFFFFFFF
        self.counter = 0
        return self

    def next_key(self) -> Tensor:
        """The key for one random op; advances the counter."""
        if STATE.tracer is not None:  # traced: the key is graph state (sampan.jit)
            return STATE.tracer.random_key(self)
        k = np.array([self.seed, self.counter], dtype=np.int64)
        self.counter += 1
        return wrap(k)

    def get_state(self):
        return {"seed": self.seed, "counter": self.counter}

    def set_state(self, state):
        self.seed, self.counter = int(state["seed"]), int(state["counter"])


default_generator = Generator(0)


def manual_seed(seed: int) -> Generator:
    """Seed the default generator (and return it). Example: ``sampan.manual_seed(0)``."""
    return default_generator.manual_seed(seed)


def _stream(key):
    k = np.asarray(key, dtype=np.int64).astype(np.uint64)
    return np.random.Generator(np.random.Philox(key=np.array([k[0], k[1]], dtype=np.uint64)))


def _sample_key():
    return np.array([3, 1], dtype=np.int64)


def _uniform(key, shape, low, high, dtype):
    d = _dt.as_dtype(dtype)
    return _stream(key).uniform(low, high, size=shape).astype(d)


def _normal(key, shape, mean, std, dtype):
    d = _dt.as_dtype(dtype)
    return (_stream(key).standard_normal(size=shape) * std + mean).astype(d)


def _randint(key, shape, low, high, dtype):
    return _stream(key).integers(low, high, size=shape).astype(_dt.as_dtype(dtype))


def _rrule(key, shape, low=None, high=None, mean=None, std=None, dtype="float32"):
    return Spec(tuple(shape), _dt.as_dtype(dtype))


UNIFORM = defop("uniform", _rrule, kernel=_uniform, grad=NOT_DIFFERENTIABLE, random=True,
                onnx="RandomUniform", flops=lambda *a, **k: 0,
                samples=lambda: [Sample((_sample_key(),), {"shape": (3, 4), "low": 0.0,
                                                           "high": 1.0, "dtype": "float32"})])
NORMAL = defop("normal", _rrule, kernel=_normal, grad=NOT_DIFFERENTIABLE, random=True,
               onnx="RandomNormal", flops=lambda *a, **k: 0,
               samples=lambda: [Sample((_sample_key(),), {"shape": (3, 4), "mean": 0.0,
                                                          "std": 1.0, "dtype": "float32"})])
RANDINT = defop("randint", _rrule, kernel=_randint, grad=NOT_DIFFERENTIABLE, random=True,
                onnx=NO_ONNX, flops=lambda *a, **k: 0,
                samples=lambda: [Sample((_sample_key(),), {"shape": (5,), "low": 0, "high": 7,
                                                           "dtype": "int64"})])


def _shape(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(d) for d in shape)


def _key(generator):
    return (generator or default_generator).next_key()


def rand(*shape, dtype=None, generator=None, requires_grad=False):
    """Uniform [0, 1) samples: ``sampan.rand(2, 3)``."""
    t = apply(UNIFORM, (_key(generator),), {"shape": _shape(shape), "low": 0.0, "high": 1.0,
                                            "dtype": _dt.dtype_name(_dt.as_dtype(dtype))})
    return t.requires_grad_(True) if requires_grad else t


def uniform(*shape, low=0.0, high=1.0, dtype=None, generator=None):
    """Uniform [low, high) samples."""
    return apply(UNIFORM, (_key(generator),), {"shape": _shape(shape), "low": float(low),
                                               "high": float(high),
                                               "dtype": _dt.dtype_name(_dt.as_dtype(dtype))})


def randn(*shape, dtype=None, generator=None, requires_grad=False):
    """Standard normal samples: ``sampan.randn(2, 3)``."""
    t = apply(NORMAL, (_key(generator),), {"shape": _shape(shape), "mean": 0.0, "std": 1.0,
                                           "dtype": _dt.dtype_name(_dt.as_dtype(dtype))})
    return t.requires_grad_(True) if requires_grad else t


def normal(mean=0.0, std=1.0, size=(), dtype=None, generator=None):
    """Normal samples with the given mean and std."""
    return apply(NORMAL, (_key(generator),), {"shape": _shape((size,)), "mean": float(mean),
                                              "std": float(std),
                                              "dtype": _dt.dtype_name(_dt.as_dtype(dtype))})


def randint(low, high=None, size=(), dtype="int64", generator=None):
    """Integers in [low, high): ``sampan.randint(0, 10, (3,))``."""
    if high is None:
        low, high = 0, low
    return apply(RANDINT, (_key(generator),), {"shape": _shape((size,)), "low": int(low),
                                               "high": int(high),
                                               "dtype": _dt.dtype_name(_dt.as_dtype(dtype))})


def rand_like(t, generator=None):
    return rand(tuple(t.shape), dtype=t.dtype, generator=generator)


def randn_like(t, generator=None):
    return randn(tuple(t.shape), dtype=t.dtype, generator=generator)


def randint_like(t, low, high=None, generator=None):
    return randint(low, high, tuple(t.shape), dtype=t.dtype, generator=generator)


def randperm(n, generator=None):
    """A random permutation of 0..n-1 (int64)."""
    from ..tensor import Tensor as _T
    key = _key(generator)._data
    return _T(_stream(key).permutation(n).astype(np.int64))
