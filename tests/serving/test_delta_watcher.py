"""The snapshot watcher of served recommendation models, without a server: sequence
order, refusals that leave the table as it was, repair by a newer full export, the
reader/writer lock, and the ``dlrm`` model directory's checks."""
import json
import logging
import os
import shutil
import threading
import time

import numpy as np
import pytest

from sampan.rec.snapshot import ServingTable, export_delta, export_full
from sampan.rec.table import HashEmbeddingTable
from sampan.serving import rec
from sampan.serving.model import ServingError, load_model
from sampan.serving.rec import SnapshotWatcher, _RWLock

IDS = np.arange(1, 41, dtype=np.int64)


@pytest.fixture
def chain(tmp_path):
    """A table, its full export, and a function that changes rows and exports a delta."""
    t = HashEmbeddingTable(4, seed=1)
    t.lookup(IDS)
    full = str(tmp_path / "emb.full")
    export_full(t, full)
    watched = tmp_path / "deltas"
    watched.mkdir()
    states = {0: t.read(IDS)}

    def delta(path=None, rows=IDS[:10]):
        t.set_vectors(rows, t.read(rows) + 1.0)
        seq = t.export_seq + 1
        export_delta(t, str(path or watched / f"{seq:06d}.delta"))
        states[seq] = t.read(IDS)
        return seq

    return t, full, str(watched), delta, states


def _served(w):
    return w.lookup(IDS.reshape(-1, 1))[:, 0]


def test_applies_in_sequence_order_whatever_the_names(chain, tmp_path):
    t, full, watched, delta, states = chain
    w = SnapshotWatcher(ServingTable(full), watched)
    delta(os.path.join(watched, "zz.delta"))       # seq 1 under a later name
    delta(os.path.join(watched, "aa.delta"))       # seq 2
    got = w.poll()
    assert [os.path.basename(p) for p, o in got if o == "applied"] == ["zz.delta", "aa.delta"]
    np.testing.assert_array_equal(_served(w), states[2])
    s = w.state()
    assert (s["snapshot_sequence"], s["snapshot_step"], s["applied_deltas"]) == (2, t.step, 2)
    assert w.poll() == []                          # nothing new: nothing read again


def test_refusals_leave_the_table_as_it_was(chain, tmp_path, caplog):
    _t, full, watched, delta, states = chain
    w = SnapshotWatcher(ServingTable(full), watched)
    delta()
    w.poll()
    before = _served(w).copy()
    # corrupt: a delta truncated by a crash (copied in by hand)
    d2 = tmp_path / "d2"
    delta(d2)
    data = d2.read_bytes()
    (tmp_path / "cut").write_bytes(data[:-40])
    os.replace(tmp_path / "cut", os.path.join(watched, "cut.delta"))
    # duplicate: export 1 again under another name
    shutil.copy(os.path.join(watched, "000001.delta"), os.path.join(watched, "again.delta"))
    # foreign: a delta of another table
    other = HashEmbeddingTable(4, seed=1)
    other.lookup(IDS)
    export_full(other, str(tmp_path / "other.full"))
    other.set_vectors(IDS[:3], np.ones((3, 4), np.float32))
    export_delta(other, os.path.join(watched, "other.delta"))
    with caplog.at_level(logging.WARNING, logger="sampan.serving"):
        got = {os.path.basename(p): o for p, o in w.poll()}
    assert got["cut.delta"].startswith("refused: corrupt") and "truncated" in got["cut.delta"]
    assert got["again.delta"].startswith("refused: duplicate or stale")
    assert "lineage" in got["other.delta"]
    np.testing.assert_array_equal(_served(w), before)
    s = w.state()
    assert s["snapshot_sequence"] == 1 and s["refused_deltas"] == 3
    assert s["last_refused"]["file"] in got
    assert sum("refused snapshot" in r.message for r in caplog.records) == 3
    # the real export 2 still applies afterwards
    shutil.copy(d2, os.path.join(watched, "000002.delta"))
    assert w.poll()[0][1] == "applied"
    np.testing.assert_array_equal(_served(w), states[2])


def test_a_delta_that_skips_one_is_held_until_the_missing_one_arrives(chain, tmp_path):
    _t, full, watched, delta, states = chain
    w = SnapshotWatcher(ServingTable(full), watched)
    held = tmp_path / "000001.delta"
    delta(held)
    delta()                                        # 000002.delta, follows the held one
    assert [o for _, o in w.poll()] == ["held"]
    assert w.state()["snapshot_sequence"] == 0 and w.state()["held_deltas"] == 1
    np.testing.assert_array_equal(_served(w), states[0])
    os.replace(held, os.path.join(watched, "000001.delta"))
    assert [o for _, o in w.poll()] == ["applied", "applied"]
    assert w.state()["snapshot_sequence"] == 2 and w.state()["refused_deltas"] == 0
    np.testing.assert_array_equal(_served(w), states[2])


def test_one_listing_that_misses_a_file_is_not_a_gap(chain, monkeypatch):
    _t, full, watched, delta, _states = chain
    w = SnapshotWatcher(ServingTable(full), watched)
    delta()
    delta()
    real, calls = os.listdir, []

    def listdir(d):  # the first listing misses 000001 (renamed in while it ran)
        calls.append(d)
        names = real(d)
        return [n for n in names if n != "000001.delta"] if len(calls) == 1 else names

    monkeypatch.setattr(rec.os, "listdir", listdir)
    assert [o for _, o in w.poll()] == ["applied", "applied"]
    assert len(calls) == 2 and w.state()["refused_deltas"] == 0


