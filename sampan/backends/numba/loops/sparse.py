"""numba loops of the sparse-feature ops (`sampan.ops.sparse`): row gather and row
scatter-add (~30x np.add.at for embedding gradients, index_add's too), the upper-triangle
gather/scatter, and DLRM's pair dots with their gradient (generated SLP-vectorised
kernels per width from `pairgen`, these loops past its widths). Other dtypes and
layouts go to the ops' numpy kernels; indices are checked before a loop runs (the loops
do not bounds-check)."""
from __future__ import annotations

import numpy as np

from ....ops import index as _index
from ....ops import sparse as _s
from ....ops._nb import njit
from .. import pairgen

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@njit(cache=True, nogil=True)
def _gather_rows(src, idx, out):
    for j in range(idx.size):
        r = idx[j]
        for d in range(src.shape[1]):
            out[j, d] = src[r, d]


@njit(cache=True, nogil=True)
def _scatter_add_rows(g, idx, out):
    for j in range(idx.size):
        r = idx[j]
        for d in range(g.shape[1]):
            out[r, d] += g[j, d]


@njit(cache=True, nogil=True)
def _triu_gather(z, out):
    k = z.shape[1]
    for b in range(z.shape[0]):
        p = 0
        for i in range(k):
            for j in range(i + 1, k):
                out[b, p] = z[b, i, j]
                p += 1


@njit(cache=True, nogil=True)
def _triu_scatter(g, out):
    k = out.shape[1]
    for b in range(g.shape[0]):
        p = 0
        for i in range(k):
            for j in range(i + 1, k):
                out[b, i, j] = g[b, p]
                p += 1


@njit(cache=True, nogil=True, fastmath=True)
def _pair_dots(t, out):
    nb, k, dim = t.shape
    for b in range(nb):
        p = 0
        for i in range(k):
            for j in range(i + 1, k):
                acc = t[b, i, 0] * t[b, j, 0]
                for d in range(1, dim):
                    acc += t[b, i, d] * t[b, j, d]
                out[b, p] = acc
                p += 1


@njit(cache=True, nogil=True, fastmath=True)
def _pair_dots_grad(g, t, out):
    nb, k, dim = t.shape
    for b in range(nb):
        p = 0
        for i in range(k):
            for j in range(i + 1, k):
                gp = g[b, p]
                for d in range(dim):
                    out[b, i, d] += gp * t[b, j, d]
                    out[b, j, d] += gp * t[b, i, d]
                p += 1


def _fast(a) -> bool:
    return a.dtype in _FLOATS and a.flags.c_contiguous


def rows_gather(src, idx):
    if src.ndim != 2 or not _fast(src):
        return _s._rows_gather_kernel(src, idx)
    idx = np.ascontiguousarray(idx, np.int64)
    _s._check_range(idx, src.shape[0])
    out = np.empty((idx.size, src.shape[1]), src.dtype)
    _gather_rows(src, idx, out)
    return out


def rows_scatter_add(g, idx, n):
    if g.ndim != 2 or not _fast(g) or g.shape[0] != np.size(idx):
        return _s._rows_scatter_add_kernel(g, idx, n)
    idx = np.ascontiguousarray(idx, np.int64)
    _s._check_range(idx, n)
    out = np.zeros((n,) + g.shape[1:], g.dtype)
    _scatter_add_rows(g, idx, out)
    return out


def triu_gather(z):
    _s._check_square(z)
    if not _fast(z):
        return _s._triu_gather_kernel(z)
    k = z.shape[1]
    out = np.empty((z.shape[0], k * (k - 1) // 2), z.dtype)
    _triu_gather(np.ascontiguousarray(z), out)
    return out


def triu_scatter(g, k):
    _s._check_pairs(g, k)
    if not _fast(g):
        return _s._triu_scatter_kernel(g, k)
    out = np.zeros((g.shape[0], k, k), g.dtype)
    _triu_scatter(np.ascontiguousarray(g), out)
    return out


def _generated(dim, dtype):
    """The generated, SLP-vectorised pair kernels for this width (None: use the loops)."""
    if dim > pairgen.MAX_DIM:
        return None
    return pairgen.kernels(dim, np.dtype(dtype))


def pair_dots(t):
    _s._check_vectors(t)
    if t.dtype not in _FLOATS:
        return _s._pair_dots_kernel(t)
    k = t.shape[1]
    out = np.empty((t.shape[0], k * (k - 1) // 2), t.dtype)
    gen = _generated(t.shape[2], t.dtype)
    (gen[0] if gen else _pair_dots)(np.ascontiguousarray(t), out)
    return out


def pair_dots_grad(g, t):
    _s._check_pair_grads(g, t)
    dt = np.result_type(g, t)
    if dt not in _FLOATS:
        return _s._pair_dots_grad_kernel(g, t)
    k = t.shape[1]
    t = np.ascontiguousarray(t, dt)
    gen = _generated(t.shape[2], dt)
    if gen:   # writes every element; reads g with any strides (often a column slice)
        out = np.empty(t.shape, dt)
        gen[1](g if g.dtype == dt else g.astype(dt), t, pairgen.pair_index(k), out)
        return out
    out = np.zeros(t.shape, dt)
    _pair_dots_grad(np.ascontiguousarray(g, dt), t, out)
    return out


def index_add(a, i, src, axis):
    """index_add with embedding gradients (axis 0 of 2-d float arrays) as a row loop."""
    if not (axis == 0 and a.ndim == 2 and src.ndim == 2 and a.dtype in _FLOATS
            and src.dtype == a.dtype):
        return _index._index_add_kernel(a, i, src, axis)
    _index._check_range("index_add", i, a.shape[axis], axis, a.shape)
    out = a.copy()
    ii = np.ascontiguousarray(i, np.int64).reshape(-1)
    _scatter_add_rows(np.ascontiguousarray(src), ii, out)
    return out


KERNELS = {"rows_gather": rows_gather, "rows_scatter_add": rows_scatter_add,
           "triu_gather": triu_gather, "triu_scatter": triu_scatter, "pair_dots": pair_dots,
           "pair_dots_grad": pair_dots_grad, "index_add": index_add}
