"""The matrix products PyTorch users type (mm, bmm, mv, dot, inner, outer, addmm …): each
checks the shapes its PyTorch namesake requires (no broadcasting where torch has none) and
is a composite over matmul, einsum or mul, so it needs no kernel or gradient of its own."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, op_error
from ..tensor import Tensor
from .elementwise import add, mul, operands
from .linalg import matmul
from .shape import reshape


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _want(op, xs, ndims, what):
    if xs[0].dtype == np.bool_:       # as PyTorch: a product of bools is not defined
        raise op_error(DTypeError, op, "bool tensors", "numeric tensors (cast them first)")
    for x, n in zip(xs, ndims):
        if x.ndim != n:
            raise op_error(ShapeError, op, "shapes " + " and ".join(str(tuple(v.shape))
                                                                    for v in xs), what)


def _inner_match(op, a, b, da, db):
    if a.shape[da] != b.shape[db]:
        raise op_error(ShapeError, op, f"shapes {tuple(a.shape)} and {tuple(b.shape)}",
                       f"dim {da} of the first equal to dim {db} of the second "
                       f"(got {a.shape[da]} and {b.shape[db]})")


def mm(input, mat2):
    """Matrix product of two 2-d tensors (no broadcasting), as ``torch.mm``; integer
    matrices give integer products. Example: ``a.mm(b)``."""
    a, b = operands(_t(input), _t(mat2))
    _want("mm", (a, b), (2, 2), "two 2-d tensors (matmul broadcasts batches)")
    _inner_match("mm", a, b, 1, 0)
    return matmul(a, b)


def bmm(input, mat2):
    """Batched matrix product of (b, n, m) and (b, m, p) (no broadcasting), as
    ``torch.bmm``. Example: ``sampan.bmm(sampan.ones(2, 3, 4), sampan.ones(2, 4, 5))``."""
    a, b = operands(_t(input), _t(mat2))
    _want("bmm", (a, b), (3, 3), "two 3-d tensors (b, n, m) and (b, m, p)")
    if a.shape[0] != b.shape[0]:
        raise op_error(ShapeError, "bmm", f"shapes {tuple(a.shape)} and {tuple(b.shape)}",
                       "equal batch sizes (bmm does not broadcast; matmul does)")
    _inner_match("bmm", a, b, 2, 1)
    return matmul(a, b)


def mv(input, vec):
    """Matrix-vector product (n, m) x (m,) -> (n,), as ``torch.mv``.
    Example: ``sampan.mv(sampan.ones(2, 3), sampan.ones(3))``."""
    a, v = operands(_t(input), _t(vec))
    _want("mv", (a, v), (2, 1), "a 2-d matrix and a 1-d vector")
    _inner_match("mv", a, v, 1, 0)
    return matmul(a, v)


def dot(input, other):
    """Inner product of two 1-d tensors of one length (a 0-d result), as ``torch.dot``.
    Example: ``sampan.dot(sampan.ones(3), sampan.ones(3))``."""
    a, b = operands(_t(input), _t(other))
    _want("dot", (a, b), (1, 1), "two 1-d tensors")
    _inner_match("dot", a, b, 0, 0)
    return matmul(a, b)


def vdot(input, other):
    """``torch.vdot``: the dot product with the first operand conjugated; sampan has no
    complex dtypes, so it equals `dot`. Example: ``sampan.vdot(sampan.ones(3), sampan.ones(3))``."""
    return dot(input, other)


def inner(input, other):
    """Sum of products over the last dims: shape a.shape[:-1] + b.shape[:-1] (a 0-d operand
    multiplies), as ``torch.inner``.
    Example: ``sampan.inner(sampan.ones(2, 3), sampan.ones(4, 3))``."""
    from .einsum import tensordot
    a, b = operands(_t(input), _t(other))
    if a.ndim == 0 or b.ndim == 0:
        return mul(a, b)
    _inner_match("inner", a, b, -1, -1)
    return tensordot(a, b, ([-1], [-1]))


def outer(input, vec2):
    """Outer product of two 1-d tensors: (n,) x (m,) -> (n, m), as ``torch.outer``.
    Example: ``sampan.outer(sampan.arange(3), sampan.arange(4))``."""
    a, b = operands(_t(input), _t(vec2))
    _want("outer", (a, b), (1, 1), "two 1-d tensors")
    return mul(reshape(a, (a.shape[0], 1)), reshape(b, (1, b.shape[0])))


ger = outer


def _scaled_sum(op, input, prod, beta, alpha):
    """beta * input + alpha * prod, with input broadcast to prod's shape (never beyond) and
    ignored when beta is 0 (so its NaNs do not spread), as PyTorch's add* ops."""
    from ._util import broadcast_shapes
    x = _t(input)
    if tuple(broadcast_shapes(op, x.shape, prod.shape)) != tuple(prod.shape):
        raise op_error(ShapeError, op, f"an input of shape {tuple(x.shape)} for a product of "
                       f"shape {tuple(prod.shape)}", "an input that broadcasts to the product")
    p = prod if alpha == 1 else mul(prod, alpha)
    if beta == 0:
        return p
    return add(x if beta == 1 else mul(x, beta), p)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2), as ``torch.addmm``.
    Example: ``sampan.addmm(sampan.zeros(2, 4), sampan.ones(2, 3), sampan.ones(3, 4), alpha=2)``."""
    return _scaled_sum("addmm", input, mm(mat1, mat2), beta, alpha)


def addmv(input, mat, vec, *, beta=1, alpha=1):
    """beta * input + alpha * (mat @ vec), as ``torch.addmv``.
    Example: ``sampan.addmv(sampan.zeros(2), sampan.ones(2, 3), sampan.ones(3))``."""
    return _scaled_sum("addmv", input, mv(mat, vec), beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """beta * input + alpha * bmm(batch1, batch2), as ``torch.baddbmm``.
    Example: ``sampan.baddbmm(sampan.zeros(1, 5), sampan.ones(2, 1, 4), sampan.ones(2, 4, 5))``."""
    return _scaled_sum("baddbmm", input, bmm(batch1, batch2), beta, alpha)


def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """beta * input + alpha * (the sum over the batch of batch1[i] @ batch2[i]), as
    ``torch.addbmm``: one contraction (einsum), no (b, n, p) intermediate.
    Example: ``sampan.addbmm(sampan.zeros(3, 5), sampan.ones(2, 3, 4), sampan.ones(2, 4, 5))``."""
    from .einsum import einsum
    a, b = operands(_t(batch1), _t(batch2))
    _want("addbmm", (a, b), (3, 3), "two 3-d tensors (b, n, m) and (b, m, p)")
    if a.shape[0] != b.shape[0]:
        raise op_error(ShapeError, "addbmm", f"shapes {tuple(a.shape)} and {tuple(b.shape)}",
                       "equal batch sizes")
    _inner_match("addbmm", a, b, 2, 1)
    return _scaled_sum("addbmm", input, einsum("bij,bjk->ik", a, b), beta, alpha)
