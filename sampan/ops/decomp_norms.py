"""(issue 17) Norms and distances as composites over the op table (their gradients come
from the primitives): vector_norm, matrix_norm, linalg.norm, torch.norm's `norm`, cdist,
cosine_similarity, pairwise_distance, pdist. Imported by decomp.py, which exports them.

Where a norm is 0 its gradient is 0 (torch's subgradient), not the 0/0 of d sqrt(s)."""
from __future__ import annotations

import math

import numpy as np

from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ..tensor import Tensor, apply
from ._decomp_base import _matrix
from ._util import Sample, broadcast_shapes, norm_axis, pick, randf, rng
from .registry import get_op


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x))


def _root(s, p):
    """s ** (1/p) with gradient 0 where s == 0 (s >= 0)."""
    from .elementwise import gt, pow, sqrt, where
    pos = gt(s, 0.0)
    safe = where(pos, s, 1.0)
    r = sqrt(safe) if p == 2 else pow(safe, 1.0 / p)
    return where(pos, r, 0.0)


def _dims(x, dim, op):
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        dim = None
    return norm_axis(dim, x.ndim, op)


def _float_input(op, x, dtype):
    from .. import dtypes as _dt
    from .elementwise import cast
    if dtype is not None:
        x = cast(x, _dt.as_dtype(dtype))
    if not _dt.is_floating(x.dtype):
        raise op_error(DTypeError, op, f"dtype {x.dtype}", "a floating dtype",
                       "cast with .float() first, or pass dtype=")
    return x


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):
    """(sum |x|^ord)^(1/ord) over `dim` (None: all elements); ord inf/-inf give max/min |x|,
    0 the count of nonzeros. Example: ``sampan.linalg.vector_norm(x, 2, dim=-1)``."""
    from .elementwise import abs as _abs
    from .elementwise import cast, mul, ne, pow
    from .reduce import amax, amin, sum
    op = "linalg.vector_norm"
    dim = pick(op, "dim", dim, "axis", axis)
    keepdim = bool(pick(op, "keepdim", keepdim or None, "keepdims", keepdims, False))
    x = _float_input(op, _t(x), dtype)
    axes = _dims(x, dim, op)
    if isinstance(ord, str) or not isinstance(ord, (int, float)):
        raise op_error(SampanValueError, op, f"ord={ord!r}", "a number (inf, -inf, 0, p)")
    a = _abs(x)
    if ord == math.inf:
        return amax(a, axes, keepdims=keepdim)
    if ord == -math.inf:
        return amin(a, axes, keepdims=keepdim)
    if ord == 0:
        return sum(cast(ne(x, 0.0), x.dtype), axes, keepdims=keepdim)
    if ord == 1:
        return sum(a, axes, keepdims=keepdim)
    if ord == 2:
        return _root(sum(mul(x, x), axes, keepdims=keepdim), 2)
    # |x|^p of a zero is computed on a stand-in 1 and put back as 0 (inf for p < 0): its
    # gradient is 0 there, as torch's, not g * p 0^(p-1) * sign(0) = inf * 0 = nan for
    # p < 1 (and no branch holds an inf that double backward would meet)
    from .elementwise import gt, where
    nz = gt(a, 0.0)
    ap = pow(where(nz, a, 1.0), float(ord))
    ap = where(nz, ap, 0.0 if ord > 0 else math.inf)
    return _root(sum(ap, axes, keepdims=keepdim), float(ord))


