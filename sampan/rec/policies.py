"""Feature admission and eviction policies for :class:`sampan.rec.table.HashEmbeddingTable`.

Admission decides when an unseen id earns a row; until then it reads the table's default
vector and costs no row memory. Eviction picks rows to free; policies only *select*
victims from a window of rows (a clock sweep), and the table does the removal under its
lock. A window policy (TTL, user) widens its window by twice the rows that appeared since
its last call, so the sweep outruns any insertion rate: one call costs O(window + new
rows), amortised O(1) per inserted id, and the table stays bounded however many new ids
a step brings.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "AdmitAll",
    "CallableEviction",
    "LFUEviction",
    "MinCountAdmission",
    "ProbabilisticAdmission",
    "TTLEviction",
]


class AdmitAll:
    """Every id gets a row on first sight.

    >>> AdmitAll().admit(np.array([3, 4]), np.array([1, 1])).tolist()
    [True, True]
    """

    needs_counts = False

    def admit(self, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Mask of ids that get a row now."""
        return np.ones(ids.shape, np.bool_)


class MinCountAdmission:
    """An id gets a row once it has been seen ``min_count`` times.

    >>> MinCountAdmission(3).admit(np.array([1, 2]), np.array([2, 3])).tolist()
    [False, True]
    """

    needs_counts = True

    def __init__(self, min_count: int):
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        self.min_count = int(min_count)

    def admit(self, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Mask of ids whose running count reached ``min_count``."""
        return counts >= self.min_count


class ProbabilisticAdmission:
    """Each sighting of a missing id admits it with probability ``p``.

    Deterministic given ``seed``, the id and its count, so reruns and shards agree.

    >>> ProbabilisticAdmission(1.0).admit(np.array([9]), np.array([1])).tolist()
    [True]
    """

    needs_counts = True

    def __init__(self, p: float, seed: int = 0):
        if not 0.0 < p <= 1.0:
            raise ValueError(f"admission probability must be in (0, 1], got {p}")
        self.p = float(p)
        self.seed = int(seed)

    def admit(self, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Mask drawn from a hash of (seed, id, count)."""
        from sampan.rec.hashtable import hash_ids

        salt = hash_ids(counts.astype(np.int64) + self.seed * 1_000_003).view(np.int64)
        h = hash_ids(ids.astype(np.int64) ^ salt)
        return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53 < self.p


class _Sweep:
    """Clock cursor over row numbers; each call looks at ``window`` rows (plus growth)."""

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"eviction window must be >= 1, got {window}")
        self.window = int(window)
        self.cursor = 0
        self._left = 0  # live rows after the previous call's victims go

    def rows(self, n_rows: int, n_live: int | None = None) -> np.ndarray:
        """The next rows of the sweep; ``n_live`` widens it by twice the live-row growth.

        With ``N`` new rows a step and window ``W`` the hand moves ``W + 2N`` rows while
        the table grows by ``N``, so a row is reached within about one lap after it
        expires and the table holds at most about twice the rows that are not expired.
        """
        if n_rows == 0:
            return np.empty(0, np.int64)
        grown = 0 if n_live is None else max(0, n_live - self._left)
        w = min(self.window + 2 * grown, n_rows)
        start = self.cursor % n_rows
        self.cursor = start + w
        return (np.arange(start, start + w, dtype=np.int64)) % n_rows

    def _chosen(self, victims: np.ndarray, n_live: int) -> np.ndarray:
        self._left = n_live - victims.size
        return victims


class TTLEviction(_Sweep):
    """Evict rows not seen for more than ``ttl`` steps (a ``window`` of rows a call, more
    when new rows arrive faster, so expired rows never pile up).

    >>> TTLEviction(ttl=10).ttl
    10
    """

    def __init__(self, ttl: int, window: int = 1 << 16):
        super().__init__(window)
        if ttl < 0:
            raise ValueError(f"ttl must be >= 0 steps, got {ttl}")
        self.ttl = int(ttl)

    def select(self, meta: dict, live: np.ndarray, n_live: int, step: int) -> np.ndarray:
        """Rows in the current window whose last sighting is older than ``ttl``."""
        rows = self.rows(live.size, n_live)
        rows = rows[live[rows]]
        return self._chosen(rows[step - meta["last_seen"][rows] > self.ttl], n_live)


class LFUEviction(_Sweep):
    """Keep at most ``capacity`` rows: when over, evict the least frequent in the window.

    Evicts down to ``capacity * (1 - slack)`` so that the O(window) selection runs once
    per ``slack * capacity`` insertions, not on every batch.

    >>> LFUEviction(capacity=100).capacity
    100
    """

    def __init__(self, capacity: int, slack: float = 0.05, window: int = 1 << 17):
        super().__init__(window)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.slack = float(slack)

    def select(self, meta: dict, live: np.ndarray, n_live: int, step: int) -> np.ndarray:
        """Lowest (frequency, last_seen) rows of the window, as many as the excess."""
        if n_live <= self.capacity:
            return np.empty(0, np.int64)
        excess = n_live - int(self.capacity * (1.0 - self.slack))
        rows = self.rows(live.size)
        rows = rows[live[rows]]
        if rows.size <= excess:
            return rows
        # lexsort-free tie break: frequency dominates, older rows go first within a count
        score = meta["freq"][rows].astype(np.float64) + meta["last_seen"][rows] * 1e-12
        return rows[np.argpartition(score, excess - 1)[:excess]]


class CallableEviction(_Sweep):
    """User policy: ``fn(meta_window: dict, step) -> bool mask`` over a window of live rows.

    >>> p = CallableEviction(lambda m, s: m["freq"] < 2)
    """

    def __init__(self, fn: Callable[[dict, int], np.ndarray], window: int = 1 << 16):
        super().__init__(window)
        self.fn = fn

    def select(self, meta: dict, live: np.ndarray, n_live: int, step: int) -> np.ndarray:
        """Rows of the window for which the user function returns True."""
        rows = self.rows(live.size, n_live)
        rows = rows[live[rows]]
        window = {k: v[rows] for k, v in meta.items()}
        mask = np.asarray(self.fn(window, step), np.bool_)
        if mask.shape != rows.shape:
            raise ValueError(f"eviction policy returned shape {mask.shape}, expected {rows.shape}")
        return self._chosen(rows[mask], n_live)
