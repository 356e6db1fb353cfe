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
        """{"seed", "counter"}: everything the next numbers depend on (a plain dict, so a
        checkpoint stores it as data); `sampan.get_rng_state()` gives it as a tensor."""
        return {"seed": self.seed, "counter": self.counter}

    def set_state(self, state) -> "Generator":
        """Restore a `get_state()` dict or a `get_rng_state()` int64[2] tensor: the numbers
        drawn since are drawn again. Example: ``g.set_state(g.get_state())``."""
        if isinstance(state, dict):
            seed, counter = state["seed"], state["counter"]
        else:
            a = np.asarray(getattr(state, "_data", state))
            if a.shape != (2,) or a.dtype.kind not in "iu":
                from ..errors import SampanValueError, op_error
                raise op_error(SampanValueError, "set_rng_state", f"{a.dtype}{list(a.shape)}",
                               "a state from get_rng_state() (int64[2]) or get_state()")
            seed, counter = a.tolist()
        self.seed, self.counter = int(seed), int(counter)
        return self

    def initial_seed(self) -> int:
        """The seed this generator was last seeded with."""
        return self.seed


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


# ---------------------------------------------------------------------- (issue 17) torch surface
def get_rng_state():
    """The default generator's state as an int64[2] tensor (seed, counter); restoring it with
    `set_rng_state` replays the same numbers. Example: ``s = sampan.get_rng_state()``."""
    g = default_generator
    return wrap(np.array([g.seed, g.counter], dtype=np.int64))


def set_rng_state(new_state):
    """Restore the default generator from `get_rng_state()` (or a `get_state()` dict)."""
    default_generator.set_state(new_state)


def seed() -> int:
    """Seed the default generator from the OS's entropy and return that seed."""
    import os
    s = int.from_bytes(os.urandom(8), "little") & 0x7FFFFFFFFFFFFFFF
    default_generator.manual_seed(s)
    return s


def initial_seed() -> int:
    """The seed the default generator was last seeded with (manual_seed or seed)."""
    return default_generator.seed


def _float_target(op, x):
    if not _dt.is_floating(x.dtype):
        from ..errors import DTypeError, op_error
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a floating tensor")
    return tuple(x.shape), x.dtype


def uniform_fill(x, a=0.0, b=1.0, *, generator=None):
    """The out-of-place form of ``x.uniform_(a, b)``: U[a, b) of x's shape and dtype."""
    shape, d = _float_target("uniform_", x)
    return uniform(shape, low=a, high=b, dtype=d, generator=generator)


def normal_fill(x, mean=0.0, std=1.0, *, generator=None):
    """The out-of-place form of ``x.normal_(mean, std)``."""
    shape, d = _float_target("normal_", x)
    return normal(mean, std, shape, dtype=d, generator=generator)


def exponential_fill(x, lambd=1.0, *, generator=None):
    """The out-of-place form of ``x.exponential_(lambd)``: -log(1 - U) / lambd."""
    from .elementwise import div, log1p, neg
    shape, d = _float_target("exponential_", x)
    if not lambd > 0:
        from ..errors import SampanValueError, op_error
        raise op_error(SampanValueError, "exponential_", f"lambd={lambd}", "lambd > 0")
    return div(neg(log1p(neg(rand(shape, dtype=d, generator=generator)))), float(lambd))


def _probability(op, p):
    """Eagerly check probabilities lie in [0, 1] (torch raises for others)."""
    if STATE.tracer is not None:
        return
    a = np.asarray(getattr(p, "_data", p), dtype=np.float64)
    if a.size and not ((a >= 0) & (a <= 1)).all():
        from ..errors import SampanValueError, op_error
        raise op_error(SampanValueError, op, "probabilities outside [0, 1] (min "
                       f"{a.min():g}, max {a.max():g})", "0 <= p <= 1")


def bernoulli_fill(x, p=0.5, *, generator=None):
    """The out-of-place form of ``x.bernoulli_(p)``: 1 with probability p (a float or a
    tensor broadcast to x), else 0, in x's dtype."""
    from .elementwise import cast, lt
    _probability("bernoulli_", p)
    u = rand(tuple(x.shape), dtype=x.dtype if _dt.is_floating(x.dtype) else None,
             generator=generator)
    return cast(lt(u, p), x.dtype)


def random_fill(x, from_=None, to=None, *, generator=None):
    """The out-of-place form of ``x.random_(to)`` / ``x.random_(from, to)``: integers in
    [from, to); with neither, [0, 2^mantissa] for floats and [0, max] for integers."""
    from .elementwise import cast
    if to is None and from_ is not None:
        from_, to = 0, from_
    from_ = 0 if from_ is None else int(from_)
    d = np.dtype(x.dtype)
    if to is None:
        # inclusive bounds as torch: [0, 2^mantissa] for floats, [0, max] for integers
        # (int64's max itself cannot be an exclusive bound)
        to = 2 if d == np.bool_ else (2 ** (np.finfo(d).nmant + 1) + 1 if d.kind == "f"
                                      else min(int(np.iinfo(d).max) + 1, 2 ** 63 - 1))
    if not to > from_:
        from ..errors import SampanValueError, op_error
        raise op_error(SampanValueError, "random_", f"from={from_}, to={to}", "from < to")
    return cast(randint(from_, int(to), tuple(x.shape), generator=generator), x.dtype)


