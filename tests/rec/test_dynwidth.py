"""Dynamic embedding dimension: per-id widths that grow with the id's sighting count,
read zero-padded, trained on the stored part only, kept by snapshots and serving."""

import numpy as np
import pytest

from sampan.errors import SampanValueError
from sampan.rec.dynwidth import DynamicWidthRows
from sampan.rec.optim import SparseAdagrad, SparseAdam, SparseFTRL, SparseSGD
from sampan.rec.snapshot import (ServingTable, SnapshotError, export_delta, export_full,
                                 read_snapshot, reshard, restore, table_state)
from sampan.rec.snapshot_file import _write_atomic
from sampan.rec.table import HashEmbeddingTable, hashed_normal

DIMS, CUTS = (4, 8, 16), (3, 6)


def _table(**kw):
    return HashEmbeddingTable(16, dynamic_dims=DIMS, dim_thresholds=CUTS, chunk_shift=4,
                              **kw)


def _width(count):
    return np.where(count >= CUTS[1], 16, np.where(count >= CUTS[0], 8, 4))


def test_lookups_equal_a_zero_padded_float32_reference():
    rng = np.random.default_rng(0)
    t = _table()
    ids = rng.integers(0, 40, 300)  # 40 ids seen 0..~20 times, over 10 batches
    for b in np.split(ids, 10):
        got = t.lookup(b)
    uniq, count = np.unique(ids, return_counts=True)
    ref = np.zeros((uniq.size, 16), np.float32)
    ref[:, :4] = hashed_normal(uniq, 16)[:, :4]  # grown lanes start at zero
    np.testing.assert_array_equal(t.read(uniq), ref)
    rows = t.map.get(uniq)
    np.testing.assert_array_equal(t.weights.row_width[rows], _width(count))
    np.testing.assert_array_equal(got, t.read(ids[-30:]))
    assert t.read([10**9]).tolist() == [[0.0] * 16]  # absent: the default


def test_growth_at_thresholds_keeps_values_and_reuse_restarts_narrow():
    t = _table()
    t.set_vectors([5], np.arange(1, 17, dtype=np.float32)[None])
    seen = []
    for _ in range(7):
        t.lookup([5])
        seen.append(int(t.weights.row_width[t.map.get([5])[0]]))
    assert seen == [4, 4, 8, 8, 8, 16, 16]  # counts 1..7 against thresholds 3 and 6
    assert t.read([5])[0].tolist() == [1, 2, 3, 4] + [0] * 12
    t.set_vectors([5], np.ones((1, 16), np.float32))
    assert t.read([5])[0].tolist() == [1.0] * 16
    t.remove([5])
    t.lookup([6])  # reuses the freed row: narrowest width, its own start
    assert t.weights.row_width[t.map.get([6])[0]] == 4
    np.testing.assert_array_equal(t.read([6])[0, 4:], 0)
    np.testing.assert_array_equal(t.read([6])[0, :4], hashed_normal([6], 16)[0, :4])


def _np_step(name, w, s, g, t_step, lr=0.05):
    """One update of the numpy reference (full width; masked g leaves lanes put)."""
    if name == "sgd":
        return w - lr * g, s
    if name == "adagrad":
        s = s + g * g
        return w - lr * g / (np.sqrt(s) + np.float32(1e-10)), s
    m = 0.9 * s[:, :16] + 0.1 * g
    v = 0.999 * s[:, 16:32] + 0.001 * g * g
    step = s[:, 32:] + 1
    upd = lr * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
    return w - upd, np.concatenate([m, v, step], axis=1)


@pytest.mark.parametrize("name,make,sw", [("sgd", lambda: SparseSGD(0.05), 1),
                                          ("adagrad", lambda: SparseAdagrad(0.05), 16),
                                          ("adam", lambda: SparseAdam(0.05), 33)])
def test_optimiser_updates_only_stored_columns(name, make, sw):
    rng = np.random.default_rng(1)
    t, opt = _table(), make()
    ids = np.arange(6)
    w = np.zeros((6, 16), np.float64)
    w[:, :4] = hashed_normal(ids, 16)[:, :4]
    s = np.zeros((6, sw), np.float64)
    counts = np.zeros(6, np.int64)
    for step in range(8):
        batch = ids[: 2 + step % 5]  # low ids are seen more often and widen first
        t.lookup(batch)
        counts[batch] += 1
        g = rng.standard_normal((batch.size, 16)).astype(np.float32)
        opt.apply(t, batch, g)
        mask = np.arange(16) < _width(counts[batch])[:, None]
        w[batch], s[batch] = _np_step(name, w[batch], s[batch], g * mask, step)
        seen = counts > 0
        np.testing.assert_allclose(t.read(ids[seen]), w[seen], rtol=2e-5, atol=2e-6)
    rows = t.map.get(ids)
    width = t.weights.row_width[rows]
    assert sorted(set(width.tolist())) == [4, 8, 16]  # every width was trained
    got = t.read(ids)
    for r, k in enumerate(width):
        assert not got[r, k:].any()  # never-stored lanes stay zero ...
        if name != "sgd":  # ... and so do their slots (adam: m and v)
            assert not t.slots.gather(rows[r:r + 1])[0, k:16].any()


