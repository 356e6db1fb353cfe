"""One bucket policy for eager DataParallel and the jit `distribute` pass
(`sampan.distributed.buckets.plan`): readiness order, one dtype a bucket, a small first
bucket and a small last bucket; both users lay the same gradients out alike."""
from __future__ import annotations

import numpy as np

import sampan
from sampan import nn
from sampan.distributed import buckets
from sampan.distributed.data_parallel import DataParallel
from sampan.nn import functional as F
from sampan.passes import distribute as distribute_pass

MB = 2 ** 20


def test_plan_small_first_and_last_buckets():
    f32 = "float32"
    items = [(MB // 2, f32), (MB // 2, f32), (MB // 2, f32)] + [(4 * MB, f32)] * 4 + \
        [(MB // 4, f32)] * 3
    got = buckets.plan(items, bucket_mb=10)
    # the first bucket stops at FIRST_BUCKET_MB (1 MB), the last holds only the last
    # gradients up to LAST_BUCKET_MB, the middle ones fill to bucket_mb
    assert got == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    assert buckets.FIRST_BUCKET_MB == buckets.LAST_BUCKET_MB == 1.0
    assert distribute_pass.FIRST_BUCKET_MB is buckets.FIRST_BUCKET_MB   # one constant


def test_plan_one_dtype_a_bucket_and_oversized_gradients_alone():
    items = [(100, "float32"), (100, "float64"), (100, "float32"), (50 * MB, "float32"),
             (100, "float64")]
    got = buckets.plan(items, bucket_mb=25)
    assert sorted(i for b in got for i in b) == list(range(5))
    for b in got:
        assert len({np.dtype(items[i][1]) for i in b}) == 1
        assert len(b) == 1 or sum(items[i][0] for i in b) <= 25 * MB
    assert got[-1] == [4]                       # the last (float64) gradient alone
    assert buckets.plan([], 25) == []


def _mlp():
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def test_pass_and_data_parallel_lay_the_same_gradients_out_alike():
    for mb in (0.0005, 0.004, 0.02, 25):
        dp = DataParallel(_mlp(), bucket_mb=mb)
        opt = sampan.optim.SGD(dp.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(dp(x), y)
            loss.backward()
            opt.step()
            return loss

        s = sampan.jit(step, pipeline="data_parallel")
        s(sampan.tensor(np.ones((8, 12), np.float32)), sampan.tensor(np.zeros(8, np.int64)))
        traced = [int(np.prod(n.inputs[0].shape)) * 4 for n in s.graph.nodes
                  if n.op == "all_reduce"]
        assert traced == [b.nbytes() for b in dp.buckets], mb
        assert s.graph.meta["distributed"]["buckets"] == len(dp.buckets)
