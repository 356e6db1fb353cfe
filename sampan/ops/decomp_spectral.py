"""(issue 17) svd, svdvals, eigh, eigvalsh: the spectral decompositions of `decomp.py`
(its docstring has the sign and gradient conventions). Imported by decomp.py."""
from __future__ import annotations

import numpy as np

from ..errors import SampanValueError, op_error
from ..tensor import apply
from ._util import Sample, rng
from ._decomp_base import _col, _cubic, _eye, _lapack, _matrix, _mm, _mT, _row, _tri_mask
from .registry import NO_ONNX, Spec, defop


def _sign_fix(u):
    """The sign that makes each column's entry of largest magnitude positive: a
    reproducible choice among the +-1 gauges of a singular vector or eigenvector."""
    idx = np.argmax(np.abs(u), axis=-2)[..., None, :]
    s = np.sign(np.take_along_axis(u, idx, axis=-2))[..., 0, :]
    s = np.where(s == 0, 1, s).astype(u.dtype)
    return s


# ---------------------------------------------------------------------- svd
def _svd_rule(a, full_matrices):
    d = _matrix("linalg.svd", a, square=False)
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n) if isinstance(m, int) and isinstance(n, int) else m
    b = tuple(a.shape[:-2])
    if full_matrices:
        return Spec(b + (m, m), d), Spec(b + (k,), d), Spec(b + (n, n), d)
    return Spec(b + (m, k), d), Spec(b + (k,), d), Spec(b + (k, n), d)


def _svd_kernel(a, full_matrices):
    m, n = a.shape[-2:]
    k = min(m, n)
    if a.size == 0:
        b = a.shape[:-2]
        eu, ev = (np.eye(m, dtype=a.dtype), np.eye(n, dtype=a.dtype))
        u = np.broadcast_to(eu, b + (m, m)) if full_matrices else np.zeros(b + (m, k), a.dtype)
        vh = np.broadcast_to(ev, b + (n, n)) if full_matrices else np.zeros(b + (k, n), a.dtype)
        return u.copy(), np.zeros(b + (k,), a.dtype), vh.copy()
    u, s, vh = _lapack("linalg.svd", "finite", np.linalg.svd, a, full_matrices=full_matrices)
    sg = _sign_fix(u[..., :k])
    u, vh = u.copy(), vh.copy()
    u[..., :k] *= sg[..., None, :]
    vh[..., :k, :] *= sg[..., :, None]
    return u, s.astype(a.dtype), vh


def _skew(x):
    from .elementwise import sub
    return sub(x, _mT(x))


def _svd_grad(g, y, a, full_matrices):
    from .elementwise import add, div, mul, sub
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    u, s, vh = y
    gu, gs, gvh = g
    if full_matrices:          # the extra columns are not unique: their gradient is dropped
        u, gu = u[..., :k], gu[..., :k]
        vh, gvh = vh[..., :k, :], gvh[..., :k, :]
    uhgu = _mm(_mT(u), gu)
    vhgv = _mm(vh, _mT(gvh))
    s2 = mul(s, s)
    e = add(sub(_col(s2), _row(s2)), _eye(k, a))        # E_jk = s_k^2 - s_j^2, 1 on diag
    inner = add(add(mul(div(_skew(uhgu), e), _col(s)), mul(_row(s), div(_skew(vhgv), e))),
                mul(_row(gs), _eye(k, a)))
    ga = _mm(_mm(u, inner), vh)
    if m > k:                  # (I - U U^T) gU S^-1 V^T
        ga = add(ga, _mm(div(sub(gu, _mm(u, uhgu)), _col(s)), vh))
    if n > k:                  # U S^-1 gV^T (I - V V^T)
        ga = add(ga, _mm(u, div(sub(gvh, _mm(_mT(vhgv), vh)), _row(s))))
    return (ga,)


def _svd_samples():
    return [Sample((rng(190).uniform(-1, 1, (4, 3)).astype(np.float32),),
                   {"full_matrices": False}),
            Sample((rng(191).uniform(-1, 1, (2, 3, 3)).astype(np.float32),),
                   {"full_matrices": True})]


SVD = defop("linalg_svd", _svd_rule, kernel=_svd_kernel, grad=_svd_grad, n_out=3, saves=(),
            save_output=True, flops=lambda a, full_matrices: 4 * _cubic(a), onnx=NO_ONNX,
            samples=_svd_samples, amp="float32")


class SVDResult(tuple):
    """(U, S, Vh), as torch.linalg.svd's named tuple."""
    __slots__ = ()

    def __new__(cls, U, S, Vh):
        return super().__new__(cls, (U, S, Vh))

    U = property(lambda self: self[0])
    S = property(lambda self: self[1])
    Vh = property(lambda self: self[2])


def svd(A, full_matrices=True):
    """A = U diag(S) Vh, batched, S descending (torch.linalg.svd; full_matrices=True
    by default, as torch). Example: ``U, S, Vh = sampan.linalg.svd(A, full_matrices=False)``."""
    return SVDResult(*apply(SVD, (A,), {"full_matrices": bool(full_matrices)}))


