"""(issue 17) Matrix decompositions, inverses and solves: one block per op (rule, numpy/LAPACK
kernel batched over leading dims, gradient rule written with ops, FLOPs, ONNX mapping,
samples). `EXPORTS` lists the functions exported as `sampan.<name>`, `METHODS` the Tensor
methods and `INPLACE` the in-place methods, both bound by `sampan/_tensor_methods.py`.

Conventions where PyTorch leaves a freedom:
- qr, svd and eigh return sign-normalised factors (diag(R) >= 0; the largest-magnitude
  entry of each singular vector / eigenvector column positive), so results are
  reproducible; they differ from torch's only by those signs.
- cholesky, eigh and eigvalsh read one triangle (as LAPACK and torch do), and their
  gradient is the exact gradient of that function: nonzero on the triangle read only
  (off-diagonal entries doubled). Torch returns the symmetrised gradient instead; for a
  symmetric input built from other tensors (A = X X^T, A = (B + B^T) / 2 ...) both give
  the same gradient upstream.
- svd and eigh gradients use the standard F-matrix formulas, which divide by
  differences of singular values (eigenvalues): repeated values give inf/nan, as torch.
"""
from __future__ import annotations

import numpy as np

from ..errors import AutogradError, DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import apply
from ._decomp_base import (_col, _const, _cubic, _lapack, _matrix, _mm, _mT, _row, _spd,
                           _tri_mask, _wellcond)
from ._util import Sample, broadcast_shapes, rng, unbroadcast
from .registry import NO_ONNX, Spec, defop

EXPORTS: list = []
METHODS: dict = {}
INPLACE: dict = {}   # e.g. {"masked_fill_": masked_fill}: see _tensor_methods


# ---------------------------------------------------------------------- inv
def _inv_grad(g, y, a):
    yt = _mT(y)
    return (-_mm(_mm(yt, g), yt),)


INV = defop("linalg_inv", lambda a: Spec(tuple(a.shape), _matrix("linalg.inv", a)),
            kernel=lambda a: _lapack("linalg.inv", "invertible", np.linalg.inv, a),
            grad=_inv_grad, saves=(), save_output=True, flops=_cubic, onnx=NO_ONNX,
            samples=lambda: [Sample((_wellcond(rng(170), 3, 3),)),
                             Sample((_wellcond(rng(171), 2, 3, 3),))], amp="float32")


def inv(A):
    """The inverse of a square matrix (batched); a singular input raises.
    Example: ``sampan.linalg.inv(A) @ A``."""
    return apply(INV, (A,), {})


# ---------------------------------------------------------------------- det, slogdet
def _det_grad(g, y, a):
    """g * cofactor(A), the cofactors through the SVD so that a singular A has its (finite)
    gradient too, as torch: cof(A) = det(U) det(Vh) U diag(prod_{j != i} s_j) Vh."""
    from .elementwise import mul, where
    from .reduce import prod
    n = a.shape[-1]
    u, s, vh = svd(a, full_matrices=False)
    eye = _const(np.eye(n), a) > 0.5
    others = prod(where(eye, 1.0, _col(s)), -1)            # prod_{j != i} s_j
    sign = mul(det(u), det(vh)).detach()                    # +-1, locally constant
    cof = _mm(mul(u, _col(others)), vh)
    return (mul(_row(_row(mul(g, sign))), cof),)


DET = defop("linalg_det", lambda a: Spec(tuple(a.shape[:-2]), _matrix("linalg.det", a)),
            kernel=lambda a: np.asarray(np.linalg.det(a), dtype=a.dtype), grad=_det_grad,
            saves=(0,), flops=_cubic, onnx="Det",
            samples=lambda: [Sample((_wellcond(rng(172), 3, 3),)),
                             Sample((_wellcond(rng(173), 2, 3, 3) - 1.5,))], amp="float32")


def det(A):
    """Determinant (batched); its gradient (the cofactor matrix) is finite for a singular A
    too. Example: ``sampan.linalg.det(A)``."""
    return apply(DET, (A,), {})


def _slogdet_rule(a):
    d = _matrix("linalg.slogdet", a)
    return Spec(tuple(a.shape[:-2]), d), Spec(tuple(a.shape[:-2]), d)


def _slogdet_kernel(a):
    sign, logabs = np.linalg.slogdet(a)
    return np.asarray(sign, dtype=a.dtype), np.asarray(logabs, dtype=a.dtype)


def _slogdet_grad(g, y, a):
    from .elementwise import mul
    return (mul(_row(_row(g[1])), _mT(inv(a))),)


SLOGDET = defop("linalg_slogdet", _slogdet_rule, kernel=_slogdet_kernel, grad=_slogdet_grad,
                n_out=2, saves=(0,), flops=_cubic, onnx=NO_ONNX,
                samples=lambda: [Sample((_wellcond(rng(174), 3, 3) - 1.5,)),
                                 Sample((_wellcond(rng(175), 2, 3, 3),))], amp="float32")


