"""ShardedEmbedding against one table; the prefetch pipeline against a synchronous loop."""

import numpy as np

from sampan.rec.kernels import segment_sum
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import LocalShard, Prefetcher, ShardedEmbedding
from sampan.rec.table import HashEmbeddingTable


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.zipf(1.3, 500).astype(np.int64) * 7919 - 10**6 for _ in range(n)]


def _train(emb, batches, prefetch):
    """Toy loss 0.5*|e|^2 per occurrence: grad of each occurrence is its vector."""
    if prefetch:
        pf = Prefetcher(emb, batches, ids_of=lambda b: b)
        for step, pb in enumerate(pf):
            g = segment_sum(pb.inverse, pb.vectors[pb.inverse], pb.uniq.size)
            emb.push(pb.uniq, g, step)
            pf.done()
        pf.close()
        return pf
    for step, b in enumerate(batches):
        uniq, inv, vec = emb.pull(b, step)
        emb.push(uniq, segment_sum(inv, vec[inv], uniq.size), step)


def test_sharded_matches_single_table_and_prefetch_matches_sync():
    batches = _batches(12)
    single = ShardedEmbedding(8, n_shards=1, optimizer_factory=lambda: SparseAdagrad(0.1))
    sharded = ShardedEmbedding(8, n_shards=4, optimizer_factory=lambda: SparseAdagrad(0.1))
    piped = ShardedEmbedding(8, n_shards=3, optimizer_factory=lambda: SparseAdagrad(0.1))
    _train(single, batches, prefetch=False)
    _train(sharded, batches, prefetch=False)
    pf = _train(piped, batches, prefetch=True)
    ids = np.unique(np.concatenate(batches))
    ref = single.read(ids)
    assert len(single) == len(sharded) == len(piped) == ids.size
    assert np.abs(ref - single.shards[0].table.read(ids)).max() == 0
    np.testing.assert_array_equal(sharded.read(ids), ref)
    np.testing.assert_array_equal(piped.read(ids), ref)
    sizes = [len(s.table) for s in sharded.shards]
    assert min(sizes) > 0.1 * ids.size  # ids actually spread over shards
    assert 0.0 <= pf.overlap() <= 1.0 and pf.bg_seconds > 0
    for e in (single, sharded, piped):
        e.close()


def test_gather_after_eviction_never_returns_the_new_owner_row():
    shard = LocalShard(HashEmbeddingTable(4))
    ids = np.array([1, 2], np.int64)
    rows = shard.assign(ids)
    shard.table.remove([2])
    shard.table.lookup([99])  # reuses id 2's freed row
    assert shard.table.rows_for([99], create=False)[0] == rows[1]
    got = shard.gather(ids, rows)
    np.testing.assert_array_equal(got[1], np.zeros(4, np.float32))
    np.testing.assert_array_equal(got[0], shard.table.read([1])[0])


def test_prefetcher_surfaces_background_errors():
    emb = ShardedEmbedding(2, n_shards=1)
    pf = Prefetcher(emb, [np.array([1.5])], ids_of=lambda b: b)
    try:
        next(pf)
    except RuntimeError as e:
        assert "prefetch" in str(e)
    else:
        raise AssertionError("expected the background error")
    pf.close()


def test_top_ids_ranks_the_rows_by_the_shards_own_sighting_counts():
    """top_ids(k): the k ids whose rows were pulled in the most batches (numpy's count of
    the batches naming each id), most first; counts exact, nothing created or counted."""
    rng = np.random.default_rng(11)
    emb = ShardedEmbedding(4, n_shards=3)
    batches = [(rng.zipf(1.3, 300) % 500) * 7 + 1 for _ in range(12)]
    for t, b in enumerate(batches):
        emb.pull(b, t)
    ids, per_batch = np.unique(np.concatenate([np.unique(b) for b in batches]),
                               return_counts=True)
    want = dict(zip(ids.tolist(), per_batch.tolist()))
    for k in (0, 1, 25, ids.size, ids.size + 10):
        got, cnt = emb.top_ids(k)
        assert got.size == min(k, ids.size) == np.unique(got).size
        assert [want[i] for i in got.tolist()] == cnt.tolist()
        assert (np.diff(cnt) <= 0).all()
        # the k highest counts there are (ties at the edge may pick either id)
        np.testing.assert_array_equal(cnt, np.sort(per_batch)[::-1][: got.size])
    assert len(emb) == ids.size
    emb.close()
