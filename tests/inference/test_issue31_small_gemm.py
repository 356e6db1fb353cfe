"""Issue 31, batch-1 latency: the small-GEMM path (backends/numba/gemv.py, bound by
runtime/specialize.py). Products of 1..8 rows against a constant weight run the packed
loop, serial or split over the process's threads, and give numpy's numbers; the weight is
packed once and shared by every executor and clone; other batch sizes keep BLAS."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.backends.numba import gemv
from sampan.inference import Config, create_predictor

pytest.importorskip("numba")


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 5), (3, 64, 9), (8, 130, 67),
                                   (1, 784, 512), (2, 512, 300)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_loops_match_numpy(m, k, n, dtype):
    r = np.random.default_rng(m * 1000 + k + n)
    x = r.standard_normal((m, k)).astype(dtype)
    w = r.standard_normal((k, n)).astype(dtype)
    wt = gemv.pack(w)
    want = x.astype(np.float64) @ w.astype(np.float64)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for loop in (gemv._rows_serial, gemv._rows_parallel):   # both variants, every tail
        out = np.full((m, n), np.nan, dtype)
        loop(x, wt, out)
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.sqrt(k))
    out = np.empty((m, n), dtype)
    assert gemv.small_matmul(x[:, :], wt, out) is out
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.sqrt(k))


def test_pack_once_per_weight():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    a, b = gemv.pack(w), gemv.pack(w)
    assert a is b and a.shape == (4, 3) and a.flags.c_contiguous and not a.flags.writeable
    np.testing.assert_array_equal(a, w.T)
    assert gemv.pack(w.copy()) is not a       # another array: its own packing
    key = id(w)
    del w, a, b
    assert key not in gemv._PACKED or gemv._PACKED[key][0]() is None


def test_fits():
    f32 = np.float32
    assert gemv.fits((1, 8), (8, 4), f32, f32) and gemv.fits((8, 8), (8, 4), f32, f32)
    assert not gemv.fits((9, 8), (8, 4), f32, f32)            # a GEMM: BLAS
    assert not gemv.fits(("batch", 8), (8, 4), f32, f32)       # symbolic
    assert not gemv.fits((1, 8), (8, 4), f32, np.float64)
    assert not gemv.fits((1, 8), (8, 4), np.int32, np.int32)
    assert not gemv.fits((2, 1, 8), (8, 4), f32, f32)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    sampan.manual_seed(5)
    m = nn.Sequential(nn.Linear(300, 400), nn.ReLU(), nn.Linear(400, 10))
    m.eval()
    path = sampan.jit.save(m, str(tmp_path_factory.mktemp("gemv") / "mlp.sampan"),
                           (sampan.randn(2, 300),), dynamic={"x": {0: "batch"}})
    return m, path


@pytest.mark.parametrize("batch", [1, 4, 8, 9, 33])
def test_predictor_small_batches_match_eager(mlp, batch):
    m, path = mlp
    x = np.random.default_rng(batch).standard_normal((batch, 300)).astype(np.float32)
    with sampan.no_grad():
        want = m(sampan.tensor(x)).numpy()
    cfg = Config(path)
    cfg.pass_builder().delete_pass("fuse_layers")    # the planned small matmuls themselves
    p = create_predictor(cfg)
    (got,) = p.run([x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    small = [ln for ln in p.code.splitlines() if "= s" in ln and "_matmul(" in ln]
    # each product measured once: the packed loop unless BLAS ran it faster here
    want_small = 0 if batch > gemv.MAX_ROWS else sum(
        gemv.loop_for(batch, k, n) is not None for k, n in ((300, 400), (400, 10)))
    assert len(small) == want_small >= (1 if batch <= gemv.MAX_ROWS else 0), p.code
    (again,) = p.run([x])             # planned buffers reused: the same numbers
    np.testing.assert_array_equal(again, got)


def test_weights_packed_once_across_sizes_and_clones(mlp):
    _, path = mlp
    p = create_predictor(Config(path))
    w = [v.const for v in p.graph.consts if v.const is not None and v.const.ndim == 2]
    x = np.ones((1, 300), np.float32)
    p.run([x])
    packed = {id(a): gemv.pack(a) for a in w}
    c = p.clone()
    c.run([x])
    p.run([np.ones((3, 300), np.float32)])
    assert all(gemv.pack(a) is packed[id(a)] for a in w)
    np.testing.assert_array_equal(c.run([x])[0], p.run([x])[0])


def test_prefer_keeps_the_kernel_choice(mlp):
    from sampan.backends import choice
    _, path = mlp
    with choice.prefer("numpy", op="matmul"):
        p = create_predictor(Config(path))
        p.run([np.ones((1, 300), np.float32)])
    assert "matmul_small" not in repr(p._last.fn.__globals__.values())
    assert "dense_small" not in repr(p._last.fn.__globals__.values())   # fuse_layers' too


def test_numpy_runtime_keeps_blas(mlp):
    _, path = mlp
    cfg = Config(path)
    cfg.set_runtime("numpy")
    p = create_predictor(cfg)
    p.run([np.ones((1, 300), np.float32)])
    assert "matmul_small" not in repr(p._last.fn.__globals__.values())
