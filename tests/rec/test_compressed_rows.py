"""Compressed rows: float16 / bfloat16 / int8 (per-row scale) storage, trained through
the sparse optimisers, exported, restored and served by the dlrm kind."""

import ml_dtypes
import numpy as np
import pytest

from sampan.errors import SampanValueError
from sampan.rec.optim import SparseAdagrad, SparseAdam
from sampan.rec.rowstore import CompressedRows, make_rows
from sampan.rec.snapshot import (ServingTable, SnapshotError, export_delta, export_full,
                                 restore, table_state)
from sampan.rec.table import HashEmbeddingTable

COMPRESSED = ["float16", "bfloat16", "int8"]


def _vals(n=300, w=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, w)) * rng.uniform(1e-3, 3, (n, 1))).astype(np.float32)


@pytest.mark.parametrize("dt", COMPRESSED)
def test_store_round_trip_against_numpy(dt):
    v = _vals()
    c = CompressedRows(8, 6, dt)   # 64-row chunks: the rows span several
    c.ensure(v.shape[0] * 2)
    rows = np.random.default_rng(1).permutation(v.shape[0] * 2)[: v.shape[0]]
    c.scatter(rows, v)
    got = c.gather(rows)
    if dt == "float16":
        want = v.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(got, want)
    elif dt == "bfloat16":
        want = v.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(got, want)
    else:
        # per row: error at most half a step of the row's scale (max|w| / 127, rounded up
        # by at most one bfloat16 ulp)
        step = np.abs(v).max(axis=1, keepdims=True) / 127 * (1 + 2**-7)
        assert (np.abs(got - v) <= step / 2 + 1e-12).all()
    assert c.bytes_per_row == {"float16": 16, "bfloat16": 16, "int8": 10}[dt]
    again = CompressedRows(8, 6, dt)
    again.ensure(c.capacity)
    again.set_raw(rows, c.raw(rows))
    np.testing.assert_array_equal(again.gather(rows), got)
    np.testing.assert_array_equal(c.gather(np.array([-1, rows[0]]))[0], np.zeros(8))


@pytest.mark.parametrize("dt", ["bfloat16", "int8"])
def test_stochastic_rounding_is_unbiased_and_repeatable(dt):
    c = CompressedRows(4, 12, dt)
    assert c.stochastic == (dt == "bfloat16")  # int8 rounds to nearest by default
    c.stochastic = True
    c.ensure(4096)
    base = np.tile(np.array([[1.0, 0.5, -0.25, 1.0]], np.float32), (4096, 1))
    tiny = base + np.float32(1e-3)  # far below one step of either grid
    rows = np.arange(4096)
    c.scatter(rows, tiny, round_keys=rows * 7 + 3)
    got = c.gather(rows)
    assert not np.array_equal(got[:, 0], np.full(4096, got[0, 0]))  # it does round both ways
    np.testing.assert_allclose(got.mean(axis=0), tiny[0], atol=2e-4)  # unbiased
    c.scatter(rows, tiny, round_keys=rows * 7 + 3)
    np.testing.assert_array_equal(c.gather(rows), got)  # the same keys: the same rounding


@pytest.mark.parametrize("dt", COMPRESSED)
@pytest.mark.parametrize("make_opt", [lambda: SparseAdagrad(0.05), lambda: SparseAdam(0.01)])
def test_optimiser_trains_compressed_rows_like_float32(dt, make_opt):
    ids = np.arange(64) * 13
    ref = HashEmbeddingTable(8, init_std=0.1)
    t = HashEmbeddingTable(8, init_std=0.1, row_dtype=dt, chunk_shift=4)
    o_ref, o = make_opt(), make_opt()
    target = _vals(64, 8, 3) * np.float32(0.3)
    start = np.abs(ref.lookup(ids) - target).mean()
    for step in range(30):
        for tab, opt in ((ref, o_ref), (t, o)):
            g = tab.lookup(ids, step) - target  # pull every row towards the target
            opt.apply(tab, ids, g, step)
    assert t.slots.chunks[0].dtype == np.float32  # optimiser state stays float32
    err_ref = np.abs(ref.read(ids) - target).mean()
    err = np.abs(t.read(ids) - target).mean()
    assert err_ref < 0.9 * start and err < err_ref + 0.02
    assert t.bytes_per_row["weights"] < ref.bytes_per_row["weights"]


def test_bad_row_dtype():
    with pytest.raises(SampanValueError, match="row_dtype='float64'"):
        HashEmbeddingTable(4, row_dtype="float64")
    assert make_rows(4, 4).row_dtype == "float32"


