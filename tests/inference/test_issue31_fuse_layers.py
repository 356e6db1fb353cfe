"""Issue 31, W5 fp32: `fuse_layers` (the Predictor's list, after `partition`) writes a
constant-weight matmul + bias add (+ ReLU) as one `dense` node and a conv2d + bias add
(+ ReLU, + 2x2 max-pool) as one `conv2d_block` node; the numba provider runs each as one
kernel (backends/numba/gemv.py, convblock.py). Numerics against numpy float64 for every
loop and shape class, eager == jit == Predictor, the numpy runtime untouched, and the
bound kernels' checks before their numba loops run."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor
from sampan.ops.registry import OPS

pytest.importorskip("numba")

from sampan.backends.numba import convblock, gemv  # noqa: E402


def _f(r, *s, dt=np.float32):
    return r.standard_normal(s).astype(dt)


def _dense64(x, w, b, relu):
    y = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    return np.maximum(y, 0) if relu else y


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(1, 784, 512), (1, 84, 10), (3, 17, 6), (8, 400, 121),
                                   (2, 1, 5)])
@pytest.mark.parametrize("loop", ["_dense_serial", "_dense_parallel", "_dense_blas"])
def test_dense_loops_against_float64(dt, m, k, n, loop):
    r = np.random.default_rng(m * 1000 + k + n)
    x, w, b = _f(r, m, k, dt=dt), _f(r, k, n, dt=dt), _f(r, n, dt=dt)
    tol = 1e-4 if dt == np.float32 else 1e-10
    for relu in (True, False):
        out = np.full((m, n), np.nan, dt)
        getattr(gemv, loop)(x, gemv.pack(w), b, relu, out)
        np.testing.assert_allclose(out, _dense64(x, w, b, relu), rtol=tol, atol=tol * k)


def test_dense_relu_keeps_nan_and_the_op_kernel_agrees():
    r = np.random.default_rng(5)
    x, w, b = _f(r, 2, 33), _f(r, 33, 9), _f(r, 9)
    x[1, 4] = np.nan
    out = np.empty((2, 9), np.float32)
    gemv._dense_serial(x, gemv.pack(w), b, True, out)
    assert np.isnan(out[1]).all() and not np.isnan(out[0]).any()
    ref = OPS["dense"].kernels["numpy"](x, w, b, relu=True)
    np.testing.assert_allclose(OPS["dense"].kernel(x, w, b, relu=True), ref, rtol=1e-5,
                               atol=1e-5)
    big = _f(r, 64, 33)        # more rows than the small-GEMM path: the numpy kernel
    np.testing.assert_allclose(OPS["dense"].kernel(big, w, b, relu=True),
                               _dense64(big, w, b, True), rtol=1e-4, atol=1e-4)


def _conv64(x, w, b, pad, relu, pool):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    y = np.zeros((n, o, ho, wo))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + ho, j:j + wo], w[:, :, i, j])
    y += b.astype(np.float64).reshape(1, -1, 1, 1)
    if relu:
        y = np.maximum(y, 0)
    if pool:
        y = y[:, :, :ho // 2 * 2, :wo // 2 * 2].reshape(n, o, ho // 2, 2, wo // 2, 2)
        y = y.max((3, 5))
    return y


def _block_node(x, w, b, pad, relu, pool):
    from sampan.ir.graph import Graph, Node, Value
    g = Graph()
    xv = g.add_input(x.shape, x.dtype)
    wv, bv = g.add_const(w), g.add_const(b)
    attrs = {"stride": (1, 1), "padding": (pad, pad), "dilation": (1, 1), "groups": 1,
             "relu": relu, "pool": pool}
    spec = OPS["conv2d_block"].shape_rule(xv, wv, bv, **attrs)
    node = Node("conv2d_block", [xv, wv, bv], attrs)
    node.outputs.append(Value(g._new_id(), spec.shape, spec.dtype, node=node))
    return node


# LeNet's two blocks at batch 1 (direct kernel; flat-row one-GEMM), odd sizes (the pool
# drops the last row and column), a batch of 3 (one-GEMM over the batch)
@pytest.mark.parametrize("n,c,h,o,k,pad", [(1, 1, 28, 6, 5, 2), (1, 6, 14, 16, 5, 0),
                                           (1, 3, 9, 4, 3, 1), (3, 6, 11, 16, 5, 0),
                                           (2, 1, 13, 6, 5, 2)])
@pytest.mark.parametrize("relu,pool", [(True, True), (False, True), (True, False)])
def test_bound_conv_block_against_float64(n, c, h, o, k, pad, relu, pool):
    r = np.random.default_rng(n + c + h + o)
    x, w, b = _f(r, n, c, h, h), _f(r, o, c, k, k), _f(r, o)
    fn = convblock.bind_block(_block_node(x, w, b, pad, relu, pool))
    want = _conv64(x, w, b, pad, relu, pool)
    got = fn(x, w, b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * c * k * k)
    np.testing.assert_array_equal(fn(x.copy(), w, b), got)       # scratch reused, same
    # the op's kernels (eager) agree with the bound one
    attrs = {"stride": (1, 1), "padding": (pad, pad), "dilation": (1, 1), "groups": 1}
    np.testing.assert_allclose(OPS["conv2d_block"].kernel(x, w, b, **attrs, relu=relu,
                                                          pool=pool), got,
                               rtol=1e-5, atol=1e-5)


def test_bound_kernels_check_the_call_before_their_loops():
    """A call with another shape or dtype than the node was bound for runs the op's
    numpy kernel (no numba loop reads past a buffer sized for the node)."""
    r = np.random.default_rng(2)
    x, w, b = _f(r, 1, 6, 14, 14), _f(r, 16, 6, 5, 5), _f(r, 16)
    fn = convblock.bind_block(_block_node(x, w, b, 0, True, True))
    x2 = _f(r, 2, 6, 18, 18)
    np.testing.assert_allclose(fn(x2, w, b), _conv64(x2, w, b, 0, True, True), rtol=1e-4,
                               atol=1e-3)
    from sampan.ir.graph import Graph, Node, Value
    g = Graph()
    xv = g.add_input((1, 40), np.float32)
    wm, bm = _f(r, 40, 12), _f(r, 12)
    node = Node("dense", [xv, g.add_const(wm), g.add_const(bm)], {"relu": True})
    node.outputs.append(Value(g._new_id(), (1, 12), np.float32, node=node))
    d = gemv.bind_dense(node)
    for xx in (_f(r, 1, 40), _f(r, 5, 40), _f(r, 1, 40, dt=np.float64)):
        np.testing.assert_allclose(d(xx, wm, bm), _dense64(xx, wm, bm, True), rtol=1e-4,
                                   atol=1e-4)


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    sampan.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                      nn.Linear(84, 10))
    r = np.random.default_rng(4)
    for p in m.parameters():
        if p._data.ndim == 1:
            p._data[...] = r.standard_normal(p._data.shape).astype(np.float32) * 0.2
    m.eval()
    path = sampan.jit.save(m, str(tmp_path_factory.mktemp("fl") / "lenet.sampan"),
                           (sampan.randn(2, 1, 28, 28),), dynamic={"x": {0: "batch"}})
    return m, path


@pytest.mark.parametrize("batch", [1, 4, 64])
def test_eager_jit_and_predictor_agree(lenet, batch):
    m, path = lenet
    x = np.random.default_rng(batch).standard_normal((batch, 1, 28, 28)).astype(np.float32)
    with sampan.no_grad():
        eager = m(sampan.tensor(x)).numpy()
        jit = sampan.jit(m)(sampan.tensor(x)).numpy()
    p = create_predictor(Config(path))
    (got,) = p.run([x])
    ops = [n.op for n in p.graph.nodes]
    assert ops.count("conv2d_block") == 2 and ops.count("dense") == 3, ops
    assert "matmul" not in ops and "max_pool2d" not in ops and "fused" not in ops
    assert "fuse_layers" in p.passes_run
    np.testing.assert_allclose(jit, eager, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4)
    # float64 reference of the whole network
    ref = x.astype(np.float64)
    layers = list(m)
    for conv in (layers[0], layers[3]):
        ref = _conv64(ref, conv.weight.numpy(), conv.bias.numpy(), conv.padding[0]
                      if isinstance(conv.padding, tuple) else conv.padding, True, True)
    ref = ref.reshape(batch, -1)
    for i, lin in enumerate((layers[7], layers[9], layers[11])):
        ref = _dense64(ref, lin.weight.numpy(), lin.bias.numpy(), i < 2)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_numpy_runtime_and_a_second_reader_keep_the_matmul(lenet, tmp_path):
    _, path = lenet
    cfg = Config(path)
    cfg.set_runtime("numpy")
    p = create_predictor(cfg)
    assert "dense" not in [n.op for n in p.graph.nodes]

    class Two(nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, x):
            h = x @ self.lin.weight
            return sampan.relu(h + self.lin.bias) + h       # h read twice

    sampan.manual_seed(1)
    t = Two()
    t.eval()
    q = create_predictor(Config(sampan.jit.save(t, str(tmp_path / "two.sampan"),
                                                (sampan.randn(1, 8),))))
    assert "dense" not in [n.op for n in q.graph.nodes]
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    with sampan.no_grad():
        want = t(sampan.tensor(x)).numpy()
    np.testing.assert_allclose(q.run([x])[0], want, rtol=1e-5, atol=1e-5)
