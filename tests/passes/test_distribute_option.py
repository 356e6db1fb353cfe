"""Issue 30: `distribute`'s bucket size is a declared pass option (`bucket_mb`), set through
the PassManager as every other pass's; a traced DataParallel asks for its own through the
jit's PassManager call; the old `graph.meta["bucket_mb"]` still works, with a
DeprecationWarning."""
import warnings

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.distributed.data_parallel import DataParallel
from sampan.nn import functional as F
from sampan.passes import PassManager, pass_options
from sampan.passes.manager import PassError


def _step(layer):
    opt = sampan.optim.SGD(layer.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(layer(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def _run(step):
    s = sampan.jit(step, pipeline="data_parallel")
    s(sampan.tensor(np.ones((4, 12), np.float32)), sampan.tensor(np.zeros(4, np.int64)))
    return s


def _mlp():
    sampan.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def _reductions(g):
    return sum(n.op == "all_reduce" for n in g.nodes)


def test_bucket_mb_is_a_declared_option():
    assert pass_options("distribute") == {"bucket_mb": None}
    raw = _run(_step(_mlp())).raw_graph
    assert "bucket_mb" not in raw.meta
    one = PassManager(["distribute"]).run(raw)                 # default: 25 MB
    many = PassManager(["distribute"], options={"distribute": {"bucket_mb": 0.0005}}).run(raw)
    assert _reductions(one) == 1 and _reductions(many) > 2
    with pytest.raises(PassError, match="bucket_mb"):
        PassManager(["distribute"], options={"distribute": {"bucket_mb": 0}}).run(raw)
    with pytest.raises(PassError, match="no option .bucket."):
        PassManager(["distribute"], options={"distribute": {"bucket": 1}})


def test_graph_meta_still_read_with_a_deprecation_warning():
    raw = _run(_step(_mlp())).raw_graph
    want = PassManager(["distribute"], options={"distribute": {"bucket_mb": 0.0005}}).run(raw)
    raw.meta["bucket_mb"] = 0.0005
    with pytest.warns(DeprecationWarning, match="bucket_mb"):
        got = PassManager(["distribute"]).run(raw)
    assert _reductions(got) == _reductions(want)
    with warnings.catch_warnings():         # an option set wins over the meta key, silently
        warnings.simplefilter("error")
        got = PassManager(["distribute"], options={"distribute": {"bucket_mb": 25}}).run(raw)
    assert _reductions(got) == 1


def test_traced_data_parallel_passes_its_bucket_size_as_the_option():
    dp = DataParallel(_mlp(), bucket_mb=0.0005)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        s = _run(_step(dp))
    assert "bucket_mb" not in s.raw_graph.meta
    assert _reductions(s.graph) == len(dp.buckets) > 2
