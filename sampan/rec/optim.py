"""Sparse optimisers: update only the rows (and slots) of the ids a batch touched.

``opt.apply(table, ids, grads)`` dedupes ``ids``, sums their gradient rows, resolves the
ids to rows under the table lock (ids evicted meanwhile are skipped) and runs one numba
kernel over the touched rows, reading and writing weights and slots in place.

Semantics per row follow the usual "lazy" sparse rules: a row that is not touched in a
step is not decayed, and Adam keeps a per-row step count for its bias correction.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sampan.rec.hashtable import _AHEAD, _as_keys, _f32_ptr, _prefetch_row
from sampan.rec.kernels import segment_sum, unique_inverse

__all__ = ["SparseAdagrad", "SparseAdam", "SparseFTRL", "SparseSGD"]


@njit(cache=True, nogil=True, error_model="numpy")
def _sgd(wb, sb, shift, dim, sw, rows, g, lr):
    m = (np.int64(1) << shift) - 1
    for j in range(rows.size):
        r = rows[j]
        if r < 0:
            continue
        w = _f32_ptr(wb[r >> shift])
        o = (r & m) * dim
        for d in range(dim):
            w[o + d] -= lr * g[j, d]


@njit(cache=True, nogil=True, error_model="numpy")
def _adagrad(wb, sb, shift, dim, sw, rows, g, lr, eps):
    m = (np.int64(1) << shift) - 1
    for j in range(rows.size):
        _prefetch_row(wb, shift, dim, rows, j + _AHEAD)
        _prefetch_row(sb, shift, sw, rows, j + _AHEAD)
        r = rows[j]
        if r < 0:
            continue
        w = _f32_ptr(wb[r >> shift])
        s = _f32_ptr(sb[r >> shift])
        o = (r & m) * dim
        so = (r & m) * sw
        for d in range(dim):
            gd = g[j, d]
            acc = s[so + d] + gd * gd
            s[so + d] = acc
            w[o + d] -= lr * gd / (np.sqrt(acc) + eps)


@njit(cache=True, nogil=True, error_model="numpy")
def _adam(wb, sb, shift, dim, sw, rows, g, lr, b1, b2, eps):
    m = (np.int64(1) << shift) - 1
    for j in range(rows.size):
        _prefetch_row(wb, shift, dim, rows, j + _AHEAD)
        _prefetch_row(sb, shift, sw, rows, j + _AHEAD)
        r = rows[j]
        if r < 0:
            continue
        w = _f32_ptr(wb[r >> shift])
        s = _f32_ptr(sb[r >> shift])
        o = (r & m) * dim
        so = (r & m) * sw
        t = s[so + 2 * dim] + np.float32(1.0)
        s[so + 2 * dim] = t
        c1 = np.float32(1.0) - b1 ** t
        c2 = np.float32(1.0) - b2 ** t
        for d in range(dim):
            gd = g[j, d]
            mo = b1 * s[so + d] + (np.float32(1.0) - b1) * gd
            ve = b2 * s[so + dim + d] + (np.float32(1.0) - b2) * gd * gd
            s[so + d] = mo
            s[so + dim + d] = ve
            w[o + d] -= lr * (mo / c1) / (np.sqrt(ve / c2) + eps)


@njit(cache=True, nogil=True, error_model="numpy")
def _ftrl(wb, sb, shift, dim, sw, rows, g, alpha, beta, l1, l2):
    m = (np.int64(1) << shift) - 1
    for j in range(rows.size):
        _prefetch_row(wb, shift, dim, rows, j + _AHEAD)
        _prefetch_row(sb, shift, sw, rows, j + _AHEAD)
        r = rows[j]
        if r < 0:
            continue
        w = _f32_ptr(wb[r >> shift])
        s = _f32_ptr(sb[r >> shift])
        o = (r & m) * dim
        so = (r & m) * sw
        for d in range(dim):
            gd = g[j, d]
            n = s[so + dim + d]
            n_new = n + gd * gd
            sigma = (np.sqrt(n_new) - np.sqrt(n)) / alpha
            z = s[so + d] + gd - sigma * w[o + d]
            s[so + d] = z
            s[so + dim + d] = n_new
            if abs(z) <= l1:
                w[o + d] = 0.0
            else:
                sign = np.float32(1.0) if z > 0 else np.float32(-1.0)
                w[o + d] = -(z - sign * l1) / ((beta + np.sqrt(n_new)) / alpha + l2)


@njit(cache=True, nogil=True)
def _mark(rows, updated, dirty, step):
    """Record the write for snapshots; returns how many rows were live."""
    n = 0
    for j in range(rows.size):
        r = rows[j]
        if r >= 0:
            updated[r] = step
            dirty[r] = True
            n += 1
    return n


class _SparseOptimizer:
    slot_init = 0.0

    def slot_width(self, dim: int) -> int:
        raise NotImplementedError

    def _kernel(self, table, rows: np.ndarray, g: np.ndarray) -> None:
        raise NotImplementedError

    def apply(self, table, ids, grads, step: int | None = None, summed: bool = False) -> int:
        """Update the rows of ``ids`` with ``grads`` (one row per id); returns rows updated.

        Duplicate ids have their gradients summed first unless ``summed`` says the ids
        are already unique.
        """
        keys = _as_keys(ids, f"{type(self).__name__}.apply")
        g = np.ascontiguousarray(grads, np.float32).reshape(keys.size, -1)
        if g.shape[1] != table.dim:
            raise ValueError(f"gradient rows have width {g.shape[1]}, table dim is {table.dim}")
        if not summed:
            keys, inv = unique_inverse(keys)
            g = segment_sum(inv, g, keys.size)
        table.attach_slots(self.slot_width(table.dim), self.slot_init)
        with table.lock:
            if getattr(table, "tier", None) is not None:
                table.tier.prepare(keys)  # rows demoted since the lookup come back
            rows = table.map.get(keys)
            step = table.step if step is None else int(step)
            if table.weights.addressable:
                self._kernel(table, rows, g)
            else:
                self._through_float32(table, keys, rows, g, step)
            return _mark(rows, table.meta["updated"], table.dirty, step)

    def apply_rows(self, table, rows: np.ndarray, grads: np.ndarray) -> None:
        """Update ``rows`` (distinct, already resolved under ``table.lock``, which the
        caller holds) with one gradient row each: the kernel alone, no lookup and no
        snapshot marks (a cache that resolved its rows in the plan and keeps its own
        dirty marks). The table must hold float32 rows in place."""
        rows = np.ascontiguousarray(rows, np.int64).ravel()
        g = np.ascontiguousarray(grads, np.float32).reshape(rows.size, -1)
        name = f"{type(self).__name__}.apply_rows"
        if g.shape[1] != table.dim:
            raise ValueError(f"{name}: gradient rows have width {g.shape[1]}, table dim "
                             f"is {table.dim}")
        if not table.weights.addressable:
            raise ValueError(f"{name}: a table whose rows are not float32 in place; "
                             "expected an addressable store (use apply)")
        table.attach_slots(self.slot_width(table.dim), self.slot_init)
        if rows.size and (rows.min() < 0 or rows.max() >= min(table.weights.capacity,
                                                               table.slots.capacity)):
            raise IndexError(f"{name}: rows {rows.min()}..{rows.max()}, expected 0.."
                             f"{min(table.weights.capacity, table.slots.capacity) - 1}")
        self._kernel(table, rows, g)

    def _through_float32(self, table, keys, rows, g, step: int) -> None:
        """A store without float32 rows in place (compressed, or another tier): gather
        the rows, run the same kernel on a float32 copy, store them back (rounding
        stochastically, keyed by id and step, where the store rounds)."""
        live = np.flatnonzero(rows >= 0)
        r = rows[live]
        w = table.weights.gather(r)
        s = table.slots.gather(r)
        # one chunk holding every row: `r >> shift` is 0 and `r & mask` is r
        flat = _Flat(w, s, table.dim)
        gl = np.ascontiguousarray(g[live])
        mask = getattr(table.weights, "stored_mask", None)
        if mask is not None:  # per-row widths: unstored columns (and their slots) stay put
            gl *= mask(r)
        self._kernel(flat, np.arange(r.size, dtype=np.int64), gl)
        # arrays wrap silently where numpy scalars would warn
        salt = (np.array([step], np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
        table.weights.scatter(r, w, round_keys=keys[live] ^ salt[0])
        table.slots.scatter(r, s)

    def _args(self, table):
        sl = table.slots
        return table.weights.bases, sl.bases, table.weights.shift, table.dim, sl.width


class _Rows:
    def __init__(self, a: np.ndarray):
        self.bases = np.array([a.ctypes.data], np.int64)
        self.shift, self.width, self.keep = 40, a.shape[1], a


class _Flat:
    """What a kernel reads of a table (``weights``, ``slots``, ``dim``), over two dense
    float32 arrays whose row r is at offset ``r * width`` of one chunk."""

    def __init__(self, w: np.ndarray, s: np.ndarray, dim: int):
        self.weights, self.slots, self.dim = _Rows(w), _Rows(s), dim


class SparseSGD(_SparseOptimizer):
    """``w -= lr * g`` on touched rows.

    >>> SparseSGD(0.1).lr
    0.1
    """

    def __init__(self, lr: float):
        self.lr = float(lr)

    def slot_width(self, dim: int) -> int:
        """SGD keeps no state; one dummy slot keeps the kernel signature uniform."""
        return 1

    def _kernel(self, table, rows, g):
        _sgd(*self._args(table), rows, g, np.float32(self.lr))


class SparseAdagrad(_SparseOptimizer):
    """Adagrad as in PyTorch: ``acc += g^2; w -= lr * g / (sqrt(acc) + eps)``.

    >>> SparseAdagrad(0.05).eps
    1e-10
    """

    def __init__(self, lr: float, eps: float = 1e-10, initial_accumulator_value: float = 0.0):
        self.lr, self.eps = float(lr), float(eps)
        self.slot_init = float(initial_accumulator_value)

    def slot_width(self, dim: int) -> int:
        """One accumulator per weight."""
        return dim

    def _kernel(self, table, rows, g):
        _adagrad(*self._args(table), rows, g, np.float32(self.lr), np.float32(self.eps))


class SparseAdam(_SparseOptimizer):
    """Lazy Adam: moments and the bias-correction step count advance per touched row.

    >>> SparseAdam(1e-3).betas
    (0.9, 0.999)
    """

    def __init__(self, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, self.betas, self.eps = float(lr), tuple(betas), float(eps)

    def slot_width(self, dim: int) -> int:
        """First moment, second moment, and the row's step count."""
        return 2 * dim + 1

    def _kernel(self, table, rows, g):
        b1, b2 = self.betas
        _adam(*self._args(table), rows, g, np.float32(self.lr), np.float32(b1),
              np.float32(b2), np.float32(self.eps))


class SparseFTRL(_SparseOptimizer):
    """FTRL-Proximal (McMahan et al. 2013) per coordinate, slots ``z`` and ``n``.

    >>> SparseFTRL(alpha=0.1).l1
    0.0
    """

    def __init__(self, alpha: float, beta: float = 1.0, l1: float = 0.0, l2: float = 0.0):
        if alpha <= 0 or not math.isfinite(alpha):
            raise ValueError(f"FTRL alpha must be positive, got {alpha}")
        self.alpha, self.beta, self.l1, self.l2 = float(alpha), float(beta), float(l1), float(l2)

    def slot_width(self, dim: int) -> int:
        """``z`` and ``n`` per weight."""
        return 2 * dim

    def _kernel(self, table, rows, g):
        _ftrl(*self._args(table), rows, g, np.float32(self.alpha), np.float32(self.beta),
              np.float32(self.l1), np.float32(self.l2))
