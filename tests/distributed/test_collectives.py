"""Collectives against numpy on the gathered inputs: inproc (2 replicas as threads, in this
process) and MPI (one `mpiexec -n 2` job running every check, see mpi_checks.py)."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
import sampan.distributed as dist
from sampan.dtypes import bfloat16

DTYPES = [np.float32, np.float64, bfloat16, np.int64]
N = 2


def _input(r, dtype, shape=(3, 5)):
    """Rank r's input: distinct per rank, exact in every dtype (small integers)."""
    rng = np.random.default_rng(10 + r)
    return rng.integers(-8, 9, size=shape).astype(dtype)


def _ref(op, arrays):
    a = np.stack([x.astype(np.float64) for x in arrays])
    return {"sum": a.sum(0), "mean": a.mean(0), "max": a.max(0), "min": a.min(0)}[op]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_inproc_collectives_match_numpy(dtype):
    ops = ["sum", "max", "min"] + ([] if np.dtype(dtype).kind == "i" else ["mean"])

    def body():
        r = dist.rank()
        out = {}
        for op in ops:
            x = _input(r, dtype)
            assert dist.all_reduce(x, op=op) is x
            out[op] = x
        b = _input(r, dtype)
        dist.broadcast(b, src=1)
        out["broadcast"] = b
        out["gather"] = dist.all_gather(_input(r, dtype, (r + 1, 2)))   # uneven dim 0
        out["rs"] = dist.reduce_scatter(_input(r, dtype, (4, 3)))
        return out

    res = dist.spawn(body, N)
    ins = [_input(r, dtype) for r in range(N)]
    for r in range(N):
        for op in ops:
            np.testing.assert_allclose(res[r][op].astype(np.float64), _ref(op, ins))
            assert res[r][op].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(res[r]["broadcast"], ins[1])
        for q in range(N):
            np.testing.assert_array_equal(res[r]["gather"][q], _input(q, dtype, (q + 1, 2)))
        full = _ref("sum", [_input(q, dtype, (4, 3)) for q in range(N)])
        np.testing.assert_allclose(res[r]["rs"].astype(np.float64), full[2 * r:2 * r + 2])


def test_inproc_async_tensors_and_send_recv():
    def body():
        r = dist.rank()
        t = sampan.tensor([1.0, 2.0, 3.0]) * (r + 1)
        v0 = t._version
        h = dist.all_reduce(t, op="mean", async_op=True)
        assert isinstance(h, dist.Work)
        assert h.wait() is t and h.is_completed()
        assert t._version > v0                   # in place: autograd sees the write
        hg = dist.all_gather(sampan.tensor([float(r)]), async_op=True)
        if r == 0:
            dist.send(np.arange(4.0), dst=1)
            got = None
        else:
            got = dist.recv((4,), src=0, dtype="float64")
        dist.barrier()
        return t.numpy().copy(), [g.numpy() for g in hg.wait()], got, dist.world_size()

    (t0, g0, _, n), (t1, g1, got, _) = dist.spawn(body, N)
    np.testing.assert_allclose(t0, [1.5, 3.0, 4.5])
    np.testing.assert_allclose(t1, t0)
    np.testing.assert_array_equal(np.concatenate(g0), [0.0, 1.0])
    np.testing.assert_array_equal(np.concatenate(g1), [0.0, 1.0])
    np.testing.assert_array_equal(got, np.arange(4.0))
    assert n == N


def test_collective_before_init_and_single_rank():
    assert not dist.is_initialized()
    with pytest.raises(dist.DistributedError, match="init"):
        dist.all_reduce(np.ones(2))
    with pytest.raises(dist.DistributedError, match="init"):
        dist.rank()
    g = dist.init("auto")
    try:
        assert dist.world_size() == 1 and dist.rank() == 0 and g.backend == "inproc"
        x = np.arange(3.0)
        dist.all_reduce(x)
        np.testing.assert_array_equal(x, np.arange(3.0))
    finally:
        dist.destroy()
    assert not dist.is_initialized()


def test_mismatch_across_ranks_is_named():
    def shapes():
        dist.all_reduce(np.ones(2 + dist.rank(), np.float32))

    with pytest.raises(dist.ReplicaError, match=r"rank 1 passed float32\[3\]"):
        dist.spawn(shapes, N, timeout=5)

    def order():
        if dist.rank() == 0:
            dist.all_reduce(np.ones(2))
        else:
            dist.broadcast(np.ones(2))

    with pytest.raises(dist.DistributedError, match="rank . called"):
        dist.spawn(order, N, timeout=5)
    with pytest.raises(dist.DistributedError, match="mean"):
        dist.spawn(lambda: dist.all_reduce(np.ones(2, np.int64), op="mean"), N, timeout=5)
    with pytest.raises(dist.DistributedError, match="src=5"):
        dist.spawn(lambda: dist.broadcast(np.ones(2), src=5), N, timeout=5)


def test_replica_failure_is_named_and_does_not_hang():
    def body():
        if dist.rank() == 1:
            raise ValueError("boom in rank 1")
        dist.all_reduce(np.ones(2))          # would wait for rank 1 forever

    with pytest.raises(dist.ReplicaError, match="rank 1 of 2 raised ValueError") as e:
        dist.spawn(body, N, timeout=30)
    assert e.value.rank == 1 and isinstance(e.value.__cause__, ValueError)


def test_timeout_names_missing_rank():
    def body():
        if dist.rank() == 0:
            dist.all_reduce(np.ones(2))
        else:
            import time
            time.sleep(0.6)     # never joins

    with pytest.raises(dist.ReplicaError, match="rank 1 did not join"):
        dist.spawn(body, N, timeout=0.3)