def _move_last(x, d0, d1):
    """x with dims d0, d1 moved to the end (in that order)."""
    from .shape import permute
    rest = [i for i in range(x.ndim) if i not in (d0, d1)]
    order = rest + [d0, d1]
    return x if order == list(range(x.ndim)) else permute(x, *order)


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    """Matrix norms over the two dims `dim`: 'fro', 'nuc', 2/-2 (largest/smallest singular
    value), 1/-1 (max/min column abs sum), inf/-inf (max/min row abs sum).
    Example: ``sampan.linalg.matrix_norm(A, "nuc")``."""
    from .decomp_spectral import svdvals
    from .elementwise import abs as _abs
    from .reduce import amax, amin, sum
    from .shape import unsqueeze
    op = "linalg.matrix_norm"
    A = _float_input(op, _t(A), dtype)
    if A.ndim < 2:
        raise op_error(ShapeError, op, f"shape {tuple(A.shape)}", "at least a 2-d input")
    d = tuple(dim) if isinstance(dim, (list, tuple)) else ()
    if len(d) != 2:
        raise op_error(SampanValueError, op, f"dim={dim!r}", "a 2-tuple of dims")
    d0, d1 = (norm_axis(i, A.ndim, op)[0] for i in d)
    if d0 == d1:
        raise op_error(SampanValueError, op, f"dim={dim!r}", "two different dims")
    if ord == "fro":
        return vector_norm(A, 2, (d0, d1), keepdim)
    if ord in ("nuc", 2, -2):
        s = svdvals(_move_last(A, d0, d1))
        r = sum(s, -1) if ord == "nuc" else amax(s, -1) if ord == 2 else amin(s, -1)
        if keepdim:
            for i in sorted((d0, d1)):
                r = unsqueeze(r, i)
        return r
    if ord in (1, -1, math.inf, -math.inf):
        inner, outer = (d0, d1) if ord in (1, -1) else (d1, d0)
        sums = sum(_abs(A), inner, keepdims=True)
        r = (amax if ord > 0 else amin)(sums, outer, keepdims=True)
        if keepdim:
            return r
        from .shape import squeeze
        return squeeze(r, tuple(sorted((d0, d1))))
    raise op_error(SampanValueError, op, f"ord={ord!r}",
                   "'fro', 'nuc', inf, -inf, 1, -1, 2 or -2")


