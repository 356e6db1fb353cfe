"""Issue 29, item 7: deltas that arrive out of order (2, 1, 3, as a parallel copy drops
them) are held until the chain is complete and then applied, so the served table ends
equal to the trainer's (read back from the live table); only foreign and duplicate
exports are refused. Holding is bounded in count and age, shown in the metadata, the
logs and /metrics."""
import logging
import os
import shutil
import time

import httpx
import numpy as np
import pytest

from sampan.rec.snapshot import ServingTable, export_delta, export_full
from sampan.rec.table import HashEmbeddingTable
from sampan.serving.model import ServedModel, TensorSpec
from sampan.serving.rec import SnapshotWatcher

IDS = np.arange(1, 41, dtype=np.int64)


@pytest.fixture
def chain(tmp_path):
    """A table, its full export, and `delta(k)`: change rows, export delta k to a spare
    folder (so the test drops them into the watched one in any order)."""
    t = HashEmbeddingTable(4, seed=1)
    t.lookup(IDS)
    full = str(tmp_path / "emb.full")
    export_full(t, full)
    watched = tmp_path / "deltas"
    watched.mkdir()
    spare = tmp_path / "spare"
    spare.mkdir()
    states = {0: t.read(IDS)}

    def delta():
        t.set_vectors(IDS[:10], t.read(IDS[:10]) + 1.0)
        seq = t.export_seq + 1
        export_delta(t, str(spare / f"{seq:06d}.delta"))
        states[seq] = t.read(IDS)
        return seq

    def drop(seq):
        shutil.copy(spare / f"{seq:06d}.delta", watched / f"{seq:06d}.delta")

    return t, full, str(watched), delta, drop, states


def _served(w):
    return w.lookup(IDS.reshape(-1, 1))[:, 0]


def test_deltas_dropped_2_1_3_are_all_applied(chain, caplog):
    _t, full, watched, delta, drop, states = chain
    for _ in range(3):
        delta()
    w = SnapshotWatcher(ServingTable(full), watched)
    drop(2)
    with caplog.at_level(logging.INFO, logger="sampan.serving"):
        assert [o for _, o in w.poll()] == ["held"]
    s = w.state()
    assert s["snapshot_sequence"] == 0 and s["held_deltas"] == 1 and s["refused_deltas"] == 0
    assert any("holding" in r.message and "000002.delta" in r.message for r in caplog.records)
    np.testing.assert_array_equal(_served(w), states[0])
    drop(1)
    assert [(os.path.basename(p), o) for p, o in w.poll()] == [
        ("000001.delta", "applied"), ("000002.delta", "applied")]
    assert w.state()["held_deltas"] == 0
    np.testing.assert_array_equal(_served(w), states[2])
    drop(3)
    assert [o for _, o in w.poll()] == ["applied"]
    s = w.state()
    assert (s["snapshot_sequence"], s["applied_deltas"], s["refused_deltas"]) == (3, 3, 0)
    np.testing.assert_array_equal(_served(w), states[3])


def test_duplicates_and_foreigners_are_still_refused(chain, tmp_path):
    _t, full, watched, delta, drop, states = chain
    delta()
    delta()
    w = SnapshotWatcher(ServingTable(full), watched)
    drop(2)
    shutil.copy(os.path.join(watched, "000002.delta"), os.path.join(watched, "copy2.delta"))
    other = HashEmbeddingTable(4, seed=1)
    other.lookup(IDS)
    export_full(other, str(tmp_path / "other.full"))
    other.set_vectors(IDS[:3], np.ones((3, 4), np.float32))
    export_delta(other, os.path.join(watched, "other.delta"))
    got = {os.path.basename(p): o for p, o in w.poll()}
    assert got["000002.delta"] == "held" and got["copy2.delta"] == "held"
    assert "lineage" in got["other.delta"]
    drop(1)
    got = {os.path.basename(p): o for p, o in w.poll()}
    assert got["000001.delta"] == "applied" and got["000002.delta"] == "applied"
    assert got["copy2.delta"].startswith("refused: duplicate")
    s = w.state()
    assert s["held_deltas"] == 0 and s["refused_deltas"] == 2
    np.testing.assert_array_equal(_served(w), states[2])


def test_holding_is_bounded_in_count_and_age(chain, caplog):
    _t, full, watched, delta, drop, states = chain
    for _ in range(5):
        delta()
    w = SnapshotWatcher(ServingTable(full), watched, max_held=2, max_held_seconds=0.2)
    for k in (2, 3, 4):
        drop(k)
    with caplog.at_level(logging.WARNING, logger="sampan.serving"):
        got = {os.path.basename(p): o for p, o in w.poll()}
    # the earliest are kept: they are the ones the missing delta lets through first
    assert got["000002.delta"] == "held" and got["000003.delta"] == "held"
    assert got["000004.delta"].startswith("refused: out of order") and "held" in got[
        "000004.delta"]
    assert w.state()["held_deltas"] == 2
    time.sleep(0.3)
    with caplog.at_level(logging.WARNING, logger="sampan.serving"):
        got = {os.path.basename(p): o for p, o in w.poll()}
    assert set(got) == {"000002.delta", "000003.delta"}
    assert all(o.startswith("refused: out of order") and "waited" in o for o in got.values())
    s = w.state()
    assert s["held_deltas"] == 0 and s["refused_deltas"] == 3
    assert sum("refused snapshot" in r.message for r in caplog.records) == 3
    np.testing.assert_array_equal(_served(w), states[0])


def test_a_newer_full_export_settles_what_is_held(chain):
    t, full, watched, delta, drop, states = chain
    for _ in range(3):
        delta()
    w = SnapshotWatcher(ServingTable(full), watched)
    drop(2)
    drop(3)
    assert sorted(o for _, o in w.poll()) == ["held", "held"]
    export_full(t, os.path.join(watched, "000003.full"))     # export 4: a full
    got = {os.path.basename(p): o for p, o in w.poll()}
    assert got["000003.full"] == "applied"
    assert got["000002.delta"].startswith("refused") and got["000003.delta"].startswith(
        "refused")
    assert w.state()["snapshot_sequence"] == t.export_seq and w.state()["held_deltas"] == 0
    np.testing.assert_array_equal(_served(w), t.read(IDS))


class Gauged(ServedModel):
    def __init__(self):
        super().__init__(name="g", inputs=[TensorSpec("x", "FP32", (-1, 1))],
                         outputs=[TensorSpec("y", "FP32", (-1, 1))], max_batch_size=0)

    def infer(self, inputs):
        return {"y": inputs["x"]}

    def gauges(self):
        return {"held_deltas": 2, "snapshot_sequence": 7}


def test_model_gauges_reach_metrics():
    from sampan.serving import Server
    with Server({"g": Gauged()}) as s:
        text = httpx.get(s.url + "/metrics").text
    assert 'sampan_model_held_deltas{model="g"} 2.0' in text, text
    assert 'sampan_model_snapshot_sequence{model="g"} 7.0' in text
