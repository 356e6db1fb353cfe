"""Embedding shards as Ray actors against the in-process backend (one local Ray cluster)."""

import re
import sys

import numpy as np
import pytest

import sampan
from sampan.errors import SampanError
from sampan.rec.data import ClickStream
from sampan.rec.models import DLRM, HashEmbedding, train_step
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import LocalShard, Prefetcher, ShardedEmbedding
from sampan.rec.snapshot import restore_sharded, table_state
from tests.rec._raylock import one_cluster_at_a_time, start_cluster

ray = pytest.importorskip("ray", reason="ray is not installed (sampan's 'dist' extra)")

DIM, FIELDS, DENSE = 4, 8, 5


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """One local cluster and one 2-shard remote embedding for the module (actor start-up
    dominates: tests ``clear()`` it instead of starting new actors)."""
    with one_cluster_at_a_time():
        start_cluster(ray, num_cpus=2, object_store_memory=200 * 2**20, configure_logging=False)
        emb = ShardedEmbedding(DIM, n_shards=2, backend="ray", delta_every=3,
                               snapshot_dir=str(tmp_path_factory.mktemp("ps")),
                               optimizer_factory=lambda: SparseAdagrad(0.05))
        yield emb
        emb.close()
        ray.shutdown()


def _batches(n, size=128):
    stream = ClickStream(seed=0, n_fields=FIELDS, n_dense=DENSE, vocab=5000)
    return [stream.batch(i, size) for i in range(n)]


def _model(emb):
    sampan.manual_seed(0)
    m = DLRM(n_fields=FIELDS, n_dense=DENSE, dim=DIM, bottom=(8, DIM), top=(8,),
             embedding=HashEmbedding(DIM, emb=emb))
    return m, sampan.optim.Adagrad(m.parameters(), lr=0.05)


def _train(emb, batches, prefetch=False, kill_at=None):
    m, opt = _model(emb)
    losses = []
    if prefetch:
        pf = Prefetcher(emb, batches, ids_of=lambda b: b.ids_matrix())
        for step, pb in enumerate(pf):
            b = pb.batch
            losses.append(train_step(m, opt, b.ids_matrix(), b.dense, b.labels, pulled=pb))
            pf.done()
            if step == kill_at:
                emb.kill_shard(0)
        pf.close()
    else:
        for step, b in enumerate(batches):
            losses.append(train_step(m, opt, b.ids_matrix(), b.dense, b.labels))
            if step == kill_at:
                emb.kill_shard(0)
    return m, losses


def _local():
    return ShardedEmbedding(DIM, n_shards=2, optimizer_factory=lambda: SparseAdagrad(0.05))


