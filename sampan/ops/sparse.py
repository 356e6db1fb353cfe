"""Sparse-feature primitives: row gather / row scatter-add by index, and DLRM's pairwise
interaction (``pair_dots``) with the upper-triangle gather / scatter its gradients use.

``rows_gather(src, idx)`` is an embedding lookup into a dense block of (deduplicated)
rows; its gradient is ``rows_scatter_add(g, idx, n)``, i.e. the summed row gradients of
the unique ids, and the two ops are each other's gradient. The eager kernels are numba loops
(``np.add.at`` would be ~30x slower for the scatter) where numba is:
`backends/numba/loops/sparse.py`; the kernels here are their numpy forms.
"""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ShapeError, op_error
from ..tensor import Tensor, apply
from ._util import Sample, randf, rng
from .registry import NO_ONNX, Spec, defop

__all__ = [
    "pair_dots",
    "pair_dots_grad",
    "rows_gather",
    "rows_scatter_add",
    "triu_gather",
    "triu_scatter",
]


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _check_range(idx, n):
    # numba kernels do not bounds-check: refuse bad indices here
    if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= n)):
        raise IndexError(f"index must be 1-d in [0, {n}), got shape {idx.shape} "
                         f"range [{idx.min() if idx.size else 0}, "
                         f"{idx.max() if idx.size else 0}]")


def _rows_gather_kernel(src, idx):
    idx = np.ascontiguousarray(idx, np.int64)
    if src.ndim != 2:
        raise ValueError(f"source must be 2-d, got {src.shape}")
    _check_range(idx, src.shape[0])
    return src[idx]


def _rows_scatter_add_kernel(g, idx, n):
    idx = np.ascontiguousarray(idx, np.int64)
    if g.ndim != 2 or g.shape[0] != idx.size:
        raise ValueError(f"values {g.shape} do not match index {idx.shape}")
    _check_range(idx, n)
    out = np.zeros((n,) + g.shape[1:], g.dtype)
    np.add.at(out, idx, g)
    return out


def _check_square(z):
    if z.ndim != 3 or z.shape[1] != z.shape[2]:
        raise ValueError(f"expected (B, K, K), got {z.shape}")


def _triu_gather_kernel(z):
    _check_square(z)
    i, j = np.triu_indices(z.shape[1], 1)
    return np.ascontiguousarray(z[:, i, j])


def _check_pairs(g, k):
    if g.ndim != 2 or g.shape[1] != k * (k - 1) // 2:
        raise ValueError(f"expected (B, {k * (k - 1) // 2}), got {g.shape}")


def _triu_scatter_kernel(g, k):
    _check_pairs(g, k)
    out = np.zeros((g.shape[0], k, k), g.dtype)
    i, j = np.triu_indices(k, 1)
    out[:, i, j] = g
    return out


def _check_vectors(t):
    if t.ndim != 3 or t.shape[2] < 1:
        raise ValueError(f"expected (B, K, dim) vectors, got {t.shape}")


def _pair_dots_kernel(t):
    _check_vectors(t)
    i, j = np.triu_indices(t.shape[1], 1)
    return np.ascontiguousarray(np.matmul(t, t.transpose(0, 2, 1))[:, i, j])


