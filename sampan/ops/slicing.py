"""stack, narrow, split and chunk: PyTorch's signatures (`dim=`, also numpy's `axis=`)
over shape.py's primitives (concat, getitem), with their sizes checked before slicing.
Re-exported by shape.py, their usual home."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError, op_error
from ._util import pick
from .shape import _dim_range, _t, concat, getitem, unsqueeze


def stack(xs, dim=None, *, axis=None):
    """Join tensors of one shape along a new dim (default 0).
    Example: ``sampan.stack([a, b], dim=1)``."""
    if axis is not None:
        dim = axis if dim is None else pick("stack", "dim", dim, "axis", axis)
    xs = [_t(x) for x in xs]
    if not xs:
        raise op_error(ShapeError, "stack", "no tensors", "a non-empty sequence of tensors")
    shapes = {tuple(x.shape) for x in xs}
    if len(shapes) > 1:
        raise op_error(ShapeError, "stack", "shapes " + ", ".join(str(tuple(x.shape))
                                                                  for x in xs), "equal shapes")
    ax = _dim_range("stack", 0 if dim is None else dim, xs[0].ndim, 1)
    return concat([unsqueeze(x, ax) for x in xs], ax)


def narrow(x, dim=None, start=0, length=None, *, axis=None):
    """`length` elements from `start` (negative: from the end) along `dim`.
    Example: ``x.narrow(1, 0, 2)``."""
    if axis is not None:
        dim = axis if dim is None else pick("narrow", "dim", dim, "axis", axis)
    x = _t(x)
    if dim is None or length is None:
        raise op_error(ShapeError, "narrow", "no dim or no length", "narrow(x, dim, start, "
                       "length)")
    ax = _dim_range("narrow", dim, x.ndim)
    n = x.shape[ax]
    start, length = int(start), int(length)
    if isinstance(n, int):
        if start < 0:
            start += n
        if not 0 <= start <= n or length < 0 or start + length > n:
            raise op_error(ShapeError, "narrow", f"start {start}, length {length} along dim "
                           f"{dim} of size {n}", "0 <= start and start + length <= size")
    idx = [slice(None)] * x.ndim
    idx[ax] = slice(start, start + length)
    return getitem(x, tuple(idx))


def split(x, split_size_or_sections, dim=None, *, axis=None):
    """Split along `dim` (default 0), with PyTorch's meaning: an int is the size of each
    chunk (the last may be smaller), a list gives each section's size (they must add up).
    This is not numpy's ``np.split`` (whose int is a number of sections and whose list
    holds split points): for n equal parts use `chunk`. Example: ``a, b = x.split(2)``."""
    if axis is not None:
        dim = axis if dim is None else pick("split", "dim", dim, "axis", axis)
    x = _t(x)
    ax = _dim_range("split", 0 if dim is None else dim, x.ndim)
    n = x.shape[ax]
    size = split_size_or_sections
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = int(size)
        if size <= 0 and not (size == 0 and n == 0):
            raise op_error(ShapeError, "split", f"split_size {size} for a dim of size {n}",
                           "a positive chunk size")
        if n == 0:
            sizes = [0]
        else:
            sizes = [size] * (n // size)
            if n % size:
                sizes.append(n % size)
    else:
        sizes = [int(s) for s in size]
        if any(s < 0 for s in sizes) or (isinstance(n, int) and builtins_sum(sizes) != n):
            raise op_error(ShapeError, "split", f"sections {sizes} for a dim of size {n}",
                           f"non-negative section sizes that add up to {n}")
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, ax, start, s))
        start += s
    return tuple(out)


def chunk(x, chunks, dim=None, *, axis=None):
    """Split along `dim` (default 0) into at most `chunks` pieces of equal size (the last
    may be smaller, and there may be fewer), as PyTorch. Example: ``q, k, v = x.chunk(3, -1)``."""
    if axis is not None:
        dim = axis if dim is None else pick("chunk", "dim", dim, "axis", axis)
    x = _t(x)
    ax = _dim_range("chunk", 0 if dim is None else dim, x.ndim)
    chunks = int(chunks)
    if chunks <= 0:
        raise op_error(ShapeError, "chunk", f"chunks={chunks}", "a positive number of chunks")
    n = x.shape[ax]
    if n == 0:     # PyTorch: `chunks` empty pieces
        return tuple(narrow(x, ax, 0, 0) for _ in range(chunks))
    return split(x, -(-n // chunks), ax)


def builtins_sum(xs):
    t = 0
    for v in xs:
        t += v
    return t
