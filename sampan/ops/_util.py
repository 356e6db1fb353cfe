"""Helpers shared by op definitions: shape rules, gradient utilities, samples."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import DTypeError, ShapeError, op_error
from .registry import Spec


class Sample(NamedTuple):
    """One test input of an op: positional arrays and attributes.

    `diff` lists the inputs that are differentiable (default: all floating ones);
    `domain` says gradcheck may not step outside (e.g. positive-only inputs).
    """
    args: tuple
    attrs: dict = {}
    diff: tuple | None = None


def broadcast_shapes(op: str, *shapes) -> tuple:
    """numpy broadcasting that also accepts symbolic (str) dims."""
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        dim = 1
        for s in shapes:
            j = i - (nd - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1 or d == dim:
                continue
            if dim == 1:
                dim = d
            else:
                raise op_error(ShapeError, op, "shapes " + " and ".join(
                    str(tuple(s)) for s in shapes), "shapes that broadcast (each dim equal or 1)",
                    f"dim {i - nd} is {dim} in one and {d} in another")
        out.append(dim)
    return tuple(out)


def same_dtype(op: str, *specs):
    d = specs[0].dtype
    for s in specs[1:]:
        if s.dtype != d:
            raise op_error(DTypeError, op, "dtypes " + ", ".join(str(x.dtype) for x in specs),
                           "one dtype (sampan promotes before calling the op)")
    return d


def elementwise_rule(name, out_dtype=None, float_only=False):
    """Shape rule for an elementwise op: broadcast shapes, one input dtype."""
    def rule(*specs, **attrs):
        d = same_dtype(name, *specs)
        if float_only and not (d.kind == "f" or d.name == "bfloat16"):
            raise op_error(DTypeError, name, f"dtype {d}", "a floating dtype")
        shape = broadcast_shapes(name, *(s.shape for s in specs))
        return Spec(shape, np.dtype(out_dtype) if out_dtype is not None else d)
    return rule


def numel_flops(*specs, out=None, per=1, **_):
    """FLOP count of an elementwise op: `per` flops per output element."""
    shape = out.shape if out is not None else specs[0].shape
    n = 1
    for d in shape:
        n *= d if isinstance(d, int) else 1
    return per * n


def lead_size(shape):
    """The product of `shape`'s dims (for a reshape to rows): an explicit count rather than
    -1, which cannot be inferred when the other dim is 0 (a (4, 2, 0) tensor to (-1, 0));
    -1 where a dim is symbolic (traced), as there is nothing to infer from then."""
    n = 1
    for d in shape:
        if not isinstance(d, int):
            return -1
        n *= d
    return n


def norm_axis(axis, ndim, op="op"):
    """Normalise an axis or tuple of axes to a sorted tuple of non-negative ints."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise op_error(ShapeError, op, f"axis {a} for a {ndim}-d tensor",
                           f"an axis in [{-ndim}, {ndim})")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


_UNBROADCAST_OPS = []   # (reduce.sum, shape.reshape), bound at the first call


def unbroadcast(g, shape):
    """Sum `g` down to `shape` (the gradient of broadcasting)."""
    gs = tuple(g.shape)
    shape = tuple(shape)
    if gs == shape:
        return g
    if not _UNBROADCAST_OPS:     # bound once: reduce and shape import this module
        from .reduce import sum as _s
        from .shape import reshape as _r
        _UNBROADCAST_OPS[:] = (_s, _r)
    _sum, reshape = _UNBROADCAST_OPS
    lead = len(gs) - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, d in enumerate(shape) if d == 1 and gs[i + lead] != 1)
    r = _sum(g, axes, keepdims=False) if axes else g
    if tuple(r.shape) != shape:
        r = reshape(r, shape)
    return r


# ---------------------------------------------------------------------- sample data
def rng(seed=0):
    return np.random.default_rng(seed)


def randf(r, *shape, low=-2.0, high=2.0, dtype=np.float32):
    return r.uniform(low, high, size=shape).astype(dtype)


BINARY_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3)),
                 ((0, 3), (3,)), ((5,), ())]
UNARY_SHAPES = [(3, 4), (2, 3, 5), (), (0, 2), (7,)]


def unary_samples(low=-2.0, high=2.0):
    def samples():
        r = rng(1)
        return [Sample((randf(r, *s, low=low, high=high),)) for s in UNARY_SHAPES]
    return samples


def binary_samples(low=-2.0, high=2.0, blow=None, bhigh=None):
    def samples():
        r = rng(2)
        return [Sample((randf(r, *a, low=low, high=high),
                        randf(r, *b, low=low if blow is None else blow,
                              high=high if bhigh is None else bhigh)))
                for a, b in BINARY_SHAPES]
    return samples


def pick(op: str, torch_name: str, torch_value, numpy_name: str, numpy_value, default=None):
    """One argument users spell two ways: PyTorch's name (`dim`, `keepdim`) or numpy's and
    Paddle's (`axis`, `keepdims`). Either may be given (None = not given); both is an error.

        axis = pick("sum", "dim", dim, "axis", axis)
    """
    if torch_value is not None and numpy_value is not None:
        from ..errors import SampanValueError
        raise op_error(SampanValueError, op,
                       f"both {torch_name}={torch_value!r} and {numpy_name}={numpy_value!r}",
                       f"one of {torch_name}= or {numpy_name}=",
                       "they name the same argument")
    if torch_value is not None:
        return torch_value
    return default if numpy_value is None else numpy_value
