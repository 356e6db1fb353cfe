"""HotCache resolves a batch's ids in its index once: the plan's rows serve the gather
and the push of the same ids while no refresh moved rows; a refresh between a plan and
its fetch or push falls back to looking the ids up again, and training still equals the
one-tier table's."""

import numpy as np
import pytest

from sampan.errors import SampanValueError
from sampan.rec.data import zipf_ranks
from sampan.rec.hotcache import HotCache
from sampan.rec.sharded import ShardedEmbedding

DIM = 4


def _ids(rng, n=400):
    return zipf_ranks(rng, n, n=1500, s=1.1) * 17 + 3


def _grads(uniq, vecs, step):
    return (np.float32(0.3) * vecs + np.float32(0.01) * np.cos(uniq[:, None] * 1.0 + step)
            ).astype(np.float32)


class _Counting:
    """Counts the keys looked up in a HashMap (wraps its ``get``)."""

    def __init__(self, m):
        self.m, self.keys, self.passes = m, 0, 0

    def get(self, keys):
        self.keys += np.size(keys)
        return self.m.get(keys)

    @property
    def tab(self):  # the slots a numba pass probes itself: one lookup pass of its ids
        self.passes += 1
        return self.m.tab

    def __getattr__(self, name):
        return getattr(self.m, name)

    def __len__(self):
        return len(self.m)


def test_a_step_looks_its_ids_up_in_the_cache_index_once():
    rng = np.random.default_rng(1)
    cache = HotCache(ShardedEmbedding(DIM, n_shards=1), budget_mb=0.004)
    for t in range(3):
        u, _, v = cache.pull(_ids(rng), t)
        cache.push(u, _grads(u, v, t), t)
    cache.refresh(3)
    assert len(cache) > 0
    spy = _Counting(cache.table.map)
    cache.table.map = spy
    try:
        u, _, v = cache.pull(_ids(rng), 4)
        cache.push(u, _grads(u, v, 4), 4)
        # the plan's lookup (one pass over the distinct ids, inside its numba kernel)
        # and nothing else: the gather, the misses and the push (the optimiser's update
        # of the hits too) use its rows
        hits = int((cache.table.map.m.get(u) >= 0).sum())
        assert hits > 0 and spy.passes == 1 and spy.keys == 0
    finally:
        cache.table.map = spy.m
    cache.close()


def test_a_refresh_between_plan_fetch_and_push_reads_and_trains_the_right_rows():
    rng = np.random.default_rng(2)
    ref = ShardedEmbedding(DIM, n_shards=2)
    back = ShardedEmbedding(DIM, n_shards=2)
    cache = HotCache(back, budget_mb=0.004, write_back_every=1)
    batches = [_ids(rng) for _ in range(8)]
    for t, ids in enumerate(batches):
        u, inv, parts, rows = cache.plan(ids, t)
        if t in (2, 5):
            cache.refresh(t)  # rows move in and out between the plan and its fetch
        v = cache.fetch(u, parts, rows)
        ru, rinv, rv = ref.pull(ids, t)
        np.testing.assert_array_equal(v[inv], rv[rinv])
        if t == 6:
            cache.refresh(t)  # ... and between the fetch and the push
        cache.push(u, _grads(u, v, t), t)
        ref.push(ru, _grads(ru, rv, t), t)
    seen = np.unique(np.concatenate(batches))
    f1, w1, s1 = back.read_rows(seen)
    f2, w2, s2 = ref.read_rows(seen)
    assert f1.all() and f2.all()
    np.testing.assert_array_equal(w1, w2)
    np.testing.assert_array_equal(s1, s2)
    assert cache.counters()["hits"] > 0
    cache.close()
    ref.close()
    back.close()


def test_the_sketch_counts_every_sighting_of_cached_ids_by_the_refresh():
    """Cached ids' counts reach the cache's own sketch in sums at refresh and flush, not
    per step: by then its total and estimates hold every sighting (count-min: never
    below the true count, within the error bound)."""
    rng = np.random.default_rng(3)
    cache = HotCache(ShardedEmbedding(DIM, n_shards=1), budget_mb=0.004, choose="sketch")
    batches = [_ids(rng) for _ in range(9)]
    for t, ids in enumerate(batches):
        u, _, v = cache.pull(ids, t)
        cache.push(u, _grads(u, v, t), t)
        if t in (2, 5):
            cache.refresh(t)
            assert cache.stats.total == sum(b.size for b in batches[: t + 1])
    assert cache.counters()["hits"] > 0
    cache.flush()
    cache._feed.join()
    allids = np.concatenate(batches)
    assert cache.stats.total == allids.size
    u, true = np.unique(allids, return_counts=True)
    est = cache.stats.estimate(u)
    assert (est >= true).all() and (est - true <= cache.stats.error_bound).all()
    cache.close()


def test_counters_count_distinct_ids_of_a_batch_as_well():
    cache = HotCache(ShardedEmbedding(DIM, n_shards=1), budget_mb=1)
    u, _, v = cache.pull(np.array([1, 2, 2]), 0)
    cache.push(u, v, 0)
    cache.refresh(0)  # caches 1 and 2
    cache.pull(np.array([1, 1, 1, 2, 9]), 1)
    c = cache.counters()
    assert (c["hits"], c["misses"]) == (4, 3 + 1)
    assert (c["distinct_hits"], c["distinct_misses"]) == (2, 2 + 1)
    assert c["distinct_hit_rate"] == 2 / 5
    cache.close()


def test_sketch_every_feeds_one_batch_of_misses_in_n_with_scaled_counts():
    """sketch_every=3: the misses of plans 3, 6, ... reach the cache's own sketch, each
    count times 3 (against an exact count of those batches' misses); cached ids' sightings
    all reach it at the refresh as before; training is unchanged."""
    rng = np.random.default_rng(4)
    ref = ShardedEmbedding(DIM, n_shards=1)
    cache = HotCache(ShardedEmbedding(DIM, n_shards=1), budget_mb=0.004, sketch_every=3,
                     choose="sketch")
    batches = [_ids(rng) for _ in range(7)]
    fed = {}  # id -> the count the sketch should hold
    for t, ids in enumerate(batches):
        distinct, counts = np.unique(ids, return_counts=True)
        was_cached = cache.table.map.get(distinct) >= 0
        u, inv, v = cache.pull(ids, t)
        np.testing.assert_array_equal(v[inv], _step_ref(ref, ids, t))
        cache.push(u, _grads(u, v, t), t)
        for i, c, hit in zip(distinct.tolist(), counts.tolist(), was_cached.tolist()):
            if hit:  # a cached id: every sighting, summed, at the next refresh or flush
                fed[i] = fed.get(i, 0) + c
            elif (t + 1) % 3 == 0:  # plans 3, 6: the misses, scaled
                fed[i] = fed.get(i, 0) + 3 * c
        if t == 3:
            cache.refresh(t)
    assert cache.counters()["hits"] > 0
    cache.flush()
    cache._feed.join()
    # total exactly what was fed; count-min estimates never below it
    assert cache.stats.total == sum(fed.values())
    ids = np.array(sorted(fed), np.int64)
    assert (cache.stats.estimate(ids) >= np.array([fed[i] for i in ids.tolist()])).all()
    with pytest.raises(SampanValueError, match="sketch_every"):
        HotCache(ShardedEmbedding(DIM, n_shards=1), budget_mb=1, sketch_every=0)
    cache.close()
    ref.close()


def _step_ref(emb, ids, t):
    u, inv, v = emb.pull(ids, t)
    emb.push(u, _grads(u, v, t), t)
    return v[inv]