def _svdvals_kernel(a):
    if a.size == 0:
        return np.zeros(a.shape[:-2] + (min(a.shape[-2:]),), a.dtype)
    return _lapack("linalg.svdvals", "finite", np.linalg.svd, a, compute_uv=False).astype(
        a.dtype)


def _svdvals_grad(g, y, a):
    from .elementwise import mul
    u, _, vh = apply(SVD, (a,), {"full_matrices": False})
    return (_mm(mul(u, _col(g)), vh),)


SVDVALS = defop("linalg_svdvals", lambda a: _svd_rule(a, False)[1], kernel=_svdvals_kernel,
                grad=_svdvals_grad, saves=(0,), flops=lambda a: 2 * _cubic(a), onnx=NO_ONNX,
                samples=lambda: [Sample((rng(192).uniform(-1, 1, (3, 4)).astype(np.float32),)),
                                 Sample((rng(193).uniform(-1, 1, (2, 3, 3)).astype(
                                     np.float32),))], amp="float32")


def svdvals(A):
    """Singular values (descending), batched; its gradient U diag(g) Vh is defined for
    repeated values too. Example: ``sampan.linalg.svdvals(A)``."""
    return apply(SVDVALS, (A,), {})


# ---------------------------------------------------------------------- eigh
def _uplo(op, UPLO):
    if UPLO not in ("L", "U"):
        raise op_error(SampanValueError, op, f"UPLO={UPLO!r}", "'L' or 'U'")
    return UPLO == "U"


def _eigh_rule(a, UPLO):
    d = _matrix("linalg.eigh", a)
    _uplo("linalg.eigh", UPLO)
    return Spec(tuple(a.shape[:-1]), d), Spec(tuple(a.shape), d)


def _eigh_kernel(a, UPLO):
    if a.size == 0:
        return np.zeros(a.shape[:-1], a.dtype), np.zeros(a.shape, a.dtype)
    w, v = _lapack("linalg.eigh", "finite", np.linalg.eigh, a, UPLO=UPLO)
    v = v * _sign_fix(v)[..., None, :]
    return w.astype(a.dtype), v.astype(a.dtype)


def _eigh_grad(g, y, a, UPLO):
    from .elementwise import add, div, mul, sub
    n = a.shape[-1]
    w, v = y
    gw, gv = g
    vhgv = _mm(_mT(v), gv)
    e = add(sub(_col(w), _row(w)), _eye(n, a))           # E_ij = w_j - w_i, 1 on diag
    inner = add(mul(div(_skew(vhgv), e), 0.5), mul(_row(gw), _eye(n, a)))
    ga = _mm(_mm(v, inner), _mT(v))
    return (mul(ga, _tri_mask(n, UPLO == "U", a)),)


def _sym(r, *shape):
    x = r.uniform(-1, 1, size=shape)
    return (x + np.swapaxes(x, -1, -2)).astype(np.float32)


EIGH = defop("linalg_eigh", _eigh_rule, kernel=_eigh_kernel, grad=_eigh_grad, n_out=2,
             saves=(), save_output=True, flops=lambda a, UPLO: 3 * _cubic(a), onnx=NO_ONNX,
             samples=lambda: [Sample((_sym(rng(194), 3, 3),), {"UPLO": "L"}),
                              Sample((_sym(rng(195), 2, 3, 3),), {"UPLO": "U"})], amp="float32")


class EighResult(tuple):
    """(eigenvalues, eigenvectors), as torch.linalg.eigh's named tuple."""
    __slots__ = ()

    def __new__(cls, eigenvalues, eigenvectors):
        return super().__new__(cls, (eigenvalues, eigenvectors))

    eigenvalues = property(lambda self: self[0])
    eigenvectors = property(lambda self: self[1])


def eigh(A, UPLO="L"):
    """Eigenvalues (ascending) and orthonormal eigenvectors of symmetric matrices, batched,
    reading the UPLO triangle. Example: ``w, V = sampan.linalg.eigh(A)``."""
    return EighResult(*apply(EIGH, (A,), {"UPLO": UPLO}))


def _eigvalsh_grad(g, y, a, UPLO):
    from .elementwise import mul
    _, v = apply(EIGH, (a,), {"UPLO": UPLO})
    ga = _mm(mul(v, _col(g)), _mT(v))
    return (mul(ga, _tri_mask(a.shape[-1], UPLO == "U", a)),)


EIGVALSH = defop("linalg_eigvalsh", lambda a, UPLO: _eigh_rule(a, UPLO)[0],
                 kernel=lambda a, UPLO: _eigh_kernel(a, UPLO)[0], grad=_eigvalsh_grad,
                 saves=(0,), flops=lambda a, UPLO: _cubic(a), onnx=NO_ONNX,
                 samples=lambda: [Sample((_sym(rng(196), 3, 3),), {"UPLO": "L"}),
                                  Sample((_sym(rng(197), 2, 3, 3),), {"UPLO": "U"})], amp="float32")


def eigvalsh(A, UPLO="L"):
    """Eigenvalues (ascending) of symmetric matrices, batched; the gradient V diag(g) V^T
    is defined for repeated values too. Example: ``sampan.linalg.eigvalsh(A)``."""
    return apply(EIGVALSH, (A,), {"UPLO": UPLO})