def test_ftrl_keeps_unstored_lanes_zero():
    t = _table()
    t.lookup([1])
    SparseFTRL(alpha=0.1, l1=0.0).apply(t, [1], np.ones((1, 16), np.float32))
    v = t.read([1])[0]
    assert np.count_nonzero(v[:4]) == 4 and not v[4:].any()
    assert not t.slots.gather(t.map.get([1]))[0, 4:16].any()


def _trained():
    rng = np.random.default_rng(2)
    t = _table()
    opt = SparseAdagrad(0.05)
    for _ in range(8):
        b = (rng.pareto(1.0, 40) * 3).astype(np.int64) % 200  # a few hot ids, a long tail
        t.lookup(b)
        opt.apply(t, b, rng.standard_normal((40, 16)).astype(np.float32))
    return t, opt, rng


def test_snapshot_restore_and_serving_keep_widths_and_values(tmp_path):
    t, opt, rng = _trained()
    full, delta = str(tmp_path / "a.full"), str(tmp_path / "a.1.delta")
    export_full(t, full)
    header, arrays = read_snapshot(full)
    assert header["table"]["dynamic_dims"] == list(DIMS)
    assert arrays["weights.width"].dtype == np.uint8
    r = restore(full)
    assert r.dynamic and r.weights.dims == DIMS
    for k, v in table_state(t).items():
        np.testing.assert_array_equal(table_state(r)[k], v, err_msg=k)
    s = ServingTable(full)
    ids = np.arange(210)
    np.testing.assert_array_equal(s.lookup(ids), t.read(ids))
    # the delta carries rows that widened since: serving and restore follow
    b = rng.integers(0, 30, 60)  # hot ids widen further
    t.lookup(b)
    opt.apply(t, b, rng.standard_normal((60, 16)).astype(np.float32))
    export_delta(t, delta)
    s.apply_delta(delta)
    np.testing.assert_array_equal(s.lookup(ids), t.read(ids))
    r2 = restore(full, [delta])
    for k, v in table_state(t).items():
        np.testing.assert_array_equal(table_state(r2)[k], v, err_msg=k)
    assert s.bytes_per_row == t.weights.bytes_per_row
    # resharding moves each row with its width
    parts = reshard([t], 2)
    assert all(p.dynamic for p in parts) and sum(len(p) for p in parts) == len(t)
    for p in parts:
        pid = p.ids()
        np.testing.assert_array_equal(p.weights.row_width[p.map.get(pid)],
                                      t.weights.row_width[t.map.get(pid)])
        np.testing.assert_array_equal(p.read(pid), t.read(pid))
    assert len([c for c in t.weights.width_counts().values() if c]) == 3


def test_fixed_width_files_stay_as_before(tmp_path):
    t = HashEmbeddingTable(16, chunk_shift=4)
    t.lookup(np.arange(20))
    export_full(t, str(tmp_path / "f.full"))
    header, arrays = read_snapshot(str(tmp_path / "f.full"))
    assert "dynamic_dims" not in header["table"] and "weights.width" not in arrays
    r = restore(str(tmp_path / "f.full"))
    assert not r.dynamic
    np.testing.assert_array_equal(r.read(np.arange(20)), t.read(np.arange(20)))
    # a fixed-width raw form (no widths) put into a dynamic store keeps every lane
    s = DynamicWidthRows(16, 4, DIMS, CUTS)
    s.ensure(20)
    s.set_raw(np.arange(20), {"values": arrays["weights"]})
    np.testing.assert_array_equal(s.gather(np.arange(20)), arrays["weights"])


