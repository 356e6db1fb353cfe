"""Layout composites with PyTorch's names and semantics: t, movedim, unbind, tile/repeat,
repeat_interleave, meshgrid, the *stack family, atleast_nd, take, rot90, kron, cross,
trace, triu/tril_indices, cartesian_prod, block_diag, diag. Each is a function over
primitives (reshape, expand, permute, concat, flip, getitem, index_select, the layout
primitives), so its gradient comes from theirs."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import SampanValueError, ShapeError, op_error
from ..tensor import Tensor
from ._util import pick
from .elementwise import add, cast, lt, mul, sub, where
from .layout_prims import _dim, diag_embed, diagonal, repeat_index
from .layout_prims import diagonal as _diagonal  # where diag's argument `diagonal` hides it
from .shape import concat, expand, flip, getitem, permute, reshape, stack, transpose


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _seq(op, tensors):
    """tensors given as f(a, b, ...) or f([a, b, ...])."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if not tensors:
        raise op_error(SampanValueError, op, "no tensors", "at least one tensor")
    return [_t(x) for x in tensors]


def _promote(xs):
    d = xs[0].dtype
    for x in xs[1:]:
        d = _dt.promote_types(d, x.dtype)
    return [x if x.dtype == d else cast(x, d) for x in xs]


# ---------------------------------------------------------------------- transposes
def t(input):
    """Transpose of a matrix; 0-d and 1-d tensors are returned as they are (``torch.t``).
    Example: ``sampan.ones(2, 3).t()``."""
    x = _t(input)
    if x.ndim > 2:
        raise op_error(ShapeError, "t", f"a {x.ndim}-d tensor",
                       "at most 2 dims (use transpose(x, d0, d1) or x.mT)")
    return transpose(x, 0, 1) if x.ndim == 2 else x


def movedim(input, source, destination):
    """Move dims `source` to positions `destination` (ints or tuples), the others keeping
    their order, as ``torch.movedim``. Example: ``sampan.ones(2, 3, 4).movedim(0, -1)``."""
    x = _t(input)
    nd = x.ndim
    src = (source,) if isinstance(source, (int, np.integer)) else tuple(source)
    dst = (destination,) if isinstance(destination, (int, np.integer)) else tuple(destination)
    if len(src) != len(dst):
        raise op_error(SampanValueError, "movedim", f"source {src} and destination {dst}",
                       "as many destinations as sources")
    src = [_dim("movedim", d, nd) for d in src]
    dst = [_dim("movedim", d, nd) for d in dst]
    if len(set(src)) < len(src) or len(set(dst)) < len(dst):
        raise op_error(SampanValueError, "movedim", f"source {src} and destination {dst}",
                       "no dim repeated")
    rest = iter(d for d in range(nd) if d not in src)
    where_to = dict(zip(dst, src))
    return permute(x, tuple(where_to[p] if p in where_to else next(rest) for p in range(nd)))


moveaxis = movedim


def unbind(input, dim=None, *, axis=None):
    """The slices along `dim` (default 0) as a tuple of views, as ``torch.unbind``.
    Example: ``a, b = sampan.ones(2, 3).unbind()``."""
    x = _t(input)
    d = _dim("unbind", pick("unbind", "dim", dim, "axis", axis, 0), x.ndim)
    return tuple(getitem(x, (slice(None),) * d + (i,)) for i in range(x.shape[d]))


def rot90(input, k=1, dims=(0, 1)):
    """Rotate by 90 degrees k times in the plane of `dims` (from the first towards the
    second), as ``torch.rot90``. Example: ``sampan.rot90(sampan.arange(4).reshape(2, 2))``."""
    x = _t(input)
    if len(dims) != 2 or x.ndim < 2:
        raise op_error(ShapeError, "rot90", f"dims {tuple(dims)} for a {x.ndim}-d tensor",
                       "two dims of a tensor of at least 2 dims")
    a, b = (_dim("rot90", d, x.ndim) for d in dims)
    if a == b:
        raise op_error(ShapeError, "rot90", f"dims {tuple(dims)}", "two different dims")
    k %= 4
    if k == 1:
        return transpose(flip(x, (b,)), a, b)
    if k == 2:
        return flip(x, (a, b))
    if k == 3:
        return transpose(flip(x, (a,)), a, b)
    return x