class SlogdetResult(tuple):
    """(sign, logabsdet), as torch.linalg.slogdet's named tuple."""
    __slots__ = ()

    def __new__(cls, sign, logabsdet):
        return super().__new__(cls, (sign, logabsdet))

    sign = property(lambda self: self[0])
    logabsdet = property(lambda self: self[1])


def slogdet(A):
    """(sign, log|det|) of square matrices (batched): ``sign, logabs = slogdet(A)``."""
    return SlogdetResult(*apply(SLOGDET, (A,), {}))


# ---------------------------------------------------------------------- solve
def _solve_rule(a, b):
    d = _matrix("linalg.solve", a)
    if b.dtype != d:
        raise op_error(DTypeError, "linalg.solve", f"dtypes {a.dtype} and {b.dtype}",
                       "A and B of one dtype")
    if len(b.shape) < 2 or b.shape[-2] != a.shape[-1]:
        raise op_error(ShapeError, "linalg.solve", f"A {tuple(a.shape)} and B {tuple(b.shape)}",
                       "B of shape (..., n, k) for A (..., n, n) (or (..., n) vectors)")
    batch = broadcast_shapes("linalg.solve", a.shape[:-2], b.shape[:-2])
    return Spec(tuple(batch) + tuple(b.shape[-2:]), d)


def _solve_kernel(a, b):
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    return _lapack("linalg.solve", "invertible", np.linalg.solve, a, b)


def _solve_grad(g, y, a, b):
    gb = apply(SOLVE, (_mT(a), g), {})
    ga = unbroadcast(-_mm(gb, _mT(y)), a.shape) if a.requires_grad else None
    return ga, unbroadcast(gb, b.shape) if b.requires_grad else None


SOLVE = defop("linalg_solve", _solve_rule, kernel=_solve_kernel, grad=_solve_grad,
              saves=(0,), save_output=True, flops=_cubic, onnx=NO_ONNX,
              samples=lambda: [Sample((_wellcond(rng(176), 3, 3),
                                       rng(177).uniform(-1, 1, (3, 2)).astype(np.float32))),
                               Sample((_wellcond(rng(178), 2, 3, 3),
                                       rng(179).uniform(-1, 1, (3, 1)).astype(np.float32)))],
              amp="float32")


def solve(A, B, *, left=True):
    """X with A X = B (left=True) or X A = B (left=False), batched; B is a batch of vectors
    when it is 1-d or has A's shape without its last dim (torch's rule).
    Example: ``x = sampan.linalg.solve(A, b)``."""
    from .elementwise import operands
    from .shape import squeeze, unsqueeze
    A, B = operands(A, B)
    if A.ndim < 2:
        _matrix("linalg.solve", A)
    if not left:
        return _mT(solve(_mT(A), _mT(B)))
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    if vector:
        if B.shape[-1] != A.shape[-1]:
            raise op_error(ShapeError, "linalg.solve", f"A {tuple(A.shape)} and a vector b "
                           f"{tuple(B.shape)}", f"b of length {A.shape[-1]}")
        return squeeze(apply(SOLVE, (A, unsqueeze(B, -1)), {}), -1)
    return apply(SOLVE, (A, B), {})


# ---------------------------------------------------------------------- cholesky
def _chol_kernel(a, upper):
    L = _lapack("linalg.cholesky", "symmetric positive-definite", np.linalg.cholesky,
                np.swapaxes(a, -1, -2) if upper else a)
    return np.ascontiguousarray(np.swapaxes(L, -1, -2)) if upper else L


def _chol_grad(g, y, a, upper):
    from .elementwise import add, mul
    n = a.shape[-1]
    L, gL = (_mT(y), _mT(g)) if upper else (y, g)
    phi = _const(np.tril(np.ones((n, n))) - 0.5 * np.eye(n), a)
    linv = inv(L)
    s = _mm(_mm(_mT(linv), mul(_mm(_mT(L), gL), phi)), linv)
    sym = mul(add(s, _mT(s)), 0.5)
    return (mul(sym, _tri_mask(n, upper, a)),)


CHOLESKY = defop("linalg_cholesky",
                 lambda a, upper: Spec(tuple(a.shape), _matrix("linalg.cholesky", a)),
                 kernel=_chol_kernel, grad=_chol_grad, saves=(), save_output=True,
                 flops=lambda a, upper: _cubic(a) // 6, onnx=NO_ONNX,
                 samples=lambda: [Sample((_spd(rng(180), 3, 3),), {"upper": False}),
                                  Sample((_spd(rng(181), 2, 3, 3),), {"upper": True})],
                 amp="float32")


def cholesky(A, *, upper=False):
    """L with A = L L^T (upper=True: U with A = U^T U), batched; reads the lower (upper)
    triangle; a matrix that is not positive definite raises.
    Example: ``L = sampan.linalg.cholesky(A)``."""
    return apply(CHOLESKY, (A,), {"upper": bool(upper)})


