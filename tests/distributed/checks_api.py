"""Checks of the torch.distributed spellings, subgroups, the table's fallback (reduce)
and DataParallel's compression hook, run like checks.py: on 2 inproc replicas and on 2
MPI ranks (checks.py adds them to CHECKS, so the one MPI job of test_collectives.py
runs them too)."""
from __future__ import annotations

import numpy as np

import sampan
import sampan.distributed as dist
from sampan import nn
from sampan.distributed import comm_hooks
from sampan.distributed.data_parallel import DataParallel
from sampan.dtypes import bfloat16
from sampan.nn import functional as F


def check_torch_spellings():
    r, n = dist.get_rank(), dist.get_world_size()
    assert (r, n) == (dist.rank(), dist.world_size())
    x = np.full(3, r + 1.0, np.float32)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    np.testing.assert_array_equal(x, np.full(3, float(n), np.float32))
    p = np.array([r + 2, -(r + 1)], np.int64)
    dist.all_reduce(p, op=dist.ReduceOp.PRODUCT)
    want_p = [int(np.prod([q + 2 for q in range(n)])), int(np.prod([-(q + 1) for q in range(n)]))]
    np.testing.assert_array_equal(p, want_p)
    h = np.array([1.5 + r, 0.25], np.float32).astype(bfloat16)
    dist.all_reduce(h, op="prod")
    np.testing.assert_array_equal(h.astype(np.float32), [np.prod([1.5 + q for q in range(n)]),
                                                         0.25 ** n])
    y = np.full(2, r + 1.0)
    dist.reduce(y, dst=n - 1)                    # the table's fallback on every backend
    want = sum(q + 1.0 for q in range(n)) if r == n - 1 else r + 1.0
    np.testing.assert_array_equal(y, np.full(2, want))
    last = dist.new_group([n - 1])
    if r == n - 1:
        assert dist.get_rank(last) == 0 and dist.get_world_size(last) == 1
        z = np.full(2, 5.0)
        dist.all_reduce(z, group=last)
        np.testing.assert_array_equal(z, np.full(2, 5.0))
        dist.destroy_process_group(last)
    else:
        assert last is None
    pair = dist.new_group()
    w = np.full(2, float(r))
    h = dist.all_reduce(w, op=dist.ReduceOp.AVG, group=pair, async_op=True)
    h.wait()
    np.testing.assert_array_equal(w, np.full(2, (n - 1) / 2))
    b = np.full(1, float(r))
    dist.broadcast(b, src=1, group=pair)
    np.testing.assert_array_equal(b, [1.0])
    parts = [sampan.zeros(2) for _ in range(n)]
    assert dist.all_gather(parts, sampan.tensor([float(r), 2.0]), group=pair) is None
    for q, p in enumerate(parts):
        np.testing.assert_array_equal(p.numpy(), [float(q), 2.0])
    dist.barrier(group=pair)
    dist.destroy_process_group(pair)


def _grads(m):
    return np.concatenate([p.grad.numpy().reshape(-1) for p in m.parameters()])


def check_compression_hook():
    """fp16_compress_hook's result against numpy: each rank's local gradient cast to
    float16 and divided by the world size, summed and rounded to float16 once."""
    r, n = dist.get_rank(), dist.get_world_size()
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
    dp = DataParallel(m, bucket_mb=0.0002)      # rank 0's weights on every rank
    dp.register_comm_hook(None, comm_hooks.fp16_compress_hook)
    g = np.random.default_rng(20 + r)
    x = sampan.tensor(g.standard_normal((6, 5)).astype(np.float32))
    y = sampan.tensor(g.integers(0, 2, 6))
    with dp.no_sync():                          # this rank's own gradient
        F.cross_entropy(dp(x), y).backward()
    every = dist.all_gather(_grads(m).astype(np.float32))
    for p in m.parameters():
        p.grad = None
    F.cross_entropy(dp(x), y).backward()
    parts = [(e.astype(np.float16) / np.float16(n)).astype(np.float32) for e in every]
    want = np.sum(parts, axis=0).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(_grads(m), want)
    assert len(dp.buckets) >= 2


CHECKS = {"torch_spellings": (check_torch_spellings, ()),
          "compression_hook": (check_compression_hook, ())}
