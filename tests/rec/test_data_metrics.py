"""Click stream, Parquet round trip, CSR batches, and metrics against scikit-learn."""

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from sampan.rec.data import (
    ClickStream,
    CTRBatch,
    ParquetCTRReader,
    splitmix64,
    write_parquet,
    zipf_ranks,
)
from sampan.rec.metrics import LogLoss, StreamingAUC


def _splitmix_ref(x: int) -> int:
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


def test_splitmix64_matches_python_reference():
    xs = [0, 1, 5 << 40 | 123, (1 << 63) - 1]
    assert splitmix64(np.array(xs, np.int64)).tolist() == [_splitmix_ref(x) for x in xs]


def test_zipf_ranks_follow_the_law():
    r = zipf_ranks(np.random.default_rng(0), 400000, n=10**7, s=1.1)
    assert r.min() >= 1 and r.max() <= 10**7
    pmf = np.arange(1, 10**7 + 1, dtype=np.float64) ** -1.1  # exact, no approximation
    pmf /= pmf.sum()
    for k in (1, 2, 10, 100):
        assert abs((r == k).mean() - pmf[k - 1]) < 3e-3
    assert abs((r > 10**5).mean() - pmf[10**5:].sum()) < 3e-3
    assert abs((r > 10**6).mean() - pmf[10**6:].sum()) < 3e-3


def test_click_stream_is_deterministic_and_planted_auc_is_about_088():
    s = ClickStream(seed=0)
    a, b = s.batch(3, 512), s.batch(3, 512)
    np.testing.assert_array_equal(a.indices, b.indices)
    ids = a.ids_matrix()
    assert ids.shape == (512, 26) and len(np.unique(ids[:, 0] >> 0)) > 20
    probs, labels = [], []
    for i in range(8):
        bt = s.batch(i, 4096)
        probs.append(s.planted_logit(bt.ids_matrix(), bt.dense))
        labels.append(bt.labels)
    planted = roc_auc_score(np.concatenate(labels), np.concatenate(probs))
    assert 0.86 < planted < 0.90


@pytest.mark.parametrize("background", [False, True])
def test_parquet_round_trip_is_a_shuffled_permutation(tmp_path, background):
    s = ClickStream(seed=1)
    batches = [s.batch(i, 1000) for i in range(5)]
    path = str(tmp_path / "w7.parquet")
    assert write_parquet(path, batches, row_group_size=700) == 5000
    reader = ParquetCTRReader(path, batch_size=512, shuffle_buffer=1500, read_rows=900,
                              background=background)
    got = list(reader)
    assert [len(b) for b in got[:-1]] == [512] * (len(got) - 1) and sum(map(len, got)) == 5000
    for b in got:
        assert b.indptr[-1] == b.indices.size and (np.diff(b.indptr) == 26).all()
    ids = np.concatenate([b.ids_matrix() for b in got])
    dense = np.concatenate([b.dense for b in got])
    ref_ids = np.concatenate([b.ids_matrix() for b in batches])
    ref_dense = np.concatenate([b.dense for b in batches])
    assert not np.array_equal(ids, ref_ids)  # shuffled
    order = np.lexsort(ids.T[::-1])
    ref_order = np.lexsort(ref_ids.T[::-1])
    np.testing.assert_array_equal(ids[order], ref_ids[ref_order])
    np.testing.assert_array_equal(dense[order], ref_dense[ref_order])
    labels = np.concatenate([b.labels for b in got])
    assert labels.sum() == sum(b.labels.sum() for b in batches)


def test_list_columns_and_field_csr(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "multi.parquet")
    pq.write_table(pa.table({"label": pa.array([1.0, 0.0, 1.0], pa.float32()),
                             "dense_0": pa.array([0.5, 1.5, 2.5], pa.float32()),
                             "sparse_0": pa.array([[1, 2], [], [3]], pa.list_(pa.int64())),
                             "sparse_1": pa.array([[9], [8, 7], []], pa.list_(pa.int64()))}),
                   path)
    (b,) = list(ParquetCTRReader(path, batch_size=8, shuffle_buffer=0, background=False))
    rows = [sorted(zip(b.fields[b.indptr[i]:b.indptr[i + 1]].tolist(),
                       b.indices[b.indptr[i]:b.indptr[i + 1]].tolist())) for i in range(3)]
    by_label = dict(zip(b.dense[:, 0].tolist(), rows))
    assert by_label == {0.5: [(0, 1), (0, 2), (1, 9)], 1.5: [(1, 7), (1, 8)], 2.5: [(0, 3)]}
    offs, ids = b.field_csr(1)
    assert np.diff(offs).sum() == 3 and sorted(ids.tolist()) == [7, 8, 9]
    with pytest.raises(ValueError, match="one id per field"):
        b.ids_matrix()
    assert isinstance(b, CTRBatch)


def test_streaming_auc_and_logloss_match_sklearn():
    rng = np.random.default_rng(0)
    m, ll = StreamingAUC(), LogLoss()
    ps, ys = [], []
    for _ in range(10):
        y = rng.random(3000) < 0.3
        p = 1 / (1 + np.exp(-(rng.standard_normal(3000) + 1.5 * y)))
        m.update(p, y)
        ll.update(p, y)
        ps.append(p)
        ys.append(y)
    p, y = np.concatenate(ps), np.concatenate(ys)
    assert abs(m.value() - roc_auc_score(y, p)) < 1e-4
    assert abs(ll.value() - log_loss(y, p)) < 1e-9
    coarse = StreamingAUC(bins=4)
    coarse.update([0.1, 0.1, 0.9], [0, 1, 1])
    assert coarse.value() == roc_auc_score([0, 1, 1], [0.1, 0.1, 0.9])
    with pytest.raises(ValueError, match="probabilities"):
        m.update([1.5], [1])