def linalg_norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.norm: a vector norm over one dim (or all, when ord and dim are None),
    a matrix norm over two. Example: ``sampan.linalg.norm(A, "fro")``."""
    A = _t(A)
    if isinstance(dim, int) or (isinstance(dim, (list, tuple)) and len(dim) == 1):
        return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)
    if dim is not None:
        return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim, dtype=dtype)
    if ord is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if A.ndim == 1:
        return vector_norm(A, ord, None, keepdim, dtype=dtype)
    if A.ndim == 2:
        return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
    raise op_error(ShapeError, "linalg.norm", f"ord={ord!r} with dim=None on a {A.ndim}-d "
                   "input", "a 1-d or 2-d input, or dim=")


def norm(input, p="fro", dim=None, keepdim=False, dtype=None, *, axis=None, keepdims=None):
    """torch.norm: p='fro' (2-norm over `dim`, all elements when None), 'nuc', or a number
    (a vector norm over `dim`). Example: ``sampan.norm(x, dim=1)``; also ``x.norm()``."""
    x = _t(input)
    dim = pick("norm", "dim", dim, "axis", axis)
    keepdim = bool(pick("norm", "keepdim", keepdim or None, "keepdims", keepdims, False))
    if isinstance(dim, int):
        dim = (dim,)
    if isinstance(p, str):
        if p == "fro" and (dim is None or len(dim) <= 2):
            return vector_norm(x, 2, dim, keepdim, dtype=dtype)
        return matrix_norm(x, p, tuple(range(x.ndim)) if dim is None else dim, keepdim,
                           dtype=dtype)
    return vector_norm(x, 2.0 if p is None else p, dim, keepdim, dtype=dtype)


# ---------------------------------------------------------------------- distances
_CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                "donot_use_mm_for_euclid_dist")


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """p-norm distances between the rows of x1 (..., P, M) and x2 (..., R, M): (..., P, R),
    batch dims broadcast. For p = 2 with P or R above 25 (torch's default compute_mode) the
    distances come from one matrix product, |x|^2 + |y|^2 - 2 x.y clamped at 1e-30, as
    torch. Example: ``sampan.cdist(a, b)``."""
    from .elementwise import sub
    from .shape import unsqueeze
    x1, x2 = _t(x1), _t(x2)
    if x1.ndim < 2 or x2.ndim < 2 or x1.shape[-1] != x2.shape[-1]:
        raise op_error(ShapeError, "cdist", f"shapes {tuple(x1.shape)} and {tuple(x2.shape)}",
                       "(..., P, M) and (..., R, M) with one M")
    if p < 0:
        raise op_error(SampanValueError, "cdist", f"p={p}", "p >= 0")
    if compute_mode not in _CDIST_MODES:
        raise op_error(SampanValueError, "cdist", f"compute_mode={compute_mode!r}",
                       " or ".join(_CDIST_MODES))
    big = any(isinstance(d, str) or d > 25 for d in (x1.shape[-2], x2.shape[-2]))
    if p == 2 and (compute_mode == _CDIST_MODES[1] or (compute_mode == _CDIST_MODES[0]
                                                       and big)):
        return _euclid_mm(x1, x2)
    return vector_norm(sub(unsqueeze(x1, -2), unsqueeze(x2, -3)), p, -1)


def _euclid_mm(x1, x2):
    from .elementwise import add, clamp, mul, sqrt, sub
    from .linalg import matmul
    from .reduce import sum
    from .shape import transpose, unsqueeze
    n1 = sum(mul(x1, x1), -1, keepdims=True)                     # (..., P, 1)
    n2 = unsqueeze(sum(mul(x2, x2), -1), -2)                      # (..., 1, R)
    d2 = sub(add(n1, n2), mul(matmul(x1, transpose(x2, -2, -1)), 2.0))
    return sqrt(clamp(d2, min=1e-30))


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps)) along `dim`, as torch: each input is
    divided by its clamped norm (the clamp passes the norm's own gradient).
    Example: ``sampan.cosine_similarity(a, b, dim=1)``."""
    from .elementwise import add, clamp, div, mul, operands, sub
    from .reduce import sum
    from .shape import broadcast_to
    x1, x2 = operands(_t(x1), _t(x2))
    shape = broadcast_shapes("cosine_similarity", tuple(x1.shape), tuple(x2.shape))
    x1 = broadcast_to(x1, shape) if tuple(x1.shape) != shape else x1
    x2 = broadcast_to(x2, shape) if tuple(x2.shape) != shape else x2

    def unit(x):
        n = vector_norm(x, 2, dim, keepdim=True)
        n = add(n, sub(clamp(n, min=eps), n).detach())
        return div(x, n)
    return sum(mul(unit(x1), unit(x2)), dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """||x1 - x2 + eps||_p over the last dim, as torch. Example:
    ``sampan.pairwise_distance(a, b)``."""
    from .elementwise import add, operands, sub
    x1, x2 = operands(_t(x1), _t(x2))
    nd = max(x1.ndim, x2.ndim)
    return vector_norm(add(sub(x1, x2), eps), p, max(nd - 1, 0) if nd else None, keepdim)


def pdist(input, p=2.0):
    """The upper triangle (row-major, without the diagonal) of cdist(input, input) for a 2-d
    input: n (n - 1) / 2 distances. Example: ``sampan.nn.functional.pdist(x)``."""
    from .shape import getitem
    x = _t(input)
    if x.ndim != 2:
        raise op_error(ShapeError, "pdist", f"shape {tuple(x.shape)}", "a 2-d input (N, M)")
    i, j = np.triu_indices(x.shape[0], 1)
    return vector_norm(getitem(x, (Tensor(i.astype(np.int64)),)) -
                       getitem(x, (Tensor(j.astype(np.int64)),)), p, -1)


def _samples(*specs):
    def f():
        r = rng(200 + len(specs))
        return [Sample(tuple(randf(r, *s) for s in shapes), attrs) for shapes, attrs in specs]
    return f


COMPOSITES_HERE = {
    "vector_norm": (vector_norm, _samples((((3, 4),), {}),
                                          (((2, 3, 2),), {"ord": 3.0, "dim": (0, 2),
                                                          "keepdim": True}))),
    "vector_norm_inf": (vector_norm, _samples((((3, 4),), {"ord": math.inf, "dim": 1}),
                                              (((3, 4),), {"ord": 0.5, "dim": 0}))),
    "matrix_norm": (matrix_norm, _samples((((2, 3, 3),), {"ord": "nuc"}),
                                          (((3, 4),), {"ord": -math.inf, "keepdim": True}))),
    "matrix_norm_2": (matrix_norm, _samples((((3, 3, 2),), {"ord": 2, "dim": (0, 1)}),
                                            (((3, 4),), {"ord": 1}))),
    "linalg_norm": (linalg_norm, _samples((((3, 4),), {}), (((2, 3, 4),), {"dim": 1}))),
    "norm": (norm, _samples((((3, 4),), {}), (((2, 3, 4),), {"p": 1, "dim": (1, 2)}))),
    "cdist": (cdist, _samples((((3, 2), (4, 2)), {}), (((2, 3, 2), (2, 2, 2)), {"p": 1.0}))),
    "cdist_mm": (cdist, _samples((((2, 3, 2), (1, 4, 2)),
                                  {"compute_mode": "use_mm_for_euclid_dist"}),)),
    "cosine_similarity": (cosine_similarity, _samples((((3, 4), (3, 4)), {}),
                                                      (((2, 3), (3,)), {"dim": -1}))),
    "pairwise_distance": (pairwise_distance, _samples((((3, 4), (3, 4)), {}),
                                                      (((3, 4), (4,)), {"p": 3.0,
                                                                        "keepdim": True}))),
    "pdist": (pdist, _samples((((4, 3),), {}),)),
}


# ---------------------------------------------------------------------- products, pinv
def matrix_power(A, n):
    """A @ A @ ... (n times) by repeated squaring, batched; n = 0 gives identities, n < 0
    powers of inv(A). Example: ``sampan.linalg.matrix_power(A, 3)``."""
    from .elementwise import add, mul
    from .linalg import matmul
    A = _t(A)
    _matrix("linalg.matrix_power", A)
    n = int(n)
    if n == 0:
        eye = Tensor(np.eye(A.shape[-1], dtype=A.dtype))
        return add(mul(A, 0.0), eye)
    if n < 0:       # decomp.inv, from the table: decomp.py imports this module
        A, n = apply(get_op("linalg_inv"), (A,), {}), -n
    result, base = None, A
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return result


def multi_dot(tensors):
    """The product of a list of matrices (the first may be a 1-d row vector, the last a 1-d
    column vector, as torch.linalg.multi_dot). Example: ``multi_dot([a, b, c])``."""
    from .linalg import matmul
    ts = [_t(t) for t in tensors]
    if len(ts) < 2:
        raise op_error(SampanValueError, "linalg.multi_dot", f"{len(ts)} tensors",
                       "at least 2 tensors")
    for i, t in enumerate(ts):
        if t.ndim != 2 and not (t.ndim == 1 and i in (0, len(ts) - 1)):
            raise op_error(ShapeError, "linalg.multi_dot", f"tensor {i} of shape "
                           f"{tuple(t.shape)}", "2-d tensors (the first and last may be 1-d)")
    r = ts[0]
    for t in ts[1:]:
        r = matmul(r, t)
    return r


def pinv(A, *, rtol=None, hermitian=False):
    """The Moore-Penrose pseudo-inverse through the SVD, singular values below
    rtol * max(S) (default max(m, n) * eps) treated as 0, batched (hermitian=True is
    accepted and takes the same SVD path: the result is the same).
    Example: ``sampan.linalg.pinv(A)``."""
    from .decomp_spectral import svd
    from .elementwise import div, gt, mul, where
    from .linalg import matmul
    from .reduce import amax
    from .shape import transpose, unsqueeze
    A = _float_input("linalg.pinv", _t(A), None)
    m, n = A.shape[-2], A.shape[-1]
    if rtol is None:
        rtol = max(m, n) * float(np.finfo(A.dtype).eps)
    u, s, vh = svd(A, full_matrices=False)
    keep = gt(s, mul(amax(s, -1, keepdims=True), float(rtol)).detach())
    sinv = where(keep, div(1.0, where(keep, s, 1.0)), 0.0)
    return matmul(mul(transpose(vh, -2, -1), unsqueeze(sinv, -2)), transpose(u, -2, -1))


COMPOSITES_HERE.update({
    "matrix_power": (matrix_power, lambda: [Sample((randf(rng(210), 3, 3),), {"n": 3}),
                                            Sample((randf(rng(211), 2, 3, 3, low=-1, high=1)
                                                    + 2 * np.eye(3, dtype=np.float32),),
                                                   {"n": -2})]),
    "pinv": (pinv, lambda: [Sample((randf(rng(212), 3, 2),), {})]),
})


class LstsqResult(tuple):
    """(solution, residuals, rank, singular_values), as torch.linalg.lstsq's named tuple."""
    __slots__ = ()

    def __new__(cls, solution, residuals, rank, singular_values):
        return super().__new__(cls, (solution, residuals, rank, singular_values))

    solution = property(lambda self: self[0])
    residuals = property(lambda self: self[1])
    rank = property(lambda self: self[2])
    singular_values = property(lambda self: self[3])


def lstsq(A, B, rcond=None, *, driver=None):
    """Least-squares (minimum-norm) solutions X of A X = B for A (..., m, n), B (..., m, k),
    through the SVD, singular values below rcond * max(S) treated as 0 (default
    max(m, n) * eps). As torch's drivers: rank for 'gelsy' (the default), 'gelsd', 'gelss';
    singular_values for 'gelsd', 'gelss'; residuals (squared column norms of A X - B) for
    the others when m > n and A has full rank; what a driver does not compute is empty.
    Example: ``x = sampan.linalg.lstsq(A, B).solution``."""
    from .creation import zeros
    from .decomp_spectral import svdvals
    from .elementwise import cast, gt, mul, operands, sub
    from .linalg import matmul
    from .reduce import amax, sum
    op = "linalg.lstsq"
    A, B = operands(_t(A), _t(B))
    A = _float_input(op, A, None)
    driver = "gelsy" if driver is None else driver
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise op_error(SampanValueError, op, f"driver={driver!r}",
                       "'gels', 'gelsy', 'gelsd' or 'gelss'")
    if A.ndim < 2 or B.ndim < 2 or B.shape[-2] != A.shape[-2]:
        raise op_error(ShapeError, op, f"A {tuple(A.shape)} and B {tuple(B.shape)}",
                       "A (..., m, n) and B (..., m, k) with one m")
    m, n = A.shape[-2], A.shape[-1]
    if rcond is None:
        rcond = max(m, n) * float(np.finfo(A.dtype).eps)
    x = matmul(pinv(A, rtol=rcond), B)
    empty = zeros((0,), dtype=A.dtype)
    s = svdvals(A)
    rank = sum(cast(gt(s, mul(amax(s, -1, keepdims=True), float(rcond)).detach()),
                    np.int64), -1)
    from .registry import STATE
    full = m > n and (STATE.tracer is not None or bool((rank.numpy() == n).all()))
    res = empty
    if driver != "gelsy" and full:
        d = sub(matmul(A, x), B)
        res = sum(mul(d, d), -2)
    return LstsqResult(x, res, rank if driver != "gels" else zeros((0,), dtype=np.int64),
                       s if driver in ("gelsd", "gelss") else empty)


def logdet(input):
    """log(det(A)), batched: nan where det < 0 and -inf where det = 0, as torch.logdet.
    Example: ``sampan.logdet(A)``."""
    from .elementwise import lt, where
    sign, logabs = apply(get_op("linalg_slogdet"), (_t(input),), {})   # decomp.slogdet
    return where(lt(sign, 0.0), float("nan"), logabs)


def matrix_rank(A, *, atol=None, rtol=None, hermitian=False):
    """The number of singular values above max(atol, rtol * max(S)) (int64), batched; rtol
    defaults to max(m, n) * eps when atol is not given (torch's rule); hermitian=True is
    accepted and takes the same SVD path.
    Example: ``sampan.linalg.matrix_rank(A)``."""
    from .decomp_spectral import svdvals
    from .elementwise import cast, gt, maximum, mul
    from .reduce import amax, sum
    A = _float_input("linalg.matrix_rank", _t(A), None)
    m, n = A.shape[-2], A.shape[-1]
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else max(m, n) * float(
            np.finfo(A.dtype).eps)
    s = svdvals(A).detach()
    tol = maximum(mul(amax(s, -1, keepdims=True), float(rtol)), float(atol or 0.0))
    return sum(cast(gt(s, tol), np.int64), -1)
