"""Collectives against numpy on the gathered inputs (float32/64, bfloat16, int64; uneven
all_gather), async handles, op-table gradients, a traced all_reduce, errors: the checks of
checks.py on 2 inproc replicas (spawn, in this process) and on 2 MPI ranks (one
`mpiexec -n 2` job running mpi_checks.py, shared by the module)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sampan.distributed as dist

from .checks import CHECKS

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
N = 2


@pytest.fixture(scope="module", autouse=True)
def mpi_job(tmp_path_factory):
    """The 2-rank MPI job, started when the module starts so that it runs while the
    in-process tests do; stopped (if still running) when the module ends."""
    from sampan.distributed.cli import find_mpiexec
    out = tmp_path_factory.mktemp("mpi")
    env = dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    for k in ("SAMPAN_LAUNCH_DIR", "SAMPAN_TIMEOUT"):
        env.pop(k, None)
    p = subprocess.Popen([find_mpiexec(), "-n", str(N), sys.executable,
                          os.path.join(HERE, "mpi_checks.py"), str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield p, out
    if p.poll() is None:
        p.kill()
    p.communicate()


@pytest.fixture(scope="module")
def mpi_results(mpi_job):
    p, out = mpi_job
    try:
        stdout, stderr = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
    res = []
    for r in range(N):
        path = out / f"rank-{r}.json"
        assert path.exists(), f"rank {r} wrote no results (rc {p.returncode}):\n" \
            f"{stdout[-3000:]}\n{stderr[-3000:]}"
        res.append(json.loads(path.read_text()))
    assert p.returncode == 0, stderr[-3000:]
    return res


@pytest.mark.parametrize("name", list(CHECKS))
def test_inproc(name):
    fn, args = CHECKS[name]
    dist.spawn(fn, N, args=args, timeout=20)


@pytest.mark.parametrize("name", list(CHECKS))
def test_mpi(mpi_results, name):
    for r, res in enumerate(mpi_results):
        assert res[name] == "ok", f"rank {r}: {res[name]}"


def test_mpi_job_sees_two_ranks(mpi_results):
    assert [res["world_size"] for res in mpi_results] == [N, N]
    assert [res["env_rank"] for res in mpi_results] == ["0", "1"]


def test_collective_before_init_and_single_rank():
    assert not dist.is_initialized()
    with pytest.raises(dist.DistributedError, match="init"):
        dist.all_reduce(np.ones(2))
    with pytest.raises(dist.DistributedError, match="init"):
        dist.rank()
    with pytest.raises(dist.DistributedError, match="backend"):
        dist.init("nccl")
    g = dist.init("auto")
    try:
        assert dist.world_size() == 1 and dist.rank() == 0 and g.backend == "inproc"
        x = np.arange(3.0)
        dist.all_reduce(x)
        np.testing.assert_array_equal(x, np.arange(3.0))
        assert dist.init() is g
    finally:
        dist.destroy()
    assert not dist.is_initialized()


def test_replica_failure_is_named_and_does_not_hang():
    def body():
        if dist.rank() == 1:
            raise ValueError("boom in rank 1")
        dist.all_reduce(np.ones(2))          # would wait for rank 1 forever

    with pytest.raises(dist.ReplicaError, match="rank 1 of 2 raised ValueError") as e:
        dist.spawn(body, N, timeout=30)
    assert e.value.rank == 1 and isinstance(e.value.__cause__, ValueError)


def test_inproc_order_mismatch_is_named():
    def order():
        if dist.rank() == 0:
            dist.all_reduce(np.ones(2))
        else:
            dist.broadcast(np.ones(2))

    with pytest.raises(dist.DistributedError, match="rank . called .* but rank . called"):
        dist.spawn(order, N, timeout=5)


def test_timeout_names_missing_rank():
    def body():
        if dist.rank() == 0:
            dist.all_reduce(np.ones(2))
        else:
            import time
            time.sleep(0.6)     # never joins

    with pytest.raises(dist.ReplicaError, match="rank 1 did not join"):
        dist.spawn(body, N, timeout=0.3)
