"""IdStats against exact counts on a Zipf stream: estimates within the stated bound."""

import numpy as np
import pytest

from sampan.errors import SampanValueError
from sampan.rec.data import zipf_ranks
from sampan.rec.sketch import IdStats


def _stream(n_batches=20, size=5000, seed=0):
    rng = np.random.default_rng(seed)
    # raw ids spread over int64 as W4's are; Zipf(1.1) over 10^5 ranks
    return [zipf_ranks(rng, size, n=10**5, s=1.1) * 7919 - 123456 for _ in range(n_batches)]


def test_estimates_within_bound_and_never_below():
    batches = _stream()
    s = IdStats(width=1 << 12, depth=4, capacity=256)
    for b in batches:
        s.update(b)
    allids = np.concatenate(batches)
    ids, true = np.unique(allids, return_counts=True)
    est = s.estimate(ids)
    assert s.total == allids.size
    assert s.error_bound == int(np.ceil(np.e / 4096 * allids.size))
    assert (est >= true).all()
    # each id breaks the bound with probability <= delta = e^-4 (~1.8%)
    over = (est - true > s.error_bound).mean()
    assert over <= s.delta


def test_top_k_matches_exact_heavy_hitters():
    batches = _stream(seed=1)
    s = IdStats(width=1 << 14, depth=4, capacity=512)
    for b in batches:
        s.update(b)
    ids, true = np.unique(np.concatenate(batches), return_counts=True)
    k = 100
    top, est = s.top(k)
    assert top.size == k and (np.diff(est) <= 0).all()
    exact = dict(zip(ids.tolist(), true.tolist()))
    kth = np.sort(true)[::-1][k - 1]
    # every reported id is truly heavy up to the bound, and every id truly above the
    # k-th estimate plus the bound is reported
    assert min(exact[i] for i in top.tolist()) >= kth - s.error_bound
    must = ids[true > est[-1] + s.error_bound]
    assert set(must.tolist()) <= set(top.tolist())
    assert np.array_equal(s.estimate(top), est)


def test_counts_weights_decay_and_errors():
    s = IdStats(width=64, depth=2, capacity=4)
    s.update([3, 4], counts=[10, 2])
    assert s.estimate([3]).tolist() == [10] and s.total == 12
    s.decay(0.5)
    assert s.estimate([3]).tolist() == [5]
    s.clear()
    assert s.total == 0 and s.top(3)[0].size == 0
    with pytest.raises(SampanValueError, match="IdStats.update"):
        s.update([1, 2], counts=[1])
    with pytest.raises(SampanValueError, match="ids of dtype float64"):
        s.update(np.array([1.5]))
    with pytest.raises(SampanValueError, match="width"):
        IdStats(width=0)


def test_fed_by_parquet_reader_thread_and_by_pull(tmp_path):
    from sampan.rec.data import ClickStream, ParquetCTRReader, write_parquet
    from sampan.rec.sharded import ShardedEmbedding

    cs = ClickStream(seed=3, n_fields=4, n_dense=2)
    batches = [cs.batch(i, 256) for i in range(3)]
    path = str(tmp_path / "d.parquet")
    write_parquet(path, batches)
    stats = IdStats(width=1 << 12, capacity=64)
    seen = np.concatenate([b.indices for b in ParquetCTRReader(
        path, batch_size=128, shuffle_buffer=256, background=True, stats=stats)])
    ids, true = np.unique(seen, return_counts=True)
    assert stats.total == seen.size and (stats.estimate(ids) >= true).all()

    emb = ShardedEmbedding(4, n_shards=2)
    emb.stats = IdStats(width=1 << 10, capacity=8)
    emb.pull([7, 8, 7, 7])
    assert emb.stats.top(1)[0].tolist() == [7] and emb.stats.estimate([7]).tolist() == [3]
    emb.close()


def test_unique_fast_path_counts_the_same():
    a, b = IdStats(width=256, capacity=8), IdStats(width=256, capacity=8)
    ids = np.array([4, 4, 9, 4, 2])
    a.update(ids)
    b.update([4, 9, 2], counts=[3, 1, 1], unique=True)
    assert np.array_equal(a.table, b.table) and a.top(3)[0].tolist() == b.top(3)[0].tolist()
    with pytest.raises(SampanValueError, match="IdStats.update"):
        b.update([1, 2], counts=[1], unique=True)
