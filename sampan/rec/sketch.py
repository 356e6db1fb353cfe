"""Streaming id statistics: a count-min sketch with conservative update plus heavy hitters.

:class:`IdStats` counts every id it is shown (the Parquet reader's background thread and
``ShardedEmbedding.pull`` feed it) in a ``depth x width`` count-min table (Cormode and
Muthukrishnan 2005) and keeps a bounded set of candidate heavy hitters, so the hot-row
cache can ask for the top K ids of the stream without an exact counter per id.

Guarantee (per id, over everything counted since the last :meth:`IdStats.clear`):
``true <= estimate`` always, and ``estimate <= true + error_bound`` with probability at
least ``1 - delta``, where ``error_bound = epsilon * total``, ``epsilon = e / width`` and
``delta = exp(-depth)``. Conservative update (raise only the counters that hold the
minimum) keeps that bound and tightens it in practice.

Why numba and not Apache DataSketches: ``benchmarks/embedding_tiers.py --parts sketch``
feeds both the W4 id stream. DataSketches' Python ``count_min_sketch.update`` and
``frequent_items_sketch.update`` take one item per call: 4.4-6.8 M and 4.5-8.0 M ids/s
(2026-12-03, the shared 2-core VM, load 1.3-1.6), against 6.8-10.1 M ids/s for
:meth:`IdStats.update`, which does both jobs in one batched kernel: 1.5x DataSketches'
count-min alone, 3.1x the two sketches a top-K needs from it. So a W4 batch (53 k ids)
costs the reader about 5-8 ms here, against about 14-24 ms through DataSketches.
The candidate set here plays the part of
DataSketches' frequent-items sketch: an id enters when its estimate passes the smallest
estimate kept at the last prune.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import njit

from sampan.errors import SampanValueError, op_error
from sampan.rec.hashtable import _AHEAD, HashMap, _as_keys, _mix, _prefetch
from sampan.rec.kernels import unique_inverse

__all__ = ["IdStats"]


@njit(cache=True, nogil=True, inline="always")
def _slot(h1, h2, d, mask):
    # Kirsch-Mitzenmacher: depth hashes from two halves of one 64-bit mix
    return np.int64((h1 + np.uint64(d) * h2) & np.uint64(mask))


@njit(cache=True, nogil=True, inline="always")
def _lowest(tab, key, salt):
    """``(h1, h2, the smallest of the key's depth counters)``."""
    mask = tab.shape[1] - 1
    h = _mix(np.uint64(key) ^ salt)
    h1, h2 = h & np.uint64(0xFFFFFFFF), (h >> np.uint64(32)) | np.uint64(1)
    low = tab[0, _slot(h1, h2, 0, mask)]
    for d in range(1, tab.shape[0]):
        v = tab[d, _slot(h1, h2, d, mask)]
        if v < low:
            low = v
    return h1, h2, low


@njit(cache=True, nogil=True, inline="always")
def _prefetch_counters(tab, keys, j, salt):
    """Start loading the depth counters of ``keys[j]`` (if any): a table wider than the
    caches makes every counter a memory miss, and overlapping them is worth about 3x."""
    if j < keys.size:
        mask = tab.shape[1] - 1
        h = _mix(np.uint64(keys[j]) ^ salt)
        h1, h2 = h & np.uint64(0xFFFFFFFF), (h >> np.uint64(32)) | np.uint64(1)
        for d in range(tab.shape[0]):
            _prefetch(tab.ctypes.data + (d * tab.shape[1] + _slot(h1, h2, d, mask)) * 8)


@njit(cache=True, nogil=True)
def _cm_update(tab, keys, counts, salt, est):
    """Conservative update: each id's counters rise to (its minimum + count), no higher;
    ``est`` gets the new estimates (that minimum + count)."""
    mask = tab.shape[1] - 1
    for j in range(_AHEAD):
        _prefetch_counters(tab, keys, j, salt)
    for j in range(keys.size):
        _prefetch_counters(tab, keys, j + _AHEAD, salt)
        h1, h2, low = _lowest(tab, keys[j], salt)
        want = low + counts[j]
        est[j] = want
        for d in range(tab.shape[0]):
            i = _slot(h1, h2, d, mask)
            if tab[d, i] < want:
                tab[d, i] = want


@njit(cache=True, nogil=True)
def _cm_estimate(tab, keys, salt, out):
    for j in range(_AHEAD):
        _prefetch_counters(tab, keys, j, salt)
    for j in range(keys.size):
        _prefetch_counters(tab, keys, j + _AHEAD, salt)
        out[j] = _lowest(tab, keys[j], salt)[2]


class IdStats:
    """Count-min frequencies and the top ids of a stream of int64 ids (thread-safe).

    ``width`` (rounded up to a power of two) and ``depth`` set the error (module
    docstring); ``capacity`` is how many heavy-hitter candidates are kept, so
    :meth:`top` can answer up to ``capacity`` ids.

    >>> s = IdStats(width=1024, depth=4, capacity=8); s.update([5, 5, 5, 9])
    >>> s.top(1)[0].tolist(), int(s.estimate([5])[0])
    ([5], 3)
    """

    def __init__(self, width: int = 1 << 16, depth: int = 4, capacity: int = 4096,
                 seed: int = 0):
        for name, v, lo in (("width", width, 16), ("depth", depth, 1), ("capacity", capacity, 1)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
                raise op_error(SampanValueError, "IdStats", f"{name}={v!r}", f"an int >= {lo}")
        w = 1 << max(4, int(width - 1).bit_length())
        self.width, self.depth, self.capacity = w, int(depth), int(capacity)
        self.salt = np.uint64((int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019)
                              & (2**64 - 1))
        self.table = np.zeros((self.depth, w), np.int64)
        self.total = 0
        self.lock = threading.Lock()
        self._cand = np.empty(0, np.int64)
        self._cand_est = np.empty(0, np.int64)
        self._index = HashMap(2 * self.capacity)
        self._threshold = 0  # smallest estimate kept by the last prune (0: not full yet)

    # -- the guarantee -----------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """Relative error: estimates exceed true counts by at most ``epsilon * total``."""
        return math.e / self.width

    @property
    def delta(self) -> float:
        """Probability that one id's estimate breaks the bound."""
        return math.exp(-self.depth)

    @property
    def error_bound(self) -> int:
        """``epsilon * total``: the additive error of :meth:`estimate` (w.p. 1 - delta)."""
        return int(math.ceil(self.epsilon * self.total))

    @property
    def nbytes(self) -> int:
        """Bytes of the sketch table and the candidate set."""
        return self.table.nbytes + self._index.nbytes + 16 * self._cand.size

    # -- feeding -------------------------------------------------------------------------
    def update(self, ids, counts=None, unique: bool = False) -> None:
        """Count each id once per occurrence (or ``counts[j]`` times for ``ids[j]``);
        ``unique`` says the ids are already distinct (no dedupe pass)."""
        keys = _as_keys(ids, "IdStats.update")
        if keys.size == 0:
            return
        if unique and counts is not None:
            uniq = keys
            cnt = np.ascontiguousarray(counts, np.int64).ravel()
            if cnt.shape != keys.shape or (cnt < 0).any():
                raise op_error(SampanValueError, "IdStats.update",
                               f"{cnt.size} counts for {keys.size} ids",
                               "one non-negative count per id")
            return self._add(uniq, cnt)
        uniq, inv = unique_inverse(keys)
        if counts is None:
            cnt = np.bincount(inv, minlength=uniq.size).astype(np.int64)
        else:
            c = np.ascontiguousarray(counts, np.int64).ravel()
            if c.shape != keys.shape or (c < 0).any():
                raise op_error(SampanValueError, "IdStats.update",
                               f"{c.size} counts (min {c.min() if c.size else 0}) for "
                               f"{keys.size} ids", "one non-negative count per id")
            cnt = np.bincount(inv, weights=c, minlength=uniq.size).astype(np.int64)
        self._add(uniq, cnt)

    def _add(self, uniq: np.ndarray, cnt: np.ndarray) -> None:
        est = np.empty(uniq.size, np.int64)
        with self.lock:
            _cm_update(self.table, uniq, cnt, self.salt, est)
            self.total += int(cnt.sum())
            self._offer(uniq, est)

    def _offer(self, ids: np.ndarray, est: np.ndarray) -> None:
        """Candidates: refresh the estimates of ids already kept, admit those above the
        threshold, prune back to ``capacity`` when twice that many are held."""
        if self._threshold:
            hot = est >= self._threshold
            ids, est = ids[hot], est[hot]
        if ids.size == 0:
            return
        at = self._index.get(ids)
        have = at >= 0
        self._cand_est[at[have]] = est[have]
        new_ids, new_est = ids[~have], est[~have]
        if new_ids.size:
            start = self._cand.size
            self._cand = np.concatenate([self._cand, new_ids])
            self._cand_est = np.concatenate([self._cand_est, new_est])
            self._index.put(new_ids, np.arange(start, start + new_ids.size))
        if self._cand.size > 2 * self.capacity:
            self._prune()

    def _prune(self) -> None:
        keep = np.argpartition(-self._cand_est, self.capacity - 1)[: self.capacity]
        self._cand, self._cand_est = self._cand[keep], self._cand_est[keep]
        self._threshold = int(self._cand_est.min())
        self._index = HashMap(2 * self.capacity)
        self._index.put(self._cand, np.arange(self._cand.size))

    # -- asking ----------------------------------------------------------------------------
    def estimate(self, ids) -> np.ndarray:
        """Estimated counts (int64, never below the true count)."""
        keys = _as_keys(ids, "IdStats.estimate")
        out = np.empty(keys.size, np.int64)
        with self.lock:
            _cm_estimate(self.table, keys, self.salt, out)
        return out.reshape(np.shape(ids))

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` ids with the highest estimates (at most ``capacity``), highest first:
        ``(ids, estimates)``. An id whose true count exceeds the k-th estimate plus
        :attr:`error_bound` is among them (w.p. 1 - delta each) while ``k <= capacity``."""
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
            raise op_error(SampanValueError, "IdStats.top", f"k={k!r}", "an int >= 0")
        with self.lock:
            ids = self._cand.copy()
            est = np.empty(ids.size, np.int64)
            _cm_estimate(self.table, ids, self.salt, est)
        k = min(int(k), ids.size)
        if k < ids.size:
            part = np.argpartition(-est, k - 1)[:k] if k else np.empty(0, np.int64)
            ids, est = ids[part], est[part]
        order = np.lexsort((ids, -est))
        return ids[order], est[order]

    def decay(self, factor: float = 0.5) -> None:
        """Scale every count by ``factor`` (between passes: recent traffic weighs more)."""
        if not 0.0 <= factor <= 1.0:
            raise op_error(SampanValueError, "IdStats.decay", f"factor={factor!r}",
                           "a number in [0, 1]")
        with self.lock:
            self.table = np.floor(self.table * factor).astype(np.int64)
            self._cand_est = np.floor(self._cand_est * factor).astype(np.int64)
            self._threshold = int(self._threshold * factor)
            self.total = int(self.total * factor)

    def clear(self) -> None:
        """Forget everything counted."""
        with self.lock:
            self.table[:] = 0
            self.total = 0
            self._cand = np.empty(0, np.int64)
            self._cand_est = np.empty(0, np.int64)
            self._index = HashMap(2 * self.capacity)
            self._threshold = 0
