"""numba kernels for sparse features: batch dedupe, segment sums, and bag pooling over CSR.

A CSR batch is ``offsets`` (length B+1, non-decreasing) and ``idx`` (entries of bag b are
``idx[offsets[b]:offsets[b+1]]``), each entry a row of a source matrix. Pooling is a
fused gather-and-reduce: the gathered rows are never materialised.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sampan.rec.hashtable import _as_keys, _mix

__all__ = ["POOL_MODES", "bag_pool", "bag_pool_backward", "segment_sum", "unique_inverse"]

POOL_MODES = ("sum", "mean", "max")


@njit(cache=True, nogil=True)
def _unique_inverse(keys, uniq, inv):
    n = keys.size
    cap = 16
    while cap < 2 * n:
        cap *= 2
    mask = np.int64(cap - 1)
    slot_key = np.empty(cap, np.int64)
    slot_pos = np.full(cap, -1, np.int64)
    u = 0
    for j in range(n):
        k = keys[j]
        i = np.int64(_mix(k) & np.uint64(mask))
        while True:
            p = slot_pos[i]
            if p < 0:
                slot_key[i] = k
                slot_pos[i] = u
                uniq[u] = k
                inv[j] = u
                u += 1
                break
            if slot_key[i] == k:
                inv[j] = p
                break
            i = (i + 1) & mask
    return u


def unique_inverse(keys) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys in first-seen order and ``inverse`` with ``uniq[inverse] == keys``.

    O(n) with a hash table, unlike ``np.unique`` (which sorts).

    >>> u, inv = unique_inverse([5, 3, 5]); u.tolist(), inv.tolist()
    ([5, 3], [0, 1, 0])
    """
    k = _as_keys(keys)
    uniq = np.empty(k.size, np.int64)
    inv = np.empty(k.size, np.int64)
    u = _unique_inverse(k, uniq, inv)
    return uniq[:u].copy(), inv


@njit(cache=True, nogil=True)
def _segment_sum(inv, vals, out):
    for j in range(inv.size):
        o = inv[j]
        for d in range(vals.shape[1]):
            out[o, d] += vals[j, d]


def segment_sum(inverse, values, n: int) -> np.ndarray:
    """``out[i] = sum of values[j] where inverse[j] == i`` for ``i < n`` (float32).

    >>> segment_sum([0, 1, 0], np.ones((3, 2), np.float32), 2).tolist()
    [[2.0, 2.0], [1.0, 1.0]]
    """
    inv = np.ascontiguousarray(inverse, np.int64).ravel()
    vals = np.ascontiguousarray(values, np.float32).reshape(inv.size, -1)
    out = np.zeros((n, vals.shape[1]), np.float32)
    _segment_sum(inv, vals, out)
    return out


@njit(cache=True, nogil=True)
def _bag_pool(src, idx, offsets, mode, out, arg):
    dim = src.shape[1]
    for b in range(offsets.size - 1):
        s, e = offsets[b], offsets[b + 1]
        if e == s:
            continue
        if mode == 2:
            for d in range(dim):
                best = src[idx[s], d]
                bi = s
                for j in range(s + 1, e):
                    v = src[idx[j], d]
                    if v > best:
                        best = v
                        bi = j
                out[b, d] = best
                arg[b, d] = bi
        else:
            for j in range(s, e):
                r = idx[j]
                for d in range(dim):
                    out[b, d] += src[r, d]
            if mode == 1:
                inv = np.float32(1.0) / np.float32(e - s)
                for d in range(dim):
                    out[b, d] *= inv


@njit(cache=True, nogil=True)
def _bag_pool_backward(g, idx, offsets, mode, arg, out):
    dim = g.shape[1]
    for b in range(offsets.size - 1):
        s, e = offsets[b], offsets[b + 1]
        if e == s:
            continue
        if mode == 2:
            for d in range(dim):
                out[idx[arg[b, d]], d] += g[b, d]
        else:
            scale = np.float32(1.0) if mode == 0 else np.float32(1.0) / np.float32(e - s)
            for j in range(s, e):
                r = idx[j]
                for d in range(dim):
                    out[r, d] += g[b, d] * scale


def _check_csr(idx: np.ndarray, offsets: np.ndarray, n_src: int) -> None:
    if offsets.ndim != 1 or offsets.size < 1:
        raise ValueError(f"offsets must be 1-D with B+1 entries, got shape {offsets.shape}")
    if offsets[0] != 0 or offsets[-1] != idx.size or (np.diff(offsets) < 0).any():
        raise ValueError(f"offsets must rise from 0 to len(idx)={idx.size}, "
                         f"got {offsets[0]}..{offsets[-1]}")
    if idx.size and (idx.min() < 0 or idx.max() >= n_src):
        raise ValueError(f"idx must be in [0, {n_src}), got [{idx.min()}, {idx.max()}]")


def _mode_code(mode: str) -> int:
    if mode not in POOL_MODES:
        raise ValueError(f"pooling mode must be one of {POOL_MODES}, got {mode!r}")
    return POOL_MODES.index(mode)


def bag_pool(src, idx, offsets, mode: str = "sum") -> tuple[np.ndarray, np.ndarray | None]:
    """Pool rows ``src[idx]`` per CSR bag; empty bags give zeros.

    Returns ``(out (B, dim), argmax)``; ``argmax`` (max mode only) feeds the backward.

    >>> out, _ = bag_pool(np.eye(3, dtype=np.float32), [0, 2, 1], [0, 2, 3]); out.tolist()
    [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    """
    src = np.ascontiguousarray(src, np.float32)
    idx = np.ascontiguousarray(idx, np.int64).ravel()
    offsets = np.ascontiguousarray(offsets, np.int64).ravel()
    _check_csr(idx, offsets, src.shape[0])
    m = _mode_code(mode)
    out = np.zeros((offsets.size - 1, src.shape[1]), np.float32)
    arg = np.zeros(out.shape if m == 2 else (0, 0), np.int64)
    _bag_pool(src, idx, offsets, m, out, arg)
    return out, (arg if m == 2 else None)


def bag_pool_backward(grad_out, idx, offsets, n_src: int, mode: str = "sum",
                      argmax=None) -> np.ndarray:
    """Gradient of :func:`bag_pool` w.r.t. ``src``: per-row sums, shape ``(n_src, dim)``.

    >>> g = bag_pool_backward(np.ones((1, 2), np.float32), [1, 1], [0, 2], 2); g.tolist()
    [[0.0, 0.0], [2.0, 2.0]]
    """
    g = np.ascontiguousarray(grad_out, np.float32)
    idx = np.ascontiguousarray(idx, np.int64).ravel()
    offsets = np.ascontiguousarray(offsets, np.int64).ravel()
    m = _mode_code(mode)
    if m == 2 and argmax is None:
        raise ValueError("max pooling backward needs the argmax returned by bag_pool")
    arg = np.ascontiguousarray(argmax, np.int64) if m == 2 else np.zeros((0, 0), np.int64)
    out = np.zeros((n_src, g.shape[1]), np.float32)
    _bag_pool_backward(g, idx, offsets, m, arg, out)
    return out