def bernoulli(input, p=None, *, generator=None):
    """1 with probability `input` (elementwise; or the scalar p), else 0, in input's dtype.
    Example: ``sampan.bernoulli(sampan.full((3,), 0.3))``."""
    x = input if isinstance(input, Tensor) else Tensor(np.asarray(input))
    return bernoulli_fill(x, x if p is None else p, generator=generator)


def multinomial(input, num_samples, replacement=False, *, generator=None):
    """Category indices (int64) drawn with the weights in each row of `input` (1-d or 2-d,
    non-negative, not all zero): (num_samples,) or (N, num_samples). Without replacement
    (the default) each row's indices are distinct, drawn as Gumbel-top-k (the same
    distribution as drawing one at a time). Example: ``sampan.multinomial(w, 2)``."""
    from .elementwise import add, cast, div, gt, le, log, neg, where
    from .reduce import cumsum, sum
    from .shape import unsqueeze
    from .sort import topk
    x = input if isinstance(input, Tensor) else Tensor(np.asarray(input, dtype=np.float32))
    _check_multinomial(x, num_samples, replacement)
    n = x.shape[-1]
    lead = tuple(x.shape[:-1])
    if not _dt.is_floating(x.dtype):
        x = cast(x, np.float32)
    if replacement:
        cdf = cumsum(x, -1)
        u = rand(lead + (num_samples,), dtype=x.dtype, generator=generator)
        v = unsqueeze(u * sum(x, -1, keepdims=True), -1)          # (..., k, 1)
        return sum(cast(le(unsqueeze(cdf, -2), v), np.int64), -1)  # entries of cdf <= v
    u = rand(lead + (n,), dtype=x.dtype, generator=generator)
    gumbel = neg(log(neg(log(add(u, float(np.finfo(x.dtype).tiny))))))
    pos = gt(x, 0.0)                 # zero weights: key -inf (never drawn), without log(0)
    keys = where(pos, add(log(where(pos, div(x, sum(x, -1, keepdims=True)), 1.0)), gumbel),
                 float("-inf"))
    return topk(keys, int(num_samples), -1)[1]


def _check_multinomial(x, num_samples, replacement):
    from ..errors import SampanValueError, ShapeError, op_error
    if x.ndim not in (1, 2):
        raise op_error(ShapeError, "multinomial", f"shape {tuple(x.shape)}",
                       "a 1-d or 2-d tensor of weights")
    if int(num_samples) <= 0:
        raise op_error(SampanValueError, "multinomial", f"num_samples={num_samples}",
                       "num_samples > 0")
    if STATE.tracer is not None:
        return
    a = np.asarray(x._data, dtype=np.float64)
    rows = a.reshape(-1, a.shape[-1])
    if a.shape[-1] == 0 or not np.isfinite(a).all() or (a < 0).any() or \
            (rows.sum(-1) <= 0).any():
        raise op_error(SampanValueError, "multinomial", "weights with a negative, inf or nan "
                       "entry, or a row summing to 0", "finite non-negative weights, each "
                       "row with a positive sum")
    if not replacement and int(num_samples) > (rows > 0).sum(-1).min():
        raise op_error(SampanValueError, "multinomial", f"num_samples={num_samples} without "
                       f"replacement for a row with {(rows > 0).sum(-1).min()} nonzero "
                       "weights", "num_samples <= the nonzero categories (or "
                       "replacement=True)")


def _poisson_rule(key, rates):
    from ..errors import DTypeError, ShapeError, op_error
    if tuple(key.shape) != (2,) or key.dtype != np.int64:
        raise op_error(ShapeError, "poisson", f"key {key.dtype}{list(key.shape)}",
                       "an int64[2] key from a Generator")
    if not _dt.is_floating(rates.dtype):
        raise op_error(DTypeError, "poisson", f"rates of dtype {rates.dtype}",
                       "floating rates")
    return Spec(tuple(rates.shape), rates.dtype)


def _poisson_kernel(key, rates):
    r = rates.astype(np.float64)
    if not (np.isfinite(r) & (r >= 0)).all():
        from ..errors import SampanValueError, op_error
        raise op_error(SampanValueError, "poisson", "a negative, inf or nan rate",
                       "finite rates >= 0")
    return _stream(key).poisson(r).astype(rates.dtype)


# a keyed op like the others, but not flagged `random`: its draws depend on a second input
# (the rates), and the table's random flag promises ops of the key alone
POISSON = defop("poisson", _poisson_rule, kernel=_poisson_kernel, grad=NOT_DIFFERENTIABLE,
                onnx=NO_ONNX, flops=lambda key, rates: 0, nondiff_inputs=(0, 1),
                samples=lambda: [Sample((_sample_key(), np.array([[0.5, 2.0, 7.0],
                                                                  [0.0, 1.0, 30.0]],
                                                                 dtype=np.float32)), diff=())])


def poisson(input, generator=None):
    """Poisson counts with the rates in `input` (same shape and dtype), drawn from the
    generator's keyed stream. Example: ``sampan.poisson(sampan.full((3,), 4.0))``."""
    x = input if isinstance(input, Tensor) else Tensor(np.asarray(input, dtype=np.float32))
    return apply(POISSON, (_key(generator), x), {})


EXPORTS_17 = ["poisson", "bernoulli", "multinomial", "get_rng_state", "set_rng_state", "seed",
              "initial_seed"]
INPLACE_17 = {"uniform_": uniform_fill, "normal_": normal_fill, "bernoulli_": bernoulli_fill,
              "exponential_": exponential_fill, "random_": random_fill}
