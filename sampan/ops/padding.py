"""Padding in every mode PyTorch's `F.pad` has: constant (the `pad` op of shape.py),
reflect, replicate and circular, with negative amounts cropping.

The non-constant modes are composites of slices, flips, broadcasts and one concat per
padded dim (no kernel of their own: their gradients come from those ops, and they
trace to ordinary graph nodes). Pads are applied one dim at a time, which is exact for
these modes: each is separable, so corners come out as PyTorch's. Negative amounts crop
first, then the positive ones pad what is left (PyTorch's order, checked against it),
except in reflect mode, where PyTorch reflects about the uncropped edges: that mode is an
index_select of reflected positions per dim.
"""
from __future__ import annotations

from ..errors import SampanValueError, ShapeError, op_error
from ..tensor import Tensor
from ._util import Sample, randf, rng

MODES = ("constant", "reflect", "replicate", "circular")


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def torch_pairs(op, x, pad):
    """PyTorch's flat pad tuple (last dim first: left, right, top, bottom, …) as one
    (before, after) pair per dim of x; a tuple of pairs is taken as it is."""
    pad = tuple(pad)
    if pad and isinstance(pad[0], (tuple, list)):
        pairs = tuple((int(a), int(b)) for a, b in pad)
        if len(pairs) != x.ndim:
            raise op_error(ShapeError, op, f"{len(pairs)} (before, after) pairs for a "
                           f"{x.ndim}-d input", "one pair per dim")
        return pairs
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise op_error(ShapeError, op, f"pad={pad} for a {x.ndim}-d input",
                       "an even number of amounts, at most two per dim (last dim first)")
    flat = [(int(pad[i]), int(pad[i + 1])) for i in range(0, len(pad), 2)]
    return tuple([(0, 0)] * (x.ndim - len(flat)) + flat[::-1])


def crop(x, pairs):
    """x with negative amounts cut off; returns it and the pairs with those set to 0."""
    from .shape import narrow
    out = []
    for d, (a, b) in enumerate(pairs):
        if a < 0 or b < 0:
            n = x.shape[d]
            start, stop = max(-a, 0), n - max(-b, 0)
            if stop < start:
                raise op_error(ShapeError, "pad", f"pads {(a, b)} for dim {d} of size {n}",
                               "negative pads that leave a size >= 0")
            x = narrow(x, d, start, stop - start)
        out.append((max(a, 0), max(b, 0)))
    return x, tuple(out)


def _each_dim(name, x, pads, edges):
    from .shape import concat
    x, pads = crop(_t(x), pads)
    for d, (a, b) in enumerate(pads):
        if not a and not b:
            continue
        n = x.shape[d]
        if not (a <= n and b <= n if name == "circular" else n > 0):
            raise op_error(ShapeError, f"pad (mode={name!r})", f"pads {(a, b)} for dim {d} "
                           f"of size {n}", "pads at most the dim's size"
                           if name == "circular" else "a non-empty dim")
        left, right = edges(x, d, n, a, b)
        x = concat([p for p in (left, x, right) if p is not None], d)
    return x


def _edge(x, d, start, k):
    from .shape import expand, narrow
    e = narrow(x, d, start, 1)
    shape = list(x.shape)
    shape[d] = k
    return expand(e, tuple(shape))


def _replicate_edges(x, d, n, a, b):
    return (_edge(x, d, 0, a) if a else None, _edge(x, d, n - 1, b) if b else None)


def _circular_edges(x, d, n, a, b):
    from .shape import narrow
    return (narrow(x, d, n - a, a) if a else None, narrow(x, d, 0, b) if b else None)


def pad_reflect(x, pads):
    """Reflection padding (the edge itself not repeated) by per-dim (before, after).

    Negative amounts do not crop first here: output j reads input reflect(j - before)
    about the input's own edges, as PyTorch's reflection kernels do."""
    import numpy as np

    from .index import index_select
    x = _t(x)
    for d, (a, b) in enumerate(pads):
        if not a and not b:
            continue
        n = x.shape[d]
        if a >= n or b >= n or n + a + b < 0:
            raise op_error(ShapeError, "pad (mode='reflect')", f"pads {(a, b)} for dim {d} "
                           f"of size {n}", "pads smaller than the dim")
        j = np.abs(np.arange(n + a + b) - a)
        j = np.where(j > n - 1, 2 * (n - 1) - j, j)
        x = index_select(x, Tensor(j.astype(np.int64)), d)
    return x


def pad_replicate(x, pads):
    """Edge-value padding by per-dim (before, after) amounts."""
    return _each_dim("replicate", x, pads, _replicate_edges)


def pad_circular(x, pads):
    """Wrap-around padding by per-dim (before, after) amounts (at most the dim's size)."""
    return _each_dim("circular", x, pads, _circular_edges)


_BY_MODE = {"reflect": pad_reflect, "replicate": pad_replicate, "circular": pad_circular}


def pad(input, pad, mode="constant", value=None):
    """PyTorch's `F.pad`: `pad` lists amounts from the last dim backwards (left, right,
    top, bottom, front, back); negative amounts crop. Modes: "constant" (with `value`,
    any rank), "reflect", "replicate", "circular" (the last 1, 2 or 3 dims of a 2-5 d
    input, as PyTorch: len(pad) // 2 + 1 or + 2 dims).

    Example::

        >>> F.pad(sampan.ones(1, 2, 3), (1, 1), mode="reflect").shape
        (1, 2, 5)
    """
    from ..tensor import apply
    from .shape import PAD
    x = _t(input)
    if mode not in MODES:
        raise op_error(SampanValueError, "pad", f"mode={mode!r}", f"one of {MODES}")
    pairs = torch_pairs("pad", x, pad)
    if mode == "constant":   # always through the op: the result is never a view of x
        x, pairs = crop(x, pairs)
        return apply(PAD, (x,), {"pads": pairs, "value": float(0.0 if value is None
                                                                 else value)})
    if value not in (None, 0, 0.0):
        raise op_error(SampanValueError, "pad", f"value={value!r} with mode={mode!r}",
                       "a value only with mode='constant'")
    k = len(tuple(pad)) // 2
    flat = not (tuple(pad) and isinstance(tuple(pad)[0], (tuple, list)))
    if flat and (k not in (1, 2, 3) or x.ndim not in (k + 1, k + 2)):
        raise op_error(ShapeError, "pad", f"mode={mode!r}, {len(tuple(pad))} pad amounts, "
                       f"a {x.ndim}-d input", "2, 4 or 6 amounts for the last 1, 2 or 3 "
                       "dims of a (k+1)- or (k+2)-d input (PyTorch's combinations)")
    y = _BY_MODE[mode](x, pairs)
    if not any(a > 0 or b > 0 for a, b in pairs):   # only cropped: a copy, as PyTorch's
        from .shape import clone
        y = clone(y)
    return y


def _samples(mode):
    def make():
        r = rng(90)
        if mode == "circular":
            second = ((0, 0), (3, -1), (1, 2))
        else:
            second = ((0, 0), (2, -1), (-1, 1))
        return [Sample((randf(r, 1, 2, 5),), {"pads": ((0, 0), (0, 0), (2, 3))}),
                Sample((randf(r, 2, 4, 3),), {"pads": second})]
    return make


def _register():
    from .composite import COMPOSITES
    for mode, fn in _BY_MODE.items():
        COMPOSITES[f"pad_{mode}"] = (fn, _samples(mode))


_register()
