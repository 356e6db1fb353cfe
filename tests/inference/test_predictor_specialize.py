"""The numba runtime's executors bind kernels chosen for the concrete shapes
(sampan/runtime/specialize.py): direct and one-GEMM conv2d, 2x2 max-pool. They must give
eager's numbers at batch 1 and above, and the numpy runtime keeps the op-table kernels."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor
from sampan.runtime.specialize import node_kernel


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    sampan.manual_seed(3)
    # conv1: 9 taps (direct kernel); conv2: 36 taps on 8x8 (one GEMM, padded); pools 2x2;
    # conv3: 1x1 and a 3x3 pool (op-table kernels)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(8, 8, 1), nn.MaxPool2d(3, stride=1, padding=1),
                      nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
    m.eval()
    path = sampan.jit.save(m, str(tmp_path_factory.mktemp("spec") / "cnn.sampan"),
                           (sampan.randn(2, 1, 16, 16),), dynamic={"x": {0: "batch"}})
    return m, path


@pytest.mark.parametrize("batch", [1, 3])
def test_specialized_kernels_match_eager(cnn, batch):
    m, path = cnn
    x = np.random.default_rng(batch).standard_normal((batch, 1, 16, 16)).astype(np.float32)
    with sampan.no_grad():
        want = m(sampan.tensor(x)).numpy()
    cfg = Config(path)
    cfg.pass_builder().delete_pass("fuse_layers")    # the specialised nodes themselves
    p = create_predictor(cfg)
    (got,) = p.run([x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    code = p.code
    assert code.count("_conv2d(") == 3 and code.count("_max_pool2d(") == 3
    # two convolutions and the two 2x2 pools specialised; the 1x1 conv and 3x3 pool not
    assert len([ln for ln in code.splitlines() if "= s" in ln and "_conv2d(" in ln]) == 2
    assert len([ln for ln in code.splitlines() if "= s" in ln and "_max_pool2d(" in ln]) == 2
    assert "k_conv2d(" in code and "k_max_pool2d(" in code
    # a second run reuses the executor's buffers: same numbers
    (again,) = p.run([x])
    np.testing.assert_array_equal(again, got)


def test_numpy_runtime_keeps_op_table_kernels(cnn):
    _, path = cnn
    cfg = Config(path)
    cfg.set_runtime("numpy")
    p = create_predictor(cfg)
    p.run([np.zeros((1, 1, 16, 16), np.float32)])
    assert not any(ln.lstrip().startswith("v") and "= s" in ln for ln in p.code.splitlines())


def test_rules_decline_symbolic_shapes(cnn):
    """Only concrete shapes are specialised (the graph kept by the predictor is symbolic)."""
    _, path = cnn
    p = create_predictor(Config(path))
    assert all(node_kernel(n) is None for n in p.graph.nodes)