def _assert_same_tables(local, remote_states):
    for shard, got in zip(local.shards, remote_states):
        want = table_state(shard.table)
        assert set(want) == set(got)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_remote_matches_local_and_recovers_a_killed_shard_exactly(remote):
    batches = _batches(20)
    local = _local()
    m_ref, loss_ref = _train(local, batches)
    # 20 synchronous steps: bit-identical tables and losses
    remote.clear()
    m, loss = _train(remote, batches)
    assert loss == loss_ref
    _assert_same_tables(local, remote.states())
    # the same through the prefetcher (staleness 0), with shard 0 killed after step 10:
    # it restores its last snapshot (the delta after push 9) and the caller re-sends
    # exactly the calls since then, so nothing is lost or applied twice
    remote.clear()
    m, loss = _train(remote, batches, prefetch=True, kill_at=10)
    remote.flush()
    assert loss == loss_ref
    _assert_same_tables(local, remote.states())
    (rest,) = remote.restores()[0]
    # the delta after push 9 (step 8; batch 9 may have been pulled before it), or, when
    # its file was still being written at the kill, the one after push 6
    assert rest["step"] in (5, 6, 8, 9) and rest["op"] > 0 and rest["files"] >= 2
    assert remote.restores()[1] == []
    for a, b in zip(m.parameters(), m_ref.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    local.close()


def test_arrays_through_the_arena_and_batched_calls_give_the_same_tables(remote,
                                                                       monkeypatch):
    from sampan.rec import _shm
    monkeypatch.setattr(_shm, "MIN_BYTES", 0)  # this test's arrays are small: all of them
    assert all(s.shm for s in remote.shards)   # the actors run on this host
    batches = _batches(8)
    local = _local()
    _, loss_ref = _train(local, batches)
    remote.clear()
    # a push waits in its shard's outbox for the next call, and leaves with it
    uniq, _, v = remote.pull(batches[0].ids_matrix(), 0)
    remote.push(uniq, np.zeros_like(v), 0)
    assert all(len(s.outbox) == 1 for s in remote.shards)
    remote.read(uniq[:3])
    assert not any(s.outbox for s in remote.shards)
    remote.clear()
    _, loss = _train(remote, batches, prefetch=True, kill_at=4)
    remote.flush()
    assert loss == loss_ref
    _assert_same_tables(local, remote.states())
    assert len(remote.restores()[0]) == 1
    for s in remote.shards:  # every slot given back
        assert not s.arena._live
    local.close()


def test_staleness_one_stays_close_to_synchronous(remote):
    batches = _batches(12)
    remote.clear()
    remote.max_staleness = 1
    try:
        _, loss = _train(remote, batches, prefetch=True)
    finally:
        remote.max_staleness = 0
    local = _local()
    _, ref = _train(local, batches)
    assert loss[0] == ref[0]  # later steps may miss the previous step's push
    assert abs(np.mean(loss) - np.mean(ref)) < 0.01
    local.close()


def test_resize_two_shards_into_three_row_by_row(remote, tmp_path):
    remote.clear()
    _train(remote, _batches(6))
    before = {k: np.concatenate([s[k] for s in remote.states()])
              for k in ("ids", "weights", "slots", "meta.freq", "meta.updated")}
    remote.export_sharded(str(tmp_path))
    tables = restore_sharded(str(tmp_path), [0], n_shards=3)
    assert len(tables) == 3
    grown = ShardedEmbedding(DIM, shards=[LocalShard(t) for t in tables])
    order = np.argsort(before["ids"])
    seen = 0
    for i, t in enumerate(tables):
        st = table_state(t)
        seen += st["ids"].size
        assert (grown.shard_of(st["ids"]) == i).all()  # each row on its new shard
        j = order[np.searchsorted(before["ids"][order], st["ids"])]
        for k, a in before.items():
            np.testing.assert_array_equal(a[j], st[k], err_msg=k)
    assert seen == before["ids"].size
    np.testing.assert_array_equal(grown.read(before["ids"]), before["weights"])
    grown.close()


def test_errors_match_local_and_an_unresponsive_shard_times_out(remote):
    remote.clear()
    local = _local()
    for bad in (np.array([1.5, 2.0]), np.array(["a"]), np.array([2**63], np.uint64)):
        with pytest.raises(SampanError) as want:
            local.pull(bad)
        with pytest.raises(type(want.value)) as got:
            remote.pull(bad)
        # the same message, naming the caller's own line (which differs here)
        assert re.sub(r"\.py:\d+", "", str(got.value)) == re.sub(r"\.py:\d+", "",
                                                                 str(want.value))
    remote.pull(np.array([[1, 2], [3, 4]]), 5)
    remote.shards[1].actor.call.remote("sleep", None, 0, 2.0)
    remote.timeout = 0.5
    try:
        with pytest.raises(SampanError, match=r"shard 1 did not answer within 0.5 s; its "
                                              r"last known step is 5"):
            remote.read(np.array([1, 2, 3]))
    finally:
        remote.timeout = 60.0
    local.close()


def test_missing_ray_names_the_dist_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SampanError, match="'dist' extra"):
        ShardedEmbedding(DIM, n_shards=2, backend="ray")
    with pytest.raises(ValueError, match="backend"):
        ShardedEmbedding(DIM, backend="spark")


@pytest.mark.slow
def test_200_steps_with_a_kill_keep_the_undisturbed_auc(remote):
    from sampan.rec.metrics import auc
    from sampan.rec.models import predict
    batches = _batches(200, size=256)
    held = _batches(1, size=4096)[0]  # batch 0 of another size: other samples
    aucs = []
    for kill in (None, 100):
        remote.clear()
        m, _ = _train(remote, batches, prefetch=True, kill_at=kill)
        aucs.append(auc(predict(m, held.ids_matrix(), held.dense), held.labels))
    assert len(remote.restores()[0]) == 1
    assert abs(aucs[0] - aucs[1]) <= 0.01 and aucs[0] > 0.6
