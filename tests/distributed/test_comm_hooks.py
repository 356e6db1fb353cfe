"""DataParallel.register_comm_hook, as PyTorch DDP's: the default hook gives what no hook
gives, and the fp16/bf16 compression hooks give the numbers of torch's own hooks
(`torch.distributed.algorithms.ddp_comm_hooks.default_hooks`, run on two gloo ranks in
threads of this process) on the same local gradients, on 2 in-process replicas."""
from __future__ import annotations

import datetime
import threading

import numpy as np
import pytest

import sampan
import sampan.distributed as dist
from sampan import nn
from sampan.distributed import comm_hooks
from sampan.distributed.data_parallel import DataParallel
from sampan.errors import SampanError
from sampan.nn import functional as F

N, B = 2, 8
_RNG = threading.Lock()


def _model():
    with _RNG:
        sampan.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _shard(r):
    g = np.random.default_rng(10 + r)
    return (sampan.tensor(g.standard_normal((B, 6)).astype(np.float32)),
            sampan.tensor(g.integers(0, 3, B)))


def _dp_grads(hook=None, state=None, bucket_mb=0.0005):
    """Each replica's .grad after one DataParallel backward (flattened, in parameter
    order), with `hook` registered when given."""
    def body():
        dp = DataParallel(_model(), bucket_mb=bucket_mb)
        if hook is not None:
            dp.register_comm_hook(state, hook)
        x, y = _shard(dist.rank())
        F.cross_entropy(dp(x), y).backward()
        return np.concatenate([p.grad.numpy().reshape(-1) for p in dp.module.parameters()])
    return dist.spawn(body, N)


def _local_grads(r):
    m = _model()
    x, y = _shard(r)
    F.cross_entropy(m(x), y).backward()
    return np.concatenate([p.grad.numpy().reshape(-1) for p in m.parameters()])


def _torch_hook(monkeypatch, name):
    """torch's hook `name` (or the hook function `name`) applied to each rank's local
    gradients over 2 gloo ranks."""
    torch = pytest.importorskip("torch")
    td = pytest.importorskip("torch.distributed")
    if not td.is_available():
        pytest.skip("torch.distributed is not available")
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    hook = getattr(default_hooks, name) if isinstance(name, str) else name
    # the hooks call dist.all_reduce(t, group=pg, async_op=True); route it to the
    # gloo group of this thread (two raw ProcessGroupGloo sharing one HashStore)
    monkeypatch.setattr(td, "all_reduce",
                        lambda t, group=None, async_op=False: group.allreduce([t]))
    monkeypatch.setattr(td, "get_world_size", lambda group=None: group.size())
    store = td.HashStore()
    out, errors = {}, []

    def body(r):
        try:
            pg = td.ProcessGroupGloo(store, r, N, datetime.timedelta(seconds=30))
            buf = torch.from_numpy(_local_grads(r).copy())
            fut = hook(pg, _Bucket(buf))
            out[r] = fut.wait().numpy().copy()
        except Exception as e:           # noqa: BLE001 - reraised below
            errors.append(e)
    ts = [threading.Thread(target=body, args=(r,)) for r in range(N)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    if errors:
        raise errors[0]
    return [out[r] for r in range(N)]


class _Bucket:
    """The part of torch's GradBucket the default hooks read."""

    def __init__(self, buf):
        self._buf = buf

    def buffer(self):
        return self._buf


def test_the_default_hook_is_what_no_hook_does():
    plain = _dp_grads()
    hooked = _dp_grads(comm_hooks.allreduce_hook)
    for a, b in zip(plain, hooked):
        np.testing.assert_array_equal(a, b)
    want = (_local_grads(0) + _local_grads(1)) / 2
    np.testing.assert_allclose(plain[0], want, rtol=1e-6, atol=1e-7)


def test_default_hook_matches_torch_allreduce_hook(monkeypatch):
    ref = _torch_hook(monkeypatch, "allreduce_hook")
    for got in _dp_grads(comm_hooks.allreduce_hook):
        np.testing.assert_array_equal(got, ref[0])


@pytest.mark.parametrize("name", ["fp16_compress_hook", "bf16_compress_hook"])
def test_compression_hooks_match_torch(monkeypatch, name):
    ref = _torch_hook(monkeypatch, name)
    np.testing.assert_array_equal(ref[0], ref[1])
    got = _dp_grads(getattr(comm_hooks, name))
    for g in got:
        np.testing.assert_array_equal(g, ref[0])         # torch's numbers, exactly
    exact = (_local_grads(0) + _local_grads(1)) / 2
    assert not np.array_equal(got[0], exact)                # it did compress
    tol = 2 ** -10 if name.startswith("fp16") else 2 ** -7
    np.testing.assert_allclose(got[0], exact, rtol=tol, atol=1e-3)


def test_a_hook_sees_each_bucket_once_and_may_return_a_new_buffer():
    seen = []

    def hook(state, bucket):
        seen.append((state, bucket.index(), bucket.is_last(), len(bucket.parameters()),
                     bucket.array().size, [g.shape for g in bucket.gradients()]))
        assert np.shares_memory(bucket.buffer().numpy(), bucket.array())
        fresh = np.full(bucket.array().size, 0.5, bucket.array().dtype)
        return dist.all_reduce(fresh, op="sum", async_op=True)   # a new array: 1.0

    got = _dp_grads(hook, state="mine")
    for g in got:
        np.testing.assert_array_equal(g, np.ones_like(g))
    per_rank = len(seen) // N
    assert per_rank >= 2 and len(seen) == N * per_rank
    assert all(s[0] == "mine" for s in seen)
    mine = sorted(seen, key=lambda s: s[1])[::N]
    assert [s[1] for s in mine] == list(range(per_rank))
    assert [s[2] for s in mine] == [False] * (per_rank - 1) + [True]
    assert sum(s[4] for s in mine) == got[0].size
    assert all(sum(int(np.prod(sh)) for sh in s[5]) == s[4] for s in mine)


def test_a_hook_is_set_once_and_not_traced():
    dp = DataParallel(_model())
    dp.register_comm_hook(None, comm_hooks.fp16_compress_hook)
    with pytest.raises(SampanError, match="already registered"):
        dp.register_comm_hook(None, comm_hooks.allreduce_hook)
    with pytest.raises(SampanError, match="traced"):
        x, y = _shard(0)
        sampan.jit(lambda x: dp(x).sum())(x)


def _load_hook(ported):
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_style_hook.py")
    with open(path) as f:
        text = f.read()
    if ported:
        text = text.replace("import torch.distributed as dist",
                            "import sampan.distributed as dist")
        text = text.replace("import torch\n", "import sampan as torch\n")
    ns = {"__name__": "torch_style_hook"}
    exec(compile(text, path, "exec"), ns)          # noqa: S102 - our own test file
    return ns["bf16_by_hand"]


def test_a_hook_written_for_torch_ports_by_renaming_its_imports(monkeypatch):
    ref = _torch_hook(monkeypatch, _load_hook(ported=False))
    got = _dp_grads(_load_hook(ported=True))
    for g in got:
        np.testing.assert_array_equal(g, ref[0])
    for g in _dp_grads(comm_hooks.bf16_compress_hook):     # the same as torch's own
        np.testing.assert_array_equal(g, ref[0])