def fliplr(input):
    """Reverse the columns (dim 1) of a tensor of at least 2 dims.
    Example: ``sampan.fliplr(sampan.arange(4).reshape(2, 2))``."""
    x = _t(input)
    if x.ndim < 2:
        raise op_error(ShapeError, "fliplr", f"a {x.ndim}-d tensor", "at least 2 dims")
    return flip(x, (1,))


def flipud(input):
    """Reverse the rows (dim 0) of a tensor of at least 1 dim.
    Example: ``sampan.flipud(sampan.arange(4))``."""
    x = _t(input)
    if x.ndim < 1:
        raise op_error(ShapeError, "flipud", "a 0-d tensor", "at least 1 dim")
    return flip(x, (0,))


def ravel(input):
    """The tensor flattened to 1-d. Example: ``sampan.ones(2, 3).ravel()``."""
    return reshape(_t(input), (-1,))


def reshape_as(self, other):
    """``x.reshape_as(y)``: x with y's shape.
    Example: ``sampan.ones(6).reshape_as(sampan.zeros(2, 3))``."""
    return reshape(self, tuple(other.shape))


# ---------------------------------------------------------------------- repeats
def repeat(self, *sizes):
    """``x.repeat(*sizes)`` (PyTorch's, numpy's tile): the tensor tiled sizes[i] times along
    each dim; extra leading sizes add dims. An expand and a reshape, so the gradient sums
    the copies. Example: ``sampan.arange(3).repeat(2, 2)``."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    x = _t(self)
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < x.ndim:
        raise op_error(ShapeError, "repeat", f"{len(sizes)} repeat counts for a {x.ndim}-d "
                       "tensor", "at least one count per dim (use tile to pad with 1s)")
    if any(s < 0 for s in sizes):
        raise op_error(SampanValueError, "repeat", f"counts {sizes}", "counts >= 0")
    shape = (1,) * (len(sizes) - x.ndim) + tuple(x.shape)
    inter, big, out = [], [], []
    for s, d in zip(sizes, shape):
        if s != 1:
            inter.append(1)
            big.append(s)
        inter.append(d)
        big.append(d)
        out.append(s * d)
    if tuple(big) == tuple(shape):
        return reshape(x, shape)
    return reshape(expand(reshape(x, tuple(inter)), tuple(big)), tuple(out))


def tile(input, dims):
    """``torch.tile``: as repeat, with fewer counts than dims padded by leading 1s.
    Example: ``sampan.tile(sampan.arange(3), (2,))``."""
    x = _t(input)
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    return repeat(x, (1,) * (x.ndim - len(dims)) + tuple(dims))


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None, axis=None):
    """Repeat each element (or slice along `dim`) `repeats` times, as
    ``torch.repeat_interleave``: repeats an int or a 1-d tensor of counts (one per slice,
    or one for all); without dim the input is flattened; with one argument, the index
    form (``repeat_interleave(tensor([1, 2])) == [0, 1, 1]``). With a tensor of counts the
    output length depends on the data (a traced graph needs `output_size`).
    Example: ``sampan.repeat_interleave(sampan.arange(3), 2)``."""
    from .index import index_select
    if repeats is None:
        return repeat_index(input, output_size)
    dim = pick("repeat_interleave", "dim", dim, "axis", axis)
    x = _t(input)
    if dim is None:
        x, dim = reshape(x, (-1,)), 0
    d = _dim("repeat_interleave", dim, x.ndim)
    if isinstance(repeats, (int, np.integer)):
        if repeats < 0:
            raise op_error(SampanValueError, "repeat_interleave", f"repeats={repeats}",
                           "a count >= 0")
        s = tuple(x.shape)
        y = expand(reshape(x, s[:d + 1] + (1,) + s[d + 1:]), s[:d + 1] + (int(repeats),)
                   + s[d + 1:])
        return reshape(y, s[:d] + (s[d] * int(repeats),) + s[d + 1:])
    r = reshape(_t(repeats), (-1,))
    n = x.shape[d]
    if r.shape[0] == 1 and n != 1:
        r = expand(r, (n,))
    if r.shape[0] != n:
        raise op_error(ShapeError, "repeat_interleave", f"{r.shape[0]} repeat counts for "
                       f"dim {d} of size {n}", "one count per slice (or one for all)")
    return index_select(x, repeat_index(r, output_size), d)


def meshgrid(*tensors, indexing="ij"):
    """Coordinate grids of 1-d tensors, as ``torch.meshgrid``: indexing "ij" (PyTorch's
    default: dim i follows tensor i) or "xy" (the first two swapped, numpy's default). The
    grids are broadcast views.
    Example: ``gx, gy = sampan.meshgrid(sampan.arange(2), sampan.arange(3))``."""
    xs = _seq("meshgrid", tensors)
    if indexing not in ("ij", "xy"):
        raise op_error(SampanValueError, "meshgrid", f"indexing={indexing!r}", "'ij' or 'xy'")
    for x in xs:
        if x.ndim > 1:
            raise op_error(ShapeError, "meshgrid", f"a {x.ndim}-d tensor", "0-d or 1-d tensors")
    xs = [reshape(x, (-1,)) for x in xs]
    pos = list(range(len(xs)))
    if indexing == "xy" and len(xs) > 1:
        pos[0], pos[1] = 1, 0
    shape = [0] * len(xs)
    for x, p in zip(xs, pos):
        shape[p] = x.shape[0]
    out = []
    for x, p in zip(xs, pos):
        one = [1] * len(xs)
        one[p] = x.shape[0]
        out.append(expand(reshape(x, tuple(one)), tuple(shape)))
    return tuple(out)


def cartesian_prod(*tensors):
    """Every combination of the elements of 1-d tensors, one per row (``torch
    .cartesian_prod``); one tensor is returned as it is.
    Example: ``sampan.cartesian_prod(sampan.arange(2), sampan.arange(3))``."""
    xs = _seq("cartesian_prod", tensors)
    if len(xs) == 1:
        return xs[0]
    grids = meshgrid(*_promote(xs), indexing="ij")
    return stack([reshape(g, (-1,)) for g in grids], 1)


# ---------------------------------------------------------------------- stacking
def _atleast_list(n, xs):
    out = []
    for x in xs:
        s = tuple(x.shape)
        if len(s) < n:
            s = ((1,) * (n - len(s)) + s if n < 3 else {0: (1, 1, 1), 1: (1,) + s + (1,),
                                                        2: s + (1,)}[len(s)])
            x = reshape(x, s)
        out.append(x)
    return out


def _atleast(n, tensors):
    many = len(tensors) != 1 or isinstance(tensors[0], (list, tuple))
    out = _atleast_list(n, _seq(f"atleast_{n}d", tensors))
    return tuple(out) if many else out[0]


def atleast_1d(*tensors):
    """Each tensor with at least 1 dim (0-d -> (1,)); a tuple for several.
    Example: ``sampan.atleast_1d(sampan.tensor(1.0))``."""
    return _atleast(1, tensors)


def atleast_2d(*tensors):
    """Each tensor with at least 2 dims ((n,) -> (1, n)).
    Example: ``sampan.atleast_2d(sampan.arange(3))``."""
    return _atleast(2, tensors)


def atleast_3d(*tensors):
    """Each tensor with at least 3 dims ((n,) -> (1, n, 1), (m, n) -> (m, n, 1)).
    Example: ``sampan.atleast_3d(sampan.arange(3))``."""
    return _atleast(3, tensors)


def vstack(tensors):
    """Stack rows: concat along dim 0 after atleast_2d, as ``torch.vstack``.
    Example: ``sampan.vstack([sampan.arange(3), sampan.arange(3)])``."""
    return concat(_promote(_atleast_list(2, _seq("vstack", (tensors,)))), 0)


row_stack = vstack


def hstack(tensors):
    """Stack columns: concat along dim 1 (dim 0 for 1-d tensors), as ``torch.hstack``.
    Example: ``sampan.hstack([sampan.arange(3), sampan.arange(2)])``."""
    xs = _atleast_list(1, _seq("hstack", (tensors,)))
    return concat(_promote(xs), 0 if all(x.ndim == 1 for x in xs) else 1)


def dstack(tensors):
    """Stack along dim 2 after atleast_3d, as ``torch.dstack``.
    Example: ``sampan.dstack([sampan.ones(2, 3), sampan.ones(2, 3)])``."""
    return concat(_promote(_atleast_list(3, _seq("dstack", (tensors,)))), 2)


def column_stack(tensors):
    """1-d (and 0-d) tensors as columns, then concat along dim 1 (``torch.column_stack``).
    Example: ``sampan.column_stack([sampan.arange(3), sampan.arange(3)])``."""
    xs = [reshape(x, (x.numel(), 1)) if x.ndim <= 1 else x
          for x in _seq("column_stack", (tensors,))]
    return concat(_promote(xs), 1)


def block_diag(*tensors):
    """A block-diagonal matrix of 0-d, 1-d (a row) or 2-d tensors, as ``torch.block_diag``.
    Example: ``sampan.block_diag(sampan.ones(2, 2), sampan.ones(1, 3))``."""
    from .shape import pad
    xs = []
    for x in _promote(_seq("block_diag", tensors)):
        if x.ndim > 2:
            raise op_error(ShapeError, "block_diag", f"a {x.ndim}-d tensor",
                           "tensors of at most 2 dims")
        xs.append(reshape(x, (1, 1) if x.ndim == 0 else (1, x.shape[0]) if x.ndim == 1
                          else tuple(x.shape)))
    cols = sum(x.shape[1] for x in xs)
    out, c = [], 0
    for x in xs:
        out.append(pad(x, ((0, 0), (c, cols - c - x.shape[1]))))
        c += x.shape[1]
    return concat(out, 0)


# ---------------------------------------------------------------------- products, indices
def take(input, index):
    """Elements of the flattened input at `index` (negative counts from the end), in the
    index's shape, as ``torch.take``.
    Example: ``sampan.take(sampan.arange(6).reshape(2, 3), sampan.tensor([0, -1]))``."""
    from .index import index_select
    x, i = _t(input), _t(index)
    if i.dtype.kind not in "iu":
        from ..errors import DTypeError
        raise op_error(DTypeError, "take", f"index dtype {i.dtype}", "an integer dtype")
    flat = reshape(x, (-1,))
    n = flat.shape[0]
    fi = reshape(cast(i, "int64"), (-1,))
    fi = where(lt(fi, 0), add(fi, n), fi)
    return reshape(index_select(flat, fi, 0), tuple(i.shape))


def kron(input, other):
    """Kronecker product, as ``torch.kron``: the block of b scaled by each element of a.
    Example: ``sampan.kron(sampan.eye(2), sampan.ones(2, 2))``."""
    a, b = _t(input), _t(other)
    nd = max(a.ndim, b.ndim)
    sa = (1,) * (nd - a.ndim) + tuple(a.shape)
    sb = (1,) * (nd - b.ndim) + tuple(b.shape)
    ia = tuple(v for d in sa for v in (d, 1))
    ib = tuple(v for d in sb for v in (1, d))
    return reshape(mul(reshape(a, ia), reshape(b, ib)), tuple(p * q for p, q in zip(sa, sb)))


def cross(input, other, dim=None, *, axis=None):
    """Cross product of 3-vectors along `dim` (inputs broadcast), as ``torch.cross``;
    without dim, the first dim of size 3 (PyTorch's default, which it warns about).
    Example: ``sampan.cross(sampan.randn(4, 3), sampan.randn(4, 3), dim=1)``."""
    from ._util import broadcast_shapes
    dim = pick("cross", "dim", dim, "axis", axis)
    a, b = _t(input), _t(other)
    shape = broadcast_shapes("cross", a.shape, b.shape)
    a, b = expand(a, shape), expand(b, shape)
    if dim is None:
        dim = next((i for i, n in enumerate(shape) if n == 3), None)
        if dim is None:
            raise op_error(ShapeError, "cross", f"shape {tuple(shape)}", "a dim of size 3")
    d = _dim("cross", dim, len(shape))
    if shape[d] != 3:
        raise op_error(ShapeError, "cross", f"dim {dim} of size {shape[d]} in shapes "
                       f"{tuple(_t(input).shape)} and {tuple(_t(other).shape)}",
                       "a dim of size 3")
    pre = (slice(None),) * d
    ax = [getitem(a, pre + (i,)) for i in range(3)]
    bx = [getitem(b, pre + (i,)) for i in range(3)]
    c = [sub(mul(ax[(i + 1) % 3], bx[(i + 2) % 3]), mul(ax[(i + 2) % 3], bx[(i + 1) % 3]))
         for i in range(3)]
    return stack(c, d)


def trace(input):
    """Sum of the main diagonal of a matrix (integers sum as int64), as ``torch.trace``.
    Example: ``sampan.trace(sampan.eye(3))``."""
    from .reduce import sum as _sum
    x = _t(input)
    if x.ndim != 2:
        raise op_error(ShapeError, "trace", f"a {x.ndim}-d tensor", "a 2-d matrix")
    if not _dt.is_floating(x.dtype):
        x = cast(x, "int64")
    return _sum(diagonal(x))


def diag(input, diagonal=0):
    """``torch.diag``: a 1-d tensor -> the square matrix with it on the `diagonal`-th
    diagonal; a 2-d matrix -> its `diagonal`-th diagonal (a copy, as in PyTorch).
    Example: ``sampan.diag(sampan.arange(3))``."""
    from .shape import clone
    x = _t(input)
    if x.ndim == 1:
        return diag_embed(x, diagonal, 0, 1)
    if x.ndim == 2:
        return clone(_diagonal(x, diagonal, 0, 1))
    raise op_error(ShapeError, "diag", f"a {x.ndim}-d tensor", "a 1-d or 2-d tensor")


def _tri_indices(op, f, row, col, offset, dtype):
    if row < 0 or col < 0:
        raise op_error(SampanValueError, op, f"row={row}, col={col}", "sizes >= 0")
    d = _dt.as_dtype(dtype)
    if not _dt.is_integer(d):
        raise op_error(SampanValueError, op, f"dtype {d}", "an integer dtype")
    r, c = f(int(row), int(offset), int(col))
    return Tensor(np.stack([r, c]).astype(d).reshape(2, -1))


def triu_indices(row, col, offset=0, *, dtype="int64"):
    """Row and column indices (int64 [2, n], row-major) of the upper triangle of a row x
    col matrix from the `offset` diagonal on, as ``torch.triu_indices``.
    Example: ``sampan.triu_indices(3, 3, 1)``."""
    return _tri_indices("triu_indices", np.triu_indices, row, col, offset, dtype)


def tril_indices(row, col, offset=0, *, dtype="int64"):
    """Indices (int64 [2, n]) of the lower triangle, as ``torch.tril_indices``.
    Example: ``sampan.tril_indices(3, 3)``."""
    return _tri_indices("tril_indices", np.tril_indices, row, col, offset, dtype)
