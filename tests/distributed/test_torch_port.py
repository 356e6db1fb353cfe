"""A torch.distributed script ports by renaming its imports: torch_style_script.py runs
under torch (2 gloo processes, the oracle) and, with ``import torch`` / ``import
torch.distributed as dist`` renamed to sampan's, on 2 in-process replicas; both give
the same results. Also the aliases: init/rank/world_size are the torch spellings'."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import sampan.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torch_style_script.py")
N = 2


def _ported():
    with open(SCRIPT) as f:
        text = f.read()
    text = text.replace("import torch.distributed as dist",
                        "import sampan.distributed as dist")
    text = text.replace("import torch\n", "import sampan as torch\n")
    assert "torch.distributed" not in text.split('"""')[-1]
    ns = {"__name__": "ported"}
    exec(compile(text, SCRIPT, "exec"), ns)          # noqa: S102 - our own test file
    return ns["run"]


EXPECTED = [{"gather": [[0.0, 1.0], [1.0, 1.0]], "rank": r, "world": 2, "sum": [3.0] * 3,
             "max": [1.0, 10.0], "min": [3.0],
             "bcast": [1.5], "reduce": [3.0] if r == 0 else [2.0],
             "solo": [7.0] if r == 0 else [8.0], "pair": [4.0], "pair_size": 2}
            for r in range(N)]


def test_the_ported_script_runs_on_two_replicas():
    assert dist.spawn(_ported(), N) == EXPECTED
    assert not dist.is_initialized()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_same_script_under_torch_gives_the_same():
    td = pytest.importorskip("torch.distributed")
    if not td.is_available() or not td.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    port = str(_free_port())
    procs = []
    for r in range(N):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(N), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen([sys.executable, SCRIPT], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert outs == EXPECTED


def test_old_names_are_aliases_of_the_torch_spellings():
    def body():
        g = dist.init_process_group("gloo", world_size=2)
        assert dist.init() is g and dist.current_group() is g
        assert (dist.rank(), dist.world_size()) == (dist.get_rank(), dist.get_world_size())
        assert dist.get_backend() == dist.backend() == "inproc"
        x = np.ones(2)
        assert dist.all_reduce(x, dist.ReduceOp.AVG) is x      # positional op, as torch
        with pytest.raises(dist.DistributedError, match="rank=5"):
            dist.init_process_group(rank=5)
        return dist.get_rank()
    assert dist.spawn(body, N) == [0, 1]
    with pytest.raises(dist.DistributedError, match="backend"):
        dist.init_process_group("nccl")
    g = dist.init_process_group()
    try:
        assert dist.get_world_size() == 1 and g.backend == "inproc"
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


def test_new_group_checks_its_ranks_and_a_non_member_gets_none():
    def body():
        with pytest.raises(dist.DistributedError, match="distinct ranks"):
            dist.new_group([0, 0])
        g = dist.new_group([1])
        if dist.get_rank() == 1:
            assert dist.get_rank(g) == 0 and dist.get_world_size(g) == 1
        else:
            assert g is None
        return True
    assert dist.spawn(body, N) == [True, True]


def test_a_new_collective_is_one_table_entry():
    # every public collective is a table entry, exported under its name
    for name, entry in dist.TABLE.items():
        assert getattr(dist, name) is entry.fn and name in dist.__all__
    # reduce has no kernel in either backend: it runs through the table's fallback
    from sampan.distributed import inproc
    assert "reduce" not in inproc.KERNELS and dist.TABLE["reduce"].fallback is not None


def test_an_entry_with_a_fallback_runs_on_every_backend():
    from sampan.distributed import collectives as C

    def twice_fallback(g, arr, op="sum"):          # written with the others
        return g.run("all_reduce", arr, op=op).then(lambda res: np.multiply(res, 2, out=res))

    @C.collective("all_reduce_twice", fallback=twice_fallback)
    def all_reduce_twice(x, op="sum", async_op=False, group=None):
        a, fin = C._target(x, "all_reduce_twice")
        return C._run("all_reduce_twice", a, async_op, {"op": op}, fin, group)

    try:
        def body():
            x = np.full(2, dist.get_rank() + 1.0)
            return all_reduce_twice(x, op="max").tolist()
        assert dist.spawn(body, N) == [[4.0, 4.0]] * N
    finally:
        del C.TABLE["all_reduce_twice"]
