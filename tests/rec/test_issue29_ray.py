"""Issue 29, items 20 and 21: a local Ray cluster listens on loopback only (and works in
a network namespace that has nothing else), and ``close()`` stops and joins the shards'
snapshot writers before it removes anything, even while they are busy."""
import os
import sys
import textwrap

import numpy as np
import pytest

from sampan.rec._server import _chain
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import ShardedEmbedding
from sampan.rec.snapshot import restore, table_state
from tests.rec._raylock import one_cluster_at_a_time, start_cluster
from tests.distributed.netcheck import descendants, in_loopback_namespace, is_loopback, \
    listening

ray = pytest.importorskip("ray", reason="ray is not installed (sampan's 'dist' extra)")

DIM = 4
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cluster():
    """One local cluster whose workers write snapshot files slowly (the hook)."""
    with one_cluster_at_a_time():
        start_cluster(ray, num_cpus=2, object_store_memory=100 * 2**20,
                      configure_logging=False,
                      runtime_env={"worker_process_setup_hook":
                                   "tests.rec._issue29_slow_writer.install"})
        yield
        ray.shutdown()


def _emb(snapshot_dir=None):
    return ShardedEmbedding(DIM, n_shards=2, backend="ray", delta_every=1,
                            snapshot_dir=snapshot_dir,
                            optimizer_factory=lambda: SparseAdagrad(0.05))


def _steps(embs, n=3):
    """The same pulls and pushes on each embedding: with delta_every=1 every push queues
    a delta on each shard, and each takes the hook's 0.3 s to write."""
    for k in range(n):
        ids = np.arange(40, dtype=np.int64) + 7 * k
        grads = np.full((ids.size, DIM), 0.1 * (k + 1), np.float32)
        for e in embs:
            u, inv, _ = e.pull(ids, k)
            e.push(u, grads[: u.size], k)


def test_local_cluster_listens_on_loopback_only(cluster):
    emb = _emb()
    try:
        _steps([emb], 1)
        socks = listening(descendants(os.getpid()))   # GCS, raylet, agents, workers
        assert socks, "found no Ray server sockets"
        outside = [s for s in socks if not is_loopback(s[0])]
        assert not outside, f"Ray servers listen beyond loopback: {outside}"
        node = ray.nodes()[0]["NodeManagerAddress"]
        assert node == "127.0.0.1"
    finally:
        emb.close()


def test_close_joins_busy_snapshot_writers(cluster, tmp_path):
    # a temporary snapshot folder: close removes it while the writers are busy
    emb = _emb()
    folder = emb.snapshot_dir
    _steps([emb])
    emb.close()                                   # no "Directory not empty"
    assert not os.path.exists(folder)
    # a folder of the caller's: every queued delta reached it before the actors went
    local = ShardedEmbedding(DIM, n_shards=2, optimizer_factory=lambda: SparseAdagrad(0.05))
    emb = _emb(str(tmp_path))
    _steps([emb, local])
    emb.close()
    for i, shard in enumerate(local.shards):
        chain = _chain(str(tmp_path / f"shard_{i}"))
        assert chain[-1][2] == 6, chain   # 3 pulls + 3 pushes, all on disk
        got = table_state(restore(chain[0][3], [c[3] for c in chain[1:]]))
        want = table_state(shard.table)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    local.close()


def test_shards_pull_and_push_in_a_loopback_only_namespace(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, ray
        from sampan.rec.remote import init_ray
        from sampan.rec.sharded import ShardedEmbedding
        init_ray(ray, num_cpus=1, object_store_memory=80 * 2**20, configure_logging=False)
        remote = ShardedEmbedding(4, n_shards=2, backend="ray")
        local = ShardedEmbedding(4, n_shards=2)
        ids = np.arange(50, dtype=np.int64)
        for e in (remote, local):
            u, inv, v = e.pull(ids, 0)
            e.push(u, np.ones_like(v), 0)
        np.testing.assert_array_equal(remote.read(ids), local.read(ids))
        print("node", ray.nodes()[0]["NodeManagerAddress"])
        remote.close()
        ray.shutdown()
        print("ok")
    """)
    (tmp_path / "job.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1")
    with one_cluster_at_a_time():
        p = in_loopback_namespace(f"exec {sys.executable} {tmp_path / 'job.py'}", env=env)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
    assert "node 127.0.0.1" in p.stdout
