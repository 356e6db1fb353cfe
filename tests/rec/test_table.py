"""HashEmbeddingTable: admission, eviction, metadata and lookups racing eviction."""

import threading
import time
from collections import Counter

import numpy as np
import pytest

from sampan.rec.policies import (
    CallableEviction,
    LFUEviction,
    MinCountAdmission,
    ProbabilisticAdmission,
    TTLEviction,
)
from sampan.rec.table import HashEmbeddingTable, hashed_normal


def test_lookup_creates_rows_with_deterministic_init_and_counts_metadata():
    t = HashEmbeddingTable(8, seed=3)
    ids = np.array([[5, -9, 5], [2**63 - 1, 0, -9]], np.int64)
    v = t.lookup(ids, step=4)
    assert v.shape == (2, 3, 8) and len(t) == 4
    np.testing.assert_array_equal(v.reshape(-1, 8), hashed_normal(ids.ravel(), 8, seed=3))
    np.testing.assert_array_equal(v[0, 0], v[0, 2])
    assert abs(hashed_normal(np.arange(4000), 8).std() - 0.01) < 5e-4
    rows = t.rows_for(ids, step=9)
    freq = Counter(ids.ravel().tolist())
    for k, r in zip(ids.ravel().tolist(), rows.tolist()):
        assert t.meta["key"][r] == k and t.meta["freq"][r] == 2 * freq[k]
        assert t.meta["last_seen"][r] == 9
    t.record([5, 5, 0, 77], [1, 0, 1, 1])  # 77 has no row: skipped
    r5, r0 = t.rows_for([5, 0], create=False)
    assert (t.meta["show"][r5], t.meta["click"][r5]) == (2, 1)
    assert (t.meta["show"][r0], t.meta["click"][r0]) == (1, 1)


def test_min_count_admission_reads_default_until_admitted():
    t = HashEmbeddingTable(4, admission=MinCountAdmission(3), default=np.full(4, 0.5))
    np.testing.assert_array_equal(t.lookup([11, 11]), np.full((2, 4), 0.5, np.float32))
    assert len(t) == 0 and t.weights.nbytes == 0
    v = t.lookup([11, 12])
    assert len(t) == 1
    np.testing.assert_array_equal(v[0], hashed_normal([11], 4)[0])
    np.testing.assert_array_equal(v[1], np.full(4, 0.5, np.float32))


def test_probabilistic_admission_rate():
    t = HashEmbeddingTable(2, admission=ProbabilisticAdmission(0.25, seed=1))
    t.lookup(np.arange(20000))
    assert 0.22 < len(t) / 20000 < 0.28
    with pytest.raises(ValueError, match="probability"):
        ProbabilisticAdmission(0.0)


def test_ttl_eviction_frees_stale_rows_and_reuses_them():
    t = HashEmbeddingTable(4, eviction=TTLEviction(ttl=2, window=1 << 10))
    t.lookup(np.arange(100), step=0)
    t.lookup(np.arange(50), step=2)
    t.lookup([1000], step=3)  # evicts ids 50..99 (last seen 0, now 3 > 2) first
    assert len(t) == 51 and set(t.ids().tolist()) == set(range(50)) | {1000}
    assert t.alloc.next_row == 100  # 1000 reused a freed row
    np.testing.assert_array_equal(t.read([60]), np.zeros((1, 4), np.float32))


def test_lfu_eviction_keeps_memory_bounded_and_frequent_ids():
    t = HashEmbeddingTable(4, eviction=LFUEviction(capacity=1000, slack=0.1, window=4096))
    hot = np.arange(50, dtype=np.int64)
    rng = np.random.default_rng(0)
    for step in range(40):
        cold = rng.integers(10**6, 10**12, 500)
        t.lookup(np.concatenate([hot, cold]), step=step)
        assert len(t) <= 1000 + 550
    assert t.alloc.next_row <= 1000 + 550
    assert (t.rows_for(hot, create=False) >= 0).all()


def test_callable_eviction_and_bad_policy_output():
    t = HashEmbeddingTable(2, eviction=CallableEviction(lambda m, s: m["key"] % 2 == 1))
    t.lookup(np.arange(10), step=0)
    t.evict()
    assert sorted(t.ids().tolist()) == [0, 2, 4, 6, 8]
    t.eviction = CallableEviction(lambda m, s: np.ones(3, bool))
    with pytest.raises(ValueError, match="shape"):
        t.evict()


def test_lookups_racing_eviction_never_return_another_ids_row():
    t = HashEmbeddingTable(8, eviction=LFUEviction(capacity=300, slack=0.3, window=256))
    stop = threading.Event()
    errors = []

    def churn():
        rng = np.random.default_rng(1)
        while not stop.is_set():
            t.lookup(rng.integers(0, 5000, 400))
            t.remove(rng.integers(0, 5000, 50))

    worker = threading.Thread(target=churn)
    worker.start()
    rng = np.random.default_rng(2)
    deadline = time.perf_counter() + 1.5
    checks = 0
    try:
        while time.perf_counter() < deadline:
            ids = rng.integers(0, 5000, 300)
            got = t.lookup(ids)
            want = hashed_normal(ids, 8)
            # every vector is its own id's (rows are only initialised, never trained here)
            if not np.array_equal(got, want):
                errors.append(ids[(got != want).any(1)])
            checks += 1
    finally:
        stop.set()
        worker.join()
    assert checks > 20 and not errors
