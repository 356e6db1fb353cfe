"""Snapshots: full + deltas restore bit for bit, damage is refused, serving follows deltas."""

import os
import threading

import numpy as np
import pytest

from sampan.rec.optim import SparseAdagrad
from sampan.rec.policies import TTLEviction
from sampan.rec.snapshot import (
    ServingTable,
    SnapshotError,
    export_delta,
    export_full,
    read_snapshot,
    restore,
    table_state,
)
from sampan.rec.table import HashEmbeddingTable


def _train(table, steps, start, rng, opt):
    for step in range(start, start + steps):
        ids = rng.integers(0, 400, 256) * 1_000_003 - 17
        table.lookup(ids, step=step)
        opt.apply(table, ids, rng.standard_normal((ids.size, table.dim)), step=step)
        table.record(ids[:50], rng.integers(0, 2, 50))


def _assert_same(a, b):
    sa, sb = table_state(a), table_state(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


@pytest.fixture
def exported(tmp_path):
    rng = np.random.default_rng(0)
    table = HashEmbeddingTable(8, eviction=TTLEviction(ttl=1, window=64))
    opt = SparseAdagrad(0.1)
    paths = [str(tmp_path / f"emb.{i}") for i in range(4)]
    _train(table, 3, 0, rng, opt)
    export_full(table, paths[0])
    for i in range(1, 4):
        _train(table, 3, 3 * i, rng, opt)
        table.remove(rng.integers(0, 400, 30) * 1_000_003 - 17)
        export_delta(table, paths[i])
    return table, paths


def test_full_plus_deltas_restore_bit_for_bit(exported):
    live, paths = exported
    assert sum(read_snapshot(p)[1]["removed"].size for p in paths[1:]) > 0
    _assert_same(restore(paths[0], paths[1:]), live)
    assert not [f for f in os.listdir(os.path.dirname(paths[0])) if ".tmp" in f]


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic"])
def test_damaged_files_raise_and_load_nothing(exported, damage):
    live, paths = exported
    with open(paths[2], "rb") as f:
        data = bytearray(f.read())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) - 100]
    else:
        data[:4] = b"XXXX"
    with open(paths[2], "wb") as f:
        f.write(bytes(data))
    with pytest.raises(SnapshotError, match="checksum|magic|truncated"):
        restore(paths[0], paths[1:])
    serving = ServingTable(paths[0])
    serving.apply_delta(paths[1])
    ids = live.ids()
    before = serving.lookup(ids)
    with pytest.raises(SnapshotError):
        serving.apply_delta(paths[2])
    np.testing.assert_array_equal(serving.lookup(ids), before)


def test_out_of_order_deltas_are_refused(exported):
    _, paths = exported
    with pytest.raises(SnapshotError, match="out of order"):
        restore(paths[0], [paths[2]])
    with pytest.raises(SnapshotError, match="full"):
        restore(paths[1])


def test_serving_table_follows_deltas(exported):
    live, paths = exported
    serving = ServingTable(paths[0])
    for p in paths[1:]:
        serving.apply_delta(p)
    probe = np.concatenate([live.ids(), np.arange(400) * 1_000_003 - 17, [123456789]])
    np.testing.assert_array_equal(serving.lookup(probe), live.read(probe))
    assert len(serving) == len(live) and serving.step == live.step


def test_export_is_consistent_while_training_runs(tmp_path):
    """Weights and Adagrad slots in a snapshot must come from the same moment.

    With g = 1 and lr = 1, an id updated n times has acc = n and
    w = w0 - sum_k 1/sqrt(k); a torn copy breaks that relation.
    """
    table = HashEmbeddingTable(4, init_std=0.0)
    opt = SparseAdagrad(1.0)
    ids = np.arange(64, dtype=np.int64)
    table.lookup(ids)
    table.attach_slots(opt.slot_width(4))
    stop = threading.Event()

    def trainer():
        rng = np.random.default_rng(0)
        while not stop.is_set():
            pick = np.unique(rng.integers(0, 64, 40))
            opt.apply(table, pick, np.ones((pick.size, 4)))

    th = threading.Thread(target=trainer)
    th.start()
    try:
        ref = np.concatenate([[0.0], -np.cumsum(1.0 / np.sqrt(np.arange(1, 20001)))])
        for i in range(6):
            path = str(tmp_path / f"c{i}")
            export_full(table, path)
            _, arrays = read_snapshot(path)
            n = arrays["slots"][:, 0].astype(np.int64)
            np.testing.assert_array_equal(arrays["slots"], n[:, None].repeat(4, 1))
            np.testing.assert_allclose(arrays["weights"][:, 0], ref[n], rtol=2e-4)
    finally:
        stop.set()
        th.join()


def test_failed_write_keeps_rows_for_the_next_delta(tmp_path, monkeypatch):
    import sampan.rec.snapshot as snap

    table = HashEmbeddingTable(4)
    table.lookup(np.arange(10))
    export_full(table, str(tmp_path / "full"))
    table.set_vectors([3, 4], np.ones((2, 4)))
    table.remove([5])

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(snap, "_write_atomic", boom)
    with pytest.raises(OSError, match="disk full"):
        export_delta(table, str(tmp_path / "d1"))
    monkeypatch.undo()
    header = export_delta(table, str(tmp_path / "d1"))
    assert header["seq"] == 1
    _, arrays = read_snapshot(str(tmp_path / "d1"))
    assert sorted(arrays["ids"].tolist()) == [3, 4] and arrays["removed"].tolist() == [5]
    _assert_same(restore(str(tmp_path / "full"), [str(tmp_path / "d1")]), table)


def test_sharded_export_restores_every_shard(tmp_path):
    from sampan.rec.sharded import ShardedEmbedding
    from sampan.rec.snapshot import export_sharded, restore_sharded

    emb = ShardedEmbedding(4, n_shards=3, optimizer_factory=lambda: SparseAdagrad(0.1))
    rng = np.random.default_rng(0)
    for step in range(3):
        uniq, _, vec = emb.pull(rng.integers(0, 500, 300), step)
        emb.push(uniq, np.ones_like(vec), step)
    export_sharded(emb, str(tmp_path), "full")
    for step in range(3, 5):
        uniq, _, vec = emb.pull(rng.integers(300, 900, 300), step)
        emb.push(uniq, np.ones_like(vec), step)
    m = export_sharded(emb, str(tmp_path), "delta")
    assert m["n_shards"] == 3 and m["seq"] == 1
    tables = restore_sharded(str(tmp_path), [0, 1])
    for restored, shard in zip(tables, emb.shards):
        _assert_same(restored, shard.table)
    emb.close()
