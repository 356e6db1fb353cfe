"""The helpers of the decomposition family (`decomp.py`, `decomp_norms.py`,
`decomp_spectral.py`): dtype and shape checks, LAPACK errors named by op, FLOP counts,
matrix products and constants for gradient rules, sample matrices. Below all three, so
the parts need not import `decomp.py`, which re-exports them."""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import wrap


def _float(op, a):
    d = a.dtype
    if d not in (np.float32, np.float64):
        raise op_error(DTypeError, op, f"dtype {d}", "float32 or float64",
                       "cast with .float() or .double() first")
    return d


def _matrix(op, a, square=True):
    d = _float(op, a)
    if len(a.shape) < 2:
        raise op_error(ShapeError, op, f"shape {tuple(a.shape)}",
                       "a matrix or a batch of matrices (at least 2-d)")
    m, n = a.shape[-2], a.shape[-1]
    if square and isinstance(m, int) and isinstance(n, int) and m != n:
        raise op_error(ShapeError, op, f"shape {tuple(a.shape)}",
                       "square matrices (..., n, n)", f"got {m} x {n}")
    return d


def _lapack(op, what, f, *args, **kw):
    """Run a numpy.linalg kernel; a singular / not-positive-definite input becomes a sampan
    error naming the op (torch raises for these too)."""
    try:
        with np.errstate(all="ignore"):
            return f(*args, **kw)
    except np.linalg.LinAlgError as e:
        shape = tuple(args[0].shape)
        raise op_error(SampanValueError, op, f"a {shape} input that is not {what}",
                       f"{what} matrices", f"LAPACK said: {e}") from None


def _count(shape):
    n = 1
    for d in shape:
        n *= d if isinstance(d, int) else 1
    return n


def _cubic(a, *_, **__):
    """~n^3 flops per matrix (LU / Cholesky / QR / SVD all scale so)."""
    n = a.shape[-1] if isinstance(a.shape[-1], int) else 1
    m = a.shape[-2] if isinstance(a.shape[-2], int) else 1
    return int(_count(a.shape[:-2]) * 2 * m * n * min(m, n))


def _mT(x):
    from .shape import transpose
    return transpose(x, -2, -1)


def _mm(a, b):
    from .linalg import matmul
    return matmul(a, b)


def _const(a, like):
    return wrap(np.asarray(a, dtype=like.dtype))


def _eye(n, like):
    return _const(np.eye(n), like)


def _tri_mask(n, upper, like):
    """Gradient of a function of one triangle of a symmetric-read matrix: the symmetric
    gradient G maps to 2 G on the strict triangle read, G on the diagonal, 0 elsewhere."""
    m = np.tril(np.full((n, n), 2.0), -1) + np.eye(n)
    return _const(m.T if upper else m, like)


def _col(x):       # (..., k) -> (..., 1, k): scales columns
    from .shape import unsqueeze
    return unsqueeze(x, -2)


def _row(x):       # (..., k) -> (..., k, 1): scales rows
    from .shape import unsqueeze
    return unsqueeze(x, -1)


def _spd(r, *shape):
    """Symmetric positive definite float32 matrices (well conditioned)."""
    x = r.uniform(-1, 1, size=shape)
    n = shape[-1]
    return (x @ np.swapaxes(x, -1, -2) + n * np.eye(n)).astype(np.float32)


def _wellcond(r, *shape):
    return (r.uniform(-1, 1, size=shape) + 2.5 * np.eye(*shape[-2:])).astype(np.float32)