def test_bad_width_arrays_and_configs_are_refused(tmp_path):
    t, _, _ = _trained()
    full = str(tmp_path / "a.full")
    export_full(t, full)
    header, arrays = read_snapshot(full)
    for change, msg in [({"weights.width": arrays["weights.width"] + 1}, "row width"),
                        ({"weights.width": arrays["weights.width"].astype(np.int64)},
                         "expected uint8")]:
        bad = str(tmp_path / "bad.full")
        _write_atomic(bad, {k: v for k, v in header.items() if k != "format_version"},
                      {**arrays, **change})
        with pytest.raises(SnapshotError, match=msg):
            restore(bad)
    with pytest.raises(SampanValueError, match="dynamic_dims"):
        HashEmbeddingTable(16, dynamic_dims=(4, 8), dim_thresholds=(3,))
    with pytest.raises(SampanValueError, match="dim_thresholds"):
        HashEmbeddingTable(16, dynamic_dims=DIMS, dim_thresholds=(5, 2))
    with pytest.raises(ValueError, match="float32"):
        HashEmbeddingTable(16, dynamic_dims=DIMS, dim_thresholds=CUTS, row_dtype="int8")


def test_bytes_per_row_reported():
    s = DynamicWidthRows(16, 4, DIMS, CUTS)
    s.ensure(4)
    s.set_raw([0, 1, 2, 3], {"values": np.ones((4, 16), np.float32),
                             "width": np.array([4, 4, 8, 16], np.uint8)})
    assert s.width_counts() == {4: 2, 8: 1, 16: 1}
    assert s.bytes_per_row == (16 + 16 + 32 + 64) / 4 + 5
    t, _, _ = _trained()
    bpr = t.bytes_per_row
    assert bpr["weights"] == t.weights.bytes_per_row and bpr["slots"] == 64
    fixed = HashEmbeddingTable(16, chunk_shift=4)
    fixed.lookup(t.ids())
    assert t.weights.bytes_per_row < fixed.bytes_per_row["weights"]


def test_dynamic_dlrm_through_export_restore_and_serve(tmp_path):
    import sampan
    from sampan.rec.data import ClickStream
    from sampan.rec.models import DLRM, train_step
    from sampan.serving.model import load_model
    from sampan.serving.rec import export_dlrm
    from tests.serving.rec_scenario import _linears, _mlp

    f, d, dim = 3, 3, 8
    sampan.manual_seed(0)
    model = DLRM(n_fields=f, n_dense=d, dim=dim, bottom=(8, dim), top=(8,),
                 dynamic_dims=(2, 4, 8), dim_thresholds=(2, 4), init_std=0.1)
    opt = sampan.optim.Adagrad(model.parameters(), lr=0.05)
    stream = ClickStream(seed=1, n_fields=f, n_dense=d)
    for i in range(4):
        b = stream.batch(i, 64)
        train_step(model, opt, b.ids_matrix(), b.dense, b.labels)
    table = model.embedding.emb.shards[0].table
    assert len([c for c in table.weights.width_counts().values() if c]) >= 2
    export_full(table, str(tmp_path / "train.full"))
    restored = restore(str(tmp_path / "train.full"))
    for k, v in table_state(table).items():
        np.testing.assert_array_equal(table_state(restored)[k], v, err_msg=k)
    model.embedding.emb.shards[0].table = restored
    out = str(tmp_path / "ctr")
    export_dlrm(model, out, max_batch_size=16)
    served = load_model("ctr", out)
    assert served.metadata()["embedding_bytes_per_row"] == restored.weights.bytes_per_row
    b = stream.batch(99, 8)
    ids = b.ids_matrix()
    got = served.infer({"dense_features": b.dense, "sparse_ids": ids})["probability"][:, 0]
    emb = restored.read(ids.ravel()).reshape(len(ids), f, dim).astype(np.float64)
    x = _mlp(b.dense.astype(np.float64), _linears(model.bottom), True)
    tt = np.concatenate([x[:, None], emb], axis=1)
    iu = np.triu_indices(f + 1, 1)
    pairs = np.einsum("bid,bjd->bij", tt, tt)[:, iu[0], iu[1]]
    z = _mlp(np.concatenate([x, pairs], axis=1), _linears(model.top), False)[:, 0]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-z)), atol=2e-6)


def test_a_hot_cache_in_front_of_dynamic_widths_is_refused():
    """HotCache trains full-width rows and writes full-width slots back: refused, named."""
    from sampan.rec.hotcache import HotCache
    from sampan.rec.sharded import LocalShard, ShardedEmbedding
    t = HashEmbeddingTable(16, dynamic_dims=(4, 8, 16), dim_thresholds=(2, 4))
    emb = ShardedEmbedding(16, shards=[LocalShard(t, SparseAdagrad(0.1))])
    with pytest.raises(SampanValueError, match="dynamic_dims"):
        HotCache(emb, budget_mb=1)