def _check_pair_grads(g, t):
    k = t.shape[1]
    if t.ndim != 3 or g.shape != (t.shape[0], k * (k - 1) // 2):
        raise ValueError(f"pair gradients {g.shape} do not fit vectors {t.shape}")


def _pair_dots_grad_kernel(g, t):
    _check_pair_grads(g, t)
    k = t.shape[1]
    dt = np.result_type(g, t)
    i, j = np.triu_indices(k, 1)
    s = np.zeros((t.shape[0], k, k), dt)
    s[:, i, j] = g
    return np.matmul(s + s.transpose(0, 2, 1), t).astype(dt, copy=False)


def _check_idx(op, idx):
    if idx.dtype.kind not in "iu" or len(idx.shape) != 1:
        raise op_error(DTypeError, op, f"index {idx}", "a 1-d integer index")


def _rows_gather_rule(src, idx):
    _check_idx("rows_gather", idx)
    if len(src.shape) != 2:
        raise op_error(ShapeError, "rows_gather", f"source of shape {tuple(src.shape)}",
                       "a 2-d (rows, dim) source")
    return Spec((idx.shape[0], src.shape[1]), src.dtype)


def _rows_scatter_add_rule(g, idx, n):
    _check_idx("rows_scatter_add", idx)
    if len(g.shape) != 2 or g.shape[0] != idx.shape[0]:
        raise op_error(ShapeError, "rows_scatter_add",
                       f"values {tuple(g.shape)} and index {tuple(idx.shape)}",
                       "(N, dim) values with an index of length N")
    return Spec((n, g.shape[1]), g.dtype)


def _triu_gather_rule(z):
    if len(z.shape) != 3 or z.shape[1] != z.shape[2]:
        raise op_error(ShapeError, "triu_gather", f"input {tuple(z.shape)}", "(B, K, K)")
    k = z.shape[1]
    return Spec((z.shape[0], k * (k - 1) // 2), z.dtype)


def _triu_scatter_rule(g, k):
    if len(g.shape) != 2 or g.shape[1] != k * (k - 1) // 2:
        raise op_error(ShapeError, "triu_scatter", f"input {tuple(g.shape)} with k={k}",
                       f"(B, {k * (k - 1) // 2})")
    return Spec((g.shape[0], k, k), g.dtype)


def _pair_dots_rule(t):
    if len(t.shape) != 3:
        raise op_error(ShapeError, "pair_dots", f"input {tuple(t.shape)}", "(B, K, dim)")
    k = t.shape[1]
    return Spec((t.shape[0], k * (k - 1) // 2), t.dtype)


def _pair_dots_grad_rule(g, t):
    k = t.shape[1] if len(t.shape) == 3 else None
    if k is None or tuple(g.shape) != (t.shape[0], k * (k - 1) // 2):
        raise op_error(ShapeError, "pair_dots_grad", f"pairs {tuple(g.shape)} and vectors "
                       f"{tuple(t.shape)}", "(B, K(K-1)/2) pairs for (B, K, dim) vectors")
    return Spec(tuple(t.shape), t.dtype)


def _pair_dots_grad_grad(c, y, g, t):
    # pair_dots_grad(g, t) = (S + S^T) @ t with S = triu_scatter(g): linear in g and in t
    from .linalg import matmul
    from .shape import transpose
    ct = matmul(c, transpose(t, 1, 2))
    return triu_gather(ct + transpose(ct, 1, 2)), pair_dots_grad(g, c)


_IDX = np.array([3, 0, 3, 1, 4])

ROWS_GATHER = defop(
    "rows_gather", _rows_gather_rule, kernel=_rows_gather_kernel, saves=(1,),
    nondiff_inputs=(1,), onnx="Gather", flops=lambda *a, **k: 0,
    grad=lambda g, y, src, idx: (rows_scatter_add(g, idx, src.shape[0]), None),
    samples=lambda: [Sample((randf(rng(81), 5, 3), _IDX), {}, diff=(0,))])

ROWS_SCATTER_ADD = defop(
    "rows_scatter_add", _rows_scatter_add_rule, kernel=_rows_scatter_add_kernel, saves=(1,),
    nondiff_inputs=(1,), onnx=NO_ONNX, flops=lambda g, i, n: int(np.prod(g.shape)),
    grad=lambda g, y, vals, idx, n: (rows_gather(g, idx), None),
    samples=lambda: [Sample((randf(rng(82), 5, 3), _IDX), {"n": 6}, diff=(0,))])

TRIU_GATHER = defop(
    "triu_gather", _triu_gather_rule, kernel=_triu_gather_kernel, saves=(), onnx=NO_ONNX,
    flops=lambda *a, **k: 0,
    grad=lambda g, y, z: (triu_scatter(g, z.shape[1]),),
    samples=lambda: [Sample((randf(rng(83), 2, 4, 4),), {})])

TRIU_SCATTER = defop(
    "triu_scatter", _triu_scatter_rule, kernel=_triu_scatter_kernel, saves=(), onnx=NO_ONNX,
    flops=lambda *a, **k: 0,
    grad=lambda g, y, vals, k: (triu_gather(g),),
    samples=lambda: [Sample((randf(rng(84), 2, 6),), {"k": 4})])


PAIR_DOTS = defop(
    "pair_dots", _pair_dots_rule, kernel=_pair_dots_kernel, onnx=NO_ONNX,
    flops=lambda t: t.shape[0] * t.shape[1] * (t.shape[1] - 1) * t.shape[2],
    grad=lambda g, y, t: (pair_dots_grad(g, t),),
    samples=lambda: [Sample((randf(rng(85), 2, 4, 3),), {})])

PAIR_DOTS_GRAD = defop(
    "pair_dots_grad", _pair_dots_grad_rule, kernel=_pair_dots_grad_kernel, onnx=NO_ONNX,
    flops=lambda g, t: 2 * t.shape[0] * t.shape[1] * (t.shape[1] - 1) * t.shape[2],
    grad=_pair_dots_grad_grad,
    samples=lambda: [Sample((randf(rng(86), 2, 6), randf(rng(87), 2, 4, 3)), {})])


def pair_dots(t):
    """Dots of every pair i < j of the K vectors of each sample: (B, K, d) -> (B, K(K-1)/2).

    Equals ``triu_gather(t @ t^T)`` without forming the K x K matrices.
    """
    return apply(PAIR_DOTS, (_t(t),), {})


def pair_dots_grad(g, t):
    """Gradient of :func:`pair_dots` w.r.t. ``t`` for pair gradients ``g``: (S + S^T) @ t."""
    return apply(PAIR_DOTS_GRAD, (_t(g), _t(t)), {})


def rows_gather(src, idx):
    """``src[idx]`` for a 2-d source and 1-d integer index. Example: ``rows_gather(E, inv)``."""
    return apply(ROWS_GATHER, (_t(src), _t(idx)), {})


def rows_scatter_add(values, idx, n):
    """(n, dim) zeros with ``values[j]`` added to row ``idx[j]`` (duplicates accumulate)."""
    return apply(ROWS_SCATTER_ADD, (_t(values), _t(idx)), {"n": int(n)})


def triu_gather(z):
    """Strict upper triangle of each (K, K) matrix, row-major: (B, K, K) -> (B, K(K-1)/2)."""
    return apply(TRIU_GATHER, (_t(z),), {})


def triu_scatter(values, k):
    """Inverse layout of :func:`triu_gather`: (B, K(K-1)/2) -> (B, K, K), zeros elsewhere."""
    return apply(TRIU_SCATTER, (_t(values),), {"k": int(k)})