@pytest.mark.parametrize("dt", COMPRESSED)
def test_snapshot_restore_is_exact_and_prunes_for_serving(dt, tmp_path):
    t = HashEmbeddingTable(4, init_std=0.1, row_dtype=dt)
    opt = SparseAdagrad(0.1)
    ids = np.arange(200)
    t.lookup(ids, 0)
    opt.apply(t, ids, np.ones((200, 4), np.float32), 0)
    export_full(t, str(tmp_path / "a.full"))
    opt.apply(t, ids[:50], np.ones((50, 4), np.float32), 1)
    t.set_vectors(ids[150:], np.full((50, 4), 1e-5, np.float32))  # near-zero rows
    export_delta(t, str(tmp_path / "a.d1"))
    back = restore(str(tmp_path / "a.full"), [str(tmp_path / "a.d1")])
    assert back.row_dtype == dt
    want, got = table_state(t), table_state(back)
    assert set(want) == set(got)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # serving: the stored rows exactly, compressed in memory too
    s = ServingTable(str(tmp_path / "a.full"))
    s.apply_delta(str(tmp_path / "a.d1"))
    np.testing.assert_array_equal(s.lookup(ids), t.read(ids))
    assert s.bytes_per_row == t.weights.bytes_per_row
    # a pruned export leaves the near-zero rows out; restore refuses it
    h = export_full(t, str(tmp_path / "p.full"), prune_below=1e-3)
    assert h["pruned"]["rows"] == 50
    p = ServingTable(str(tmp_path / "p.full"))
    assert len(p) == 150 and p.pruned == 50
    np.testing.assert_array_equal(p.lookup(ids[150:]), np.zeros((50, 4), np.float32))
    np.testing.assert_array_equal(p.lookup(ids[:150]), t.read(ids[:150]))
    with pytest.raises(SnapshotError, match="pruned export"):
        restore(str(tmp_path / "p.full"))


def test_delta_of_other_row_dtype_is_refused(tmp_path):
    a = HashEmbeddingTable(4, row_dtype="int8")
    a.lookup([1, 2])
    export_full(a, str(tmp_path / "a.full"))
    s = ServingTable(str(tmp_path / "a.full"))
    a.row_dtype = "float16"  # a file claiming another dtype than the chain's
    a.weights = CompressedRows(4, a.weights.shift, "float16")
    a.weights.ensure(a.alloc.next_row)
    a.lookup([3])
    export_delta(a, str(tmp_path / "a.d1"))
    with pytest.raises(SnapshotError, match="rows of float16, the serving table holds int8"):
        s.apply_delta(str(tmp_path / "a.d1"))


def test_int8_dlrm_through_export_restore_and_serve(tmp_path):
    import sampan
    from sampan.rec.data import ClickStream
    from sampan.rec.models import DLRM, train_step
    from sampan.serving.model import load_model
    from tests.serving.rec_scenario import _linears, _mlp

    f, d, dim = 4, 3, 4
    sampan.manual_seed(0)
    model = DLRM(n_fields=f, n_dense=d, dim=dim, bottom=(8, dim), top=(8,),
                 row_dtype="int8", init_std=0.1)
    opt = sampan.optim.Adagrad(model.parameters(), lr=0.05)
    stream = ClickStream(seed=1, n_fields=f, n_dense=d)
    for i in range(4):
        b = stream.batch(i, 64)
        train_step(model, opt, b.ids_matrix(), b.dense, b.labels)
    table = model.embedding.emb.shards[0].table
    assert table.row_dtype == "int8"
    # snapshot -> restore: the restored table is the one the server is exported from
    export_full(table, str(tmp_path / "train.full"))
    restored = restore(str(tmp_path / "train.full"))
    assert restored.row_dtype == "int8"
    for k, v in table_state(table).items():
        np.testing.assert_array_equal(table_state(restored)[k], v, err_msg=k)
    model.embedding.emb.shards[0].table = restored
    b = stream.batch(99, 8)
    ids = b.ids_matrix()
    restored.set_vectors(ids[1, :1], np.full((1, dim), 1e-4, np.float32))  # pruned
    from sampan.serving.rec import export_dlrm
    out = str(tmp_path / "ctr")
    export_dlrm(model, out, prune_below=1e-3, max_batch_size=16)
    served = load_model("ctr", out)
    meta = served.metadata()
    assert meta["embedding_row_dtype"] == "int8" and meta["embedding_bytes_per_row"] == dim + 2
    assert meta["embedding_pruned_rows"] >= 1
    assert meta["embedding_rows"] == len(restored) - meta["embedding_pruned_rows"]
    ids[0, 0] = 123456789  # an id never trained: the default vector
    got = served.infer({"dense_features": b.dense, "sparse_ids": ids})["probability"][:, 0]
    emb = restored.read(ids.ravel()).reshape(len(ids), f, dim).astype(np.float64)
    emb[ids == ids[1, 0]] = 0.0  # the pruned row reads the default
    x = _mlp(b.dense.astype(np.float64), _linears(model.bottom), True)
    t = np.concatenate([x[:, None], emb], axis=1)
    iu = np.triu_indices(f + 1, 1)
    pairs = np.einsum("bid,bjd->bij", t, t)[:, iu[0], iu[1]]
    z = _mlp(np.concatenate([x, pairs], axis=1), _linears(model.top), False)[:, 0]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-z)), atol=2e-6)
