"""The hash map and row pool against Python dicts and numpy."""

import numpy as np
import pytest

from sampan.rec.hashtable import ChunkedRows, HashMap, RowAllocator, hash_ids

I64 = np.iinfo(np.int64)
EXTREMES = np.array([0, -1, 1, I64.min, I64.max, I64.min + 1, I64.max - 1], np.int64)


def _check_against(m: HashMap, ref: dict, probe: np.ndarray) -> None:
    got = m.get(probe)
    want = np.array([ref.get(int(k), -1) for k in probe], np.int64)
    np.testing.assert_array_equal(got, want)
    assert len(m) == len(ref)
    keys, vals = m.items()
    assert dict(zip(keys.tolist(), vals.tolist())) == ref


def _colliding_keys(cap: int, n: int, seed: int = 0) -> np.ndarray:
    """Keys whose home slot is 0 in a table of ``cap`` slots."""
    rng = np.random.default_rng(seed)
    found = []
    while sum(len(f) for f in found) < n:
        cand = rng.integers(I64.min, I64.max, 1 << 16, dtype=np.int64, endpoint=True)
        found.append(cand[(hash_ids(cand) & np.uint64(cap - 1)) == 0])
    return np.concatenate(found)[:n]


@pytest.mark.parametrize("kind", ["random", "extremes", "colliding", "high_bits", "negative"])
def test_random_ops_match_dict(kind):
    rng = np.random.default_rng(1)
    if kind == "random":
        pool = rng.integers(I64.min, I64.max, 5000, dtype=np.int64, endpoint=True)
    elif kind == "extremes":
        pool = np.concatenate([EXTREMES, rng.integers(-50, 50, 100)])
    elif kind == "colliding":
        pool = _colliding_keys(256, 300)
    elif kind == "high_bits":
        pool = (np.arange(1, 400, dtype=np.int64) << 40) | 7
    else:
        pool = -rng.integers(1, 1 << 62, 2000, dtype=np.int64)
    pool = np.unique(np.concatenate([pool, EXTREMES]))
    m = HashMap(capacity=16)
    ref: dict[int, int] = {}
    for step in range(30):
        op = step % 3
        batch = rng.choice(pool, size=min(len(pool), 200))
        if op == 0:
            vals = rng.integers(0, 1 << 40, batch.size)
            m.put(batch, vals)
            for k, v in zip(batch.tolist(), vals.tolist()):
                ref[k] = v
        elif op == 1:
            old = m.remove(batch[: batch.size // 2])
            for i, k in enumerate(batch[: batch.size // 2].tolist()):
                # duplicates in one batch: only the first removal sees the value
                assert old[i] == ref.pop(k, -1)
        else:
            _check_against(m, ref, pool)
    _check_against(m, ref, pool)


def test_get_or_insert_assigns_unique_rows_and_reuses_freed():
    rng = np.random.default_rng(2)
    keys = np.concatenate([EXTREMES, _colliding_keys(64, 40, seed=3),
                           rng.integers(I64.min, I64.max, 3000, dtype=np.int64)])
    m, alloc = HashMap(capacity=8), RowAllocator()
    rows, created = m.get_or_insert(np.concatenate([keys, keys[::-1]]), alloc)
    first, again = rows[: keys.size], rows[keys.size :][::-1]
    np.testing.assert_array_equal(first, again)
    uniq = np.unique(keys)
    assert created.sum() == uniq.size == len(m) == alloc.live
    assert np.unique(first).size == uniq.size  # collisionless: one row per id
    gone = keys[:100]
    freed = m.remove(gone)
    alloc.release(freed[freed >= 0])
    new_keys = np.arange(10**6, 10**6 + 50, dtype=np.int64)
    new_rows, c = m.get_or_insert(new_keys, alloc)
    assert c.all() and set(new_rows.tolist()) <= set(freed.tolist())
    assert (m.get(gone) == -1).all() and (m.get(new_keys) == new_rows).all()


def test_growth_keeps_every_key():
    keys = np.arange(-20000, 20000, 3, dtype=np.int64)
    m = HashMap(capacity=4, max_load=0.5)
    m.put(keys, np.arange(keys.size))
    assert m.capacity * 0.5 >= keys.size
    np.testing.assert_array_equal(m.get(keys), np.arange(keys.size))


def test_bad_inputs_raise_clearly():
    m = HashMap()
    with pytest.raises(ValueError, match="integers"):
        m.get(np.array([1.5]))
    with pytest.raises(ValueError, match="values must be >= 0"):
        m.put([1], [-3])
    with pytest.raises(ValueError, match="max_load"):
        HashMap(max_load=0.99)


def test_chunked_rows_gather_scatter_match_numpy():
    rng = np.random.default_rng(4)
    c = ChunkedRows(5, shift=4)
    c.ensure(100)
    assert len(c.chunks) == 7
    ref = np.zeros((c.capacity, 5), np.float32)
    rows = rng.permutation(100)[:60]
    vals = rng.standard_normal((60, 5)).astype(np.float32)
    c.scatter(rows, vals)
    ref[rows] = vals
    q = rng.integers(0, 100, 500)
    np.testing.assert_array_equal(c.gather(q), ref[q])
    base0 = c.bases[0]
    c.ensure(1000)  # growth adds chunks, never moves old rows
    assert c.bases[0] == base0
    np.testing.assert_array_equal(c.gather(q), ref[q])
    with pytest.raises(IndexError):
        c.gather([c.capacity])
