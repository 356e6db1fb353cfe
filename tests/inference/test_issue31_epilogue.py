"""Issue 31, fixed per-call costs: in a served program (the Predictor's executors) a fused
elementwise kernel's constant inputs are prepared once when the kernel is bound (a conv
bias (C, 1, 1) against (N, C, H, W) at N > 1 broadcast once, not on every call) and a
planned output buffer's view is made once; the numbers stay eager's. A jit function's
constants (a traced tensor's array) are still read on every call."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor

pytest.importorskip("numba")


@pytest.fixture(scope="module")
def convnet(tmp_path_factory):
    sampan.manual_seed(11)
    m = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(6 * 6 * 6, 10))
    for p in m.parameters():
        if p._data.ndim == 1:
            p._data[...] = np.linspace(-0.3, 0.3, p._data.size)
    m.eval()
    path = sampan.jit.save(m, str(tmp_path_factory.mktemp("epi") / "c.sampan"),
                           (sampan.randn(2, 1, 12, 12),), dynamic={"x": {0: "batch"}})
    return m, path


@pytest.mark.parametrize("batch", [1, 5])
def test_constant_broadcast_made_once(convnet, batch):
    m, path = convnet
    cfg = Config(path)
    # the fused kernels themselves (fuse_layers would take this conv's bias and ReLU
    # into its conv2d_block node, tests/inference/test_issue31_fuse_layers.py)
    cfg.pass_builder().delete_pass("fuse_layers")
    p = create_predictor(cfg)
    x = np.random.default_rng(batch).standard_normal((batch, 1, 12, 12)).astype(np.float32)
    with sampan.no_grad():
        want = m(sampan.tensor(x)).numpy()
    (a,) = p.run([x])
    (b,) = p.run([x * 1])
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a, b)
    g = p._last.fn.__globals__
    fused = [g[k] for k in g if k.endswith("_fused")]
    assert fused, p.code
    src = "\n".join(f.source.split("# wrapper")[1] for f in fused)
    assert "_m1" in src and "_bt(x1" not in src, src     # the bias, prepared at bind
    assert "_mv0" in src                                    # the out view, made once


def test_jit_constants_are_read_per_call():
    """A captured tensor that changes in place between calls of a jit function: its new
    values are used (its fused kernel does not keep a copy)."""
    b = sampan.tensor(np.full((6, 1, 1), 0.5, np.float32))

    @sampan.jit
    def f(x):
        return sampan.relu(x + b) * 2.0

    x = np.random.default_rng(0).standard_normal((5, 6, 4, 4)).astype(np.float32)
    a = f(sampan.tensor(x)).numpy()
    np.testing.assert_allclose(a, np.maximum(x + 0.5, 0) * 2, rtol=1e-6)
    b._data[...] = -1.0
    c = f(sampan.tensor(x)).numpy()
    np.testing.assert_allclose(c, np.maximum(x - 1.0, 0) * 2, rtol=1e-6)
