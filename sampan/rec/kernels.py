"""numba kernels for sparse features: batch dedupe, segment sums, and bag pooling over CSR.

A CSR batch is ``offsets`` (length B+1, non-decreasing) and ``idx`` (entries of bag b are
``idx[offsets[b]:offsets[b+1]]``), each entry a row of a source matrix. Pooling is a
fused gather-and-reduce: the gathered rows are never materialised.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sampan.errors import SampanValueError, ShapeError, op_error
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

    ``values`` has one row per entry of ``inverse``; every ``inverse[j]`` must be in
    ``[0, n)`` (the numba loop writes ``out[inverse[j]]`` without a bounds check).

    >>> segment_sum([0, 1, 0], np.ones((3, 2), np.float32), 2).tolist()
    [[2.0, 2.0], [1.0, 1.0]]
    """
    inv = np.ascontiguousarray(inverse, np.int64).ravel()
    vals = np.ascontiguousarray(values, np.float32)
    n = _count("segment_sum", "n", n)
    if vals.ndim == 0 or vals.shape[0] != inv.size:
        raise op_error(ShapeError, "segment_sum", f"values of shape {vals.shape} for an "
                       f"inverse of {inv.size} entries", "one row of values per entry")
    vals = vals.reshape(inv.size, int(np.prod(vals.shape[1:], dtype=np.int64)))
    _check_range("segment_sum", "inverse", inv, n)
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


def _count(op: str, name: str, n) -> int:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
        raise op_error(SampanValueError, op, f"{name}={n!r}", "a non-negative int")
    return int(n)


def _check_range(op: str, name: str, idx: np.ndarray, n: int) -> None:
    """The numba loops index rows without bounds checks: refuse indices outside [0, n)."""
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)]
        raise op_error(SampanValueError, op, f"{name} value {int(bad[0])} "
                       f"({bad.size} out of range, all in [{idx.min()}, {idx.max()}])",
                       f"row indices in [0, {n})")


def _check_csr(op: str, idx: np.ndarray, offsets: np.ndarray, n_src: int) -> None:
    if offsets.ndim != 1 or offsets.size < 1:
        raise op_error(ShapeError, op, f"offsets of shape {offsets.shape}",
                       "a 1-d offsets array with B+1 entries")
    if offsets[0] != 0 or offsets[-1] != idx.size or (np.diff(offsets) < 0).any():
        raise op_error(SampanValueError, op, f"offsets {offsets[0]}..{offsets[-1]}"
                       + (" (decreasing somewhere)" if (np.diff(offsets) < 0).any() else ""),
                       f"offsets rising from 0 to len(idx)={idx.size}")
    _check_range(op, "idx", idx, n_src)


def _mode_code(mode: str, op: str = "bag_pool") -> int:
    if mode not in POOL_MODES:
        raise op_error(SampanValueError, op, f"mode {mode!r}",
                       f"one of {POOL_MODES}")
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
    if src.ndim != 2:
        raise op_error(ShapeError, "bag_pool", f"source of shape {src.shape}",
                       "a 2-d (rows, dim) source")
    _check_csr("bag_pool", idx, offsets, src.shape[0])
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
    op = "bag_pool_backward"
    g = np.ascontiguousarray(grad_out, np.float32)
    idx = np.ascontiguousarray(idx, np.int64).ravel()
    offsets = np.ascontiguousarray(offsets, np.int64).ravel()
    m = _mode_code(mode, op)
    n_src = _count(op, "n_src", n_src)
    # the numba loop reads g[b] for every bag and writes out[idx[j]]: check both first
    _check_csr(op, idx, offsets, n_src)
    if g.ndim != 2 or g.shape[0] != offsets.size - 1:
        raise op_error(ShapeError, op, f"grad_out of shape {g.shape} for "
                       f"{offsets.size - 1} bags", f"({offsets.size - 1}, dim)")
    if m == 2 and argmax is None:
        raise op_error(SampanValueError, op, "mode='max' without argmax",
                       "the argmax returned by bag_pool")
    arg = np.ascontiguousarray(argmax, np.int64) if m == 2 else np.zeros((0, 0), np.int64)
    if m == 2:
        if arg.shape != g.shape:
            raise op_error(ShapeError, op, f"argmax of shape {arg.shape}",
                           f"the shape of grad_out {g.shape}")
        lo, hi = offsets[:-1, None], offsets[1:, None]
        bad = (hi > lo) & ((arg < lo) | (arg >= hi))
        if bad.any():
            b = int(np.argwhere(bad)[0][0])
            raise op_error(SampanValueError, op, f"argmax {int(arg[bad][0])} in bag {b}",
                           f"entries of that bag, in [{offsets[b]}, {offsets[b + 1]})")
    out = np.zeros((n_src, g.shape[1]), np.float32)
    _bag_pool_backward(g, idx, offsets, m, arg, out)
    return out