def test_a_newer_full_export_repairs_a_broken_chain(chain, tmp_path):
    t, full, watched, delta, _states = chain
    w = SnapshotWatcher(ServingTable(full), watched)
    delta(tmp_path / "lost.delta")                 # export 1 never arrives
    t.set_vectors(IDS[:5], np.zeros((5, 4), np.float32))
    export_full(t, os.path.join(watched, "000002.full"))
    shutil.copy(full, os.path.join(watched, "000000.full"))
    got = {os.path.basename(p): o for p, o in w.poll()}
    assert got == {"000000.full": "ignored", "000002.full": "applied"}
    np.testing.assert_array_equal(_served(w), t.read(IDS))
    delta()
    w.poll()
    assert w.state()["snapshot_sequence"] == 3
    np.testing.assert_array_equal(_served(w), t.read(IDS))


def test_watcher_thread_starts_catches_up_and_stops(chain):
    _t, full, watched, delta, _states = chain
    delta()
    w = SnapshotWatcher(ServingTable(full), watched, poll_interval=0.005, name="m")
    w.start()
    try:
        assert w.state()["snapshot_sequence"] == 1   # caught up before start returns
        delta()
        t0 = time.monotonic()
        while w.state()["snapshot_sequence"] != 2:
            assert time.monotonic() - t0 < 10
            time.sleep(0.005)
    finally:
        w.stop()
    assert not [th for th in threading.enumerate() if th.name.endswith("-snapshots")]


def test_rwlock_lets_a_waiting_writer_in_before_new_readers():
    lock, order = _RWLock(), []
    reading, writer_waits = threading.Event(), threading.Event()

    def reader1():
        with lock.shared():
            reading.set()
            writer_waits.wait()
            time.sleep(0.05)
            order.append("r1")

    def writer():
        reading.wait()
        writer_waits.set()
        with lock.exclusive():
            order.append("w")

    def reader2():
        writer_waits.wait()
        time.sleep(0.02)              # the writer is waiting by now
        with lock.shared():
            order.append("r2")

    ts = [threading.Thread(target=f) for f in (reader1, writer, reader2)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    assert order == ["r1", "w", "r2"]


def _demo(tmp_path):
    d = str(tmp_path / "demo")
    rec.export_demo_dlrm(d, steps=4, n_deltas=2)
    return d


def test_demo_directory_serves_and_updates(tmp_path):
    d = _demo(tmp_path)
    m = load_model("ctr", d)
    assert [(s.name, s.datatype, s.shape) for s in m.inputs + m.outputs] == [
        ("dense_features", "FP32", (-1, 4)), ("sparse_ids", "INT64", (-1, 8)),
        ("probability", "FP32", (-1, 1))]
    x = rec.demo_inputs(5, seed=1)
    p0 = m.infer(x)["probability"]
    assert p0.shape == (5, 1) and p0.dtype == np.float32 and ((p0 > 0) & (p0 < 1)).all()
    # batching pads to a bucket: each row's answer is that of the row alone
    one = np.concatenate([m.infer({k: v[i:i + 1] for k, v in x.items()})["probability"]
                          for i in range(5)])
    np.testing.assert_allclose(one, p0, rtol=1e-6, atol=1e-7)
    for f in sorted(os.listdir(os.path.join(d, "spare_deltas"))):
        os.replace(os.path.join(d, "spare_deltas", f), os.path.join(d, "deltas", f))
    m.watcher.poll()
    assert m.metadata()["snapshot_sequence"] == 2
    assert np.abs(m.infer(x)["probability"] - p0).max() > 1e-5


def test_bad_inputs_and_directories_name_what_is_wrong(tmp_path):
    d = _demo(tmp_path)
    m = load_model("ctr", d)
    x = rec.demo_inputs(2)
    with pytest.raises(ServingError, match="'sparse_ids' is missing"):
        m.infer({"dense_features": x["dense_features"]})
    with pytest.raises(ServingError, match=r"'sparse_ids' is int32\[2, 8\], expected int64"):
        m.infer(dict(x, sparse_ids=x["sparse_ids"].astype(np.int32)))
    with pytest.raises(ServingError, match=r"'dense_features' is float32\[2, 5\]"):
        m.infer(dict(x, dense_features=np.zeros((2, 5), np.float32)))
    with pytest.raises(ServingError, match=r"unknown input\(s\) \['ids'\]"):
        m.infer(dict(x, ids=x["sparse_ids"]))
    with pytest.raises(ServingError, match="has 1 rows"):
        m.infer(dict(x, dense_features=x["dense_features"][:1]))
    assert m.infer({k: v[:0] for k, v in x.items()})["probability"].shape == (0, 1)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    for bad, match in [({"n_fields": "8"}, "'n_fields' must be an integer"),
                       ({"embeddings": "nope.full"}, "cannot load"),
                       ({"dim": 3}, "embeddings have dim 8"),
                       ({"poll_interval_ms": 0}, "poll_interval_ms")]:
        with open(cfg_path, "w") as f:
            json.dump(dict(cfg, **bad), f)
        with pytest.raises(ServingError, match=match):
            load_model("ctr", d)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(d, "embeddings.full"), "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff")
    with pytest.raises(ServingError, match="checksum"):
        load_model("ctr", d)
