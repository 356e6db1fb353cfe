"""The layout primitives of the op table: tril/triu, roll, diagonal/diag_embed and the
repeat index of repeat_interleave (one `defop` block each), with the dim helper the
layout composites share. `layout.py` exports them with the composites of `layout_mm.py`
and `layout_shape.py`, which build on them."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, randf, rng
from .registry import NO_ONNX, NOT_DIFFERENTIABLE, Spec, defop


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _zero_flops(*a, **k):
    return 0


def _dim(op, d, ndim):
    if not isinstance(d, (int, np.integer)) or not -ndim <= d < max(ndim, 1):
        raise op_error(ShapeError, op, f"dim {d} for a {ndim}-d tensor",
                       f"a dim in [{-ndim}, {ndim})")
    return int(d) % max(ndim, 1)


# ---------------------------------------------------------------------- tril / triu
def _tri_rule(name):
    def rule(x, diagonal=0):
        if len(x.shape) < 2:
            raise op_error(ShapeError, name, f"a {len(x.shape)}-d tensor",
                           "a tensor of at least 2 dims (matrices in the last two)")
        return Spec(tuple(x.shape), x.dtype)
    return rule


def _tri_samples(seed):
    def samples():
        r = rng(seed)
        return [Sample((randf(r, 3, 4),), {"diagonal": 0}),
                Sample((randf(r, 2, 3, 3),), {"diagonal": -1 if seed % 2 else 1})]
    return samples


TRIL = defop("tril", _tri_rule("tril"), kernel=lambda a, diagonal=0: np.tril(a, diagonal),
             grad=lambda g, y, x, diagonal=0: (apply(TRIL, (g,), {"diagonal": diagonal}),),
             saves=(), onnx="Trilu", flops=_zero_flops, samples=_tri_samples(310))
TRIU = defop("triu", _tri_rule("triu"), kernel=lambda a, diagonal=0: np.triu(a, diagonal),
             grad=lambda g, y, x, diagonal=0: (apply(TRIU, (g,), {"diagonal": diagonal}),),
             saves=(), onnx="Trilu", flops=_zero_flops, samples=_tri_samples(311))


def tril(input, diagonal=0):
    """The lower triangle of the matrices in the last two dims (above `diagonal` zeroed),
    as ``torch.tril``. Example: ``sampan.tril(x, diagonal=-1)``."""
    return apply(TRIL, (_t(input),), {"diagonal": int(diagonal)})


def triu(input, diagonal=0):
    """The upper triangle of the matrices in the last two dims, as ``torch.triu``.
    Example: ``sampan.triu(sampan.ones(3, 3), diagonal=1)``."""
    return apply(TRIU, (_t(input),), {"diagonal": int(diagonal)})


# ---------------------------------------------------------------------- roll
def _roll_rule(x, shifts, dims):
    nd = len(x.shape)
    if dims is None:
        if len(shifts) != 1:
            raise op_error(SampanValueError, "roll", f"shifts {shifts} without dims",
                           "one shift (the tensor is rolled flattened)")
    elif len(dims) != len(shifts) or any(not 0 <= d < nd for d in dims):
        raise op_error(ShapeError, "roll", f"shifts {shifts} and dims {dims} for a {nd}-d "
                       "tensor", "one shift per dim, dims within the tensor")
    return Spec(tuple(x.shape), x.dtype)


def _roll_kernel(a, shifts, dims):
    if dims is None:
        return np.roll(a, shifts[0])
    return np.roll(a, shifts, dims)


ROLL = defop("roll", _roll_rule, kernel=_roll_kernel, saves=(), onnx=NO_ONNX,
             grad=lambda g, y, x, shifts, dims: (apply(ROLL, (g,), {
                 "shifts": tuple(-s for s in shifts), "dims": dims}),),
             flops=_zero_flops,
             samples=lambda: [Sample((randf(rng(312), 3, 4),), {"shifts": (1, -2),
                                                                "dims": (0, 1)}),
                              Sample((randf(rng(313), 2, 3),), {"shifts": (2,), "dims": None})])


def roll(input, shifts, dims=None, *, axis=None):
    """Rotate elements along `dims` (numpy: `axis`) by `shifts` (ints or tuples); without
    dims the tensor is rolled flattened and reshaped back, as ``torch.roll``.
    Example: ``x.roll(1, 0)``."""
    from ._util import pick
    dims = pick("roll", "dims", dims, "axis", axis)
    x = _t(input)
    shifts = (int(shifts),) if isinstance(shifts, (int, np.integer)) else tuple(
        int(s) for s in shifts)
    if dims is not None:
        dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
        dims = tuple(_dim("roll", d, x.ndim) for d in dims)
    return apply(ROLL, (x,), {"shifts": shifts, "dims": dims})


# ---------------------------------------------------------------------- diagonal
def diag_len(n1, n2, offset):
    """The length of the `offset` diagonal of an n1 x n2 matrix."""
    if not (isinstance(n1, int) and isinstance(n2, int)):
        return n1 if (n1 == n2 and offset == 0) else f"diag({n1},{n2},{offset})"
    return max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))


def _diag_dims(op, nd, dim1, dim2):
    if not (0 <= dim1 < nd and 0 <= dim2 < nd) or dim1 == dim2:
        raise op_error(ShapeError, op, f"dim1={dim1}, dim2={dim2} for a {nd}-d tensor",
                       "two different dims of the tensor")


def _diagonal_rule(x, offset=0, dim1=0, dim2=1):
    nd = len(x.shape)
    if nd < 2:
        raise op_error(ShapeError, "diagonal", f"a {nd}-d tensor", "at least 2 dims")
    _diag_dims("diagonal", nd, dim1, dim2)
    rest = tuple(d for i, d in enumerate(x.shape) if i not in (dim1, dim2))
    return Spec(rest + (diag_len(x.shape[dim1], x.shape[dim2], offset),), x.dtype)


def _diagonal_kernel(a, offset=0, dim1=0, dim2=1):
    d = np.diagonal(a, offset, dim1, dim2)
    if a.flags.writeable:   # numpy's diagonal is read-only; torch's a writable view
        d.flags.writeable = True
    return d


def _embed_out_shape(xs, dim1, dim2, size):
    rest = list(xs[:-1])
    out = []
    for p in range(len(xs) + 1):
        out.append(size[0] if p == dim1 else size[1] if p == dim2 else rest.pop(0))
    return tuple(out)


def _embed_rule(x, offset=0, dim1=0, dim2=1, size=(0, 0)):
    nd = len(x.shape) + 1
    if nd < 2:
        raise op_error(ShapeError, "diag_embed", "a 0-d tensor", "at least 1 dim")
    _diag_dims("diag_embed", nd, dim1, dim2)
    n = diag_len(size[0], size[1], offset)
    if n != x.shape[-1]:
        raise op_error(ShapeError, "diag_embed", f"a last dim of {x.shape[-1]} for the "
                       f"offset {offset} diagonal of {size[0]} x {size[1]} matrices",
                       f"a last dim of {n}")
    return Spec(_embed_out_shape(tuple(x.shape), dim1, dim2, size), x.dtype)


def _embed_kernel(a, offset=0, dim1=0, dim2=1, size=(0, 0)):
    out = np.zeros(_embed_out_shape(a.shape, dim1, dim2, size), a.dtype)
    i = np.arange(a.shape[-1])
    view = np.moveaxis(out, (dim1, dim2), (-2, -1))
    view[..., i + max(-offset, 0), i + max(offset, 0)] = a
    return out


def _diagonal_unview(x, v, offset=0, dim1=0, dim2=1):
    """x with its diagonal replaced by v (an in-place write through the view), by ops."""
    from .creation import ones
    from .elementwise import where
    attrs = {"offset": offset, "dim1": dim1, "dim2": dim2,
             "size": (x.shape[dim1], x.shape[dim2])}
    mask = apply(DIAG_EMBED, (ones(tuple(v.shape), dtype="bool"),), attrs)
    return where(mask, apply(DIAG_EMBED, (v,), attrs), x)


DIAGONAL = defop(
    "diagonal", _diagonal_rule, kernel=_diagonal_kernel, view=True, saves=(),
    grad=lambda g, y, x, offset=0, dim1=0, dim2=1: (apply(DIAG_EMBED, (g,), {
        "offset": offset, "dim1": dim1, "dim2": dim2,
        "size": (x.shape[dim1], x.shape[dim2])}),),
    unview=_diagonal_unview, onnx=NO_ONNX, flops=_zero_flops,
    samples=lambda: [Sample((randf(rng(314), 3, 4),), {"offset": 1, "dim1": 0, "dim2": 1}),
                     Sample((randf(rng(315), 2, 3, 4),), {"offset": -1, "dim1": 2, "dim2": 1})])

DIAG_EMBED = defop(
    "diag_embed", _embed_rule, kernel=_embed_kernel, saves=(), onnx=NO_ONNX,
    grad=lambda g, y, x, offset=0, dim1=0, dim2=1, size=(0, 0): (apply(DIAGONAL, (g,), {
        "offset": offset, "dim1": dim1, "dim2": dim2}),),
    flops=_zero_flops,
    samples=lambda: [Sample((randf(rng(316), 2, 3),), {"offset": 0, "dim1": 1, "dim2": 2,
                                                       "size": (3, 3)}),
                     Sample((randf(rng(317), 3),), {"offset": -1, "dim1": 1, "dim2": 0,
                                                    "size": (4, 5)})])


def diagonal(input, offset=0, dim1=0, dim2=1):
    """The `offset` diagonal of the matrices in dims (dim1, dim2), appended as the last dim,
    as ``torch.diagonal``. It is a view, as in PyTorch: writing into it (``x.diagonal()
    .fill_(0)``) writes into x, and autograd records it on x's history.
    Example: ``sampan.arange(9.0).reshape(3, 3).diagonal(1)``."""
    x = _t(input)
    nd = x.ndim
    if nd < 2:
        raise op_error(ShapeError, "diagonal", f"a {nd}-d tensor", "at least 2 dims")
    return apply(DIAGONAL, (x,), {"offset": int(offset), "dim1": _dim("diagonal", dim1, nd),
                                  "dim2": _dim("diagonal", dim2, nd)})


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """Matrices whose `offset` diagonal (in output dims dim1, dim2) holds the last dim of
    `input`, zeros elsewhere, as ``torch.diag_embed``.
    Example: ``sampan.diag_embed(sampan.ones(2, 3))``."""
    x = _t(input)
    nd = x.ndim + 1
    n = x.shape[-1] + abs(int(offset)) if x.ndim else 1
    return apply(DIAG_EMBED, (x,), {"offset": int(offset), "dim1": _dim("diag_embed", dim1, nd),
                                    "dim2": _dim("diag_embed", dim2, nd), "size": (n, n)})


# ---------------------------------------------------------------------- repeat index
def _repeat_rule(r, output_size=None):
    if not (r.dtype.kind in "iu") or len(r.shape) != 1:
        raise op_error(DTypeError if len(r.shape) == 1 else ShapeError, "repeat_interleave",
                       f"repeats {r.dtype}{list(r.shape)}", "a 1-d integer tensor of counts")
    # the length is the sum of the counts: known from the data only (symbolic), unless
    # the caller gives it
    return Spec(("total",) if output_size is None else (int(output_size),),
                np.dtype(np.int64))


def _repeat_kernel(r, output_size=None):
    if r.size and r.min() < 0:
        raise op_error(SampanValueError, "repeat_interleave", f"a repeat count {r.min()}",
                       "counts >= 0")
    out = np.repeat(np.arange(r.shape[0], dtype=np.int64), r)
    if output_size is not None and out.shape[0] != output_size:
        raise op_error(SampanValueError, "repeat_interleave", f"counts summing to "
                       f"{out.shape[0]} with output_size={output_size}",
                       "output_size equal to the sum of the repeats")
    return out


REPEAT_INDEX = defop(
    "repeat_interleave", _repeat_rule, kernel=_repeat_kernel, grad=NOT_DIFFERENTIABLE,
    onnx=NO_ONNX, flops=_zero_flops,
    samples=lambda: [Sample((np.array([1, 0, 3], np.int64),), {}),
                     Sample((np.array([2, 2], np.int64),), {"output_size": 4})])


def repeat_index(repeats, output_size=None):
    """``torch.repeat_interleave(repeats)``: each position i repeated repeats[i] times.
    Example: ``repeat_index(sampan.tensor([1, 2]))``."""
    return apply(REPEAT_INDEX, (_t(repeats),), {"output_size": output_size})