# ---------------------------------------------------------------------- qr
def _qr_rule(a, mode):
    d = _matrix("linalg.qr", a, square=False)
    if mode not in ("reduced", "complete"):
        raise op_error(SampanValueError, "linalg.qr", f"mode={mode!r}",
                       "'reduced', 'complete' or 'r'")
    m, n = a.shape[-2], a.shape[-1]
    k = m if mode == "complete" or not (isinstance(m, int) and isinstance(n, int)) \
        else min(m, n)
    b = tuple(a.shape[:-2])
    return Spec(b + (m, k), d), Spec(b + (k, n), d)


def _qr_kernel(a, mode):
    q, r = np.linalg.qr(a, mode=mode)
    k = min(a.shape[-2], a.shape[-1])
    s = np.sign(np.diagonal(r, axis1=-2, axis2=-1)[..., :k])
    s = np.where(s == 0, 1, s).astype(a.dtype)
    q = q.copy()
    r = r.copy()
    q[..., :k] *= s[..., None, :]
    r[..., :k, :] *= s[..., :, None]
    return q, r


def _qr_grad_tall(gq, gr, q, r, a):
    """gA = [gQ + Q copyltu(M)] R^-T with M = R gR^T - gQ^T Q (m >= n, reduced)."""
    from .elementwise import add, mul, sub
    n = r.shape[-1]
    mm = sub(_mm(r, _mT(gr)), _mm(_mT(gq), q))
    low = _const(np.tril(np.ones((n, n))), a)
    strict = _const(np.tril(np.ones((n, n)), -1), a)
    copyltu = add(mul(mm, low), _mT(mul(mm, strict)))
    return _mm(add(gq, _mm(q, copyltu)), _mT(inv(r)))


def _qr_grad(g, y, a, mode):
    from .elementwise import add
    from .shape import concat
    m, n = a.shape[-2], a.shape[-1]
    if mode == "complete" and m > n:
        raise op_error(AutogradError, "linalg.qr", f"the gradient of a {m} x {n} QR in mode "
                       "'complete'", "mode 'reduced' for a tall input (or m <= n)",
                       "the complete Q of a tall matrix is not unique (torch raises too)")
    q, r = y
    gq, gr = g
    if m >= n:
        return (_qr_grad_tall(gq, gr, q, r, a),)
    # wide: A = [X | Y] with X = Q R_X square and R = [R_X | Q^T Y]
    gv = gr[..., :, m:]
    gy = _mm(q, gv)
    gx = _qr_grad_tall(add(gq, _mm(a[..., :, m:], _mT(gv))), gr[..., :, :m], q,
                       r[..., :, :m], a)
    return (concat([gx, gy], -1),)


QR = defop("linalg_qr", _qr_rule, kernel=_qr_kernel, grad=_qr_grad, n_out=2, saves=(),
           save_output=True, flops=lambda a, mode: _cubic(a), onnx=NO_ONNX,
           samples=lambda: [Sample((rng(182).uniform(-1, 1, (4, 3)).astype(np.float32),),
                                   {"mode": "reduced"}),
                            Sample((_wellcond(rng(183), 2, 3, 4),), {"mode": "complete"})],
           amp="float32")


class QRResult(tuple):
    """(Q, R), as torch.linalg.qr's named tuple."""
    __slots__ = ()

    def __new__(cls, Q, R):
        return super().__new__(cls, (Q, R))

    Q = property(lambda self: self[0])
    R = property(lambda self: self[1])


def qr(A, mode="reduced"):
    """A = Q R with orthonormal Q and upper-triangular R (diag(R) >= 0), batched; mode
    "reduced", "complete" or "r" (R only, Q empty as in torch).
    Example: ``Q, R = sampan.linalg.qr(A)``."""
    if mode == "r":
        from .creation import zeros
        return QRResult(zeros((0,), dtype=A.dtype), apply(QR, (A,), {"mode": "reduced"})[1])
    q, r = apply(QR, (A,), {"mode": mode})
    return QRResult(q, r)


# ---------------------------------------------------------------------- the rest of the family
from . import composite as _composite  # noqa: E402
from . import random as _random  # noqa: E402
from .decomp_norms import (COMPOSITES_HERE, cdist, cosine_similarity,  # noqa: E402,F401
                           linalg_norm, logdet, matrix_norm, norm, pairwise_distance, pdist,
                           vector_norm)
from .decomp_spectral import eigh, eigvalsh, svd, svdvals  # noqa: E402,F401
from .random import (bernoulli, get_rng_state, initial_seed, multinomial,  # noqa: E402,F401
                     poisson, seed, set_rng_state)

_composite.COMPOSITES.update(COMPOSITES_HERE)


def inverse(input):
    """torch.inverse: ``sampan.inverse(A)`` is sampan.linalg.inv(A)."""
    return inv(input)


EXPORTS += ["norm", "det", "inverse", "cholesky", "slogdet", "logdet", "cdist", "cosine_similarity",
            "pairwise_distance", "pdist"]
EXPORTS += _random.EXPORTS_17
METHODS.update({"norm": norm, "det": det, "inverse": inverse, "slogdet": slogdet,
                "logdet": logdet, "cholesky": cholesky})
INPLACE.update(_random.INPLACE_17)
