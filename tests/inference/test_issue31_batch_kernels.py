"""Issue 31, W5 fp32 at batch > 1 (the batch-64 rows): a `conv2d_block` of a batch may run
the direct kernel with its epilogue inside, serial or with the images split over the
threads (convgen's "block_parallel"), also for a layer with many taps per output (LeNet's
second, 150); a `dense` of more rows than the small-GEMM path may run the packed row loops
instead of BLAS and the epilogue (gemv.batch_loop_for). Each choice is a measurement, so
every candidate is checked here against numpy float64 on its own, and the bound kernels
(whichever won) too."""
import numpy as np
import pytest

pytest.importorskip("numba")

from sampan.backends.numba import convblock, gemv  # noqa: E402
from sampan.backends.numba.loops import conv as _conv  # noqa: E402
from sampan.ir.graph import Graph, Node, Value  # noqa: E402
from sampan.ops.registry import OPS  # noqa: E402

from .test_issue31_fuse_layers import _block_node, _conv64, _dense64, _f  # noqa: E402


# LeNet's two layers at a batch, an odd plane (the pool drops a row and a column), few
# channels, an odd count of output channels (one channel per pass); 5x5 taps throughout
# (each kernel size compiles kernels of its own)
@pytest.mark.parametrize("n,c,h,o,k,pad", [(5, 1, 28, 6, 5, 2), (4, 6, 14, 16, 5, 0),
                                           (3, 3, 9, 5, 5, 2), (2, 2, 7, 3, 5, 1)])
@pytest.mark.parametrize("relu,pool", [(True, True), (False, True), (True, False)])
def test_block_kernels_serial_and_parallel_against_float64(n, c, h, o, k, pad, relu, pool):
    r = np.random.default_rng(n * 100 + c + h + o)
    x, w, b = _f(r, n, c, h, h), _f(r, o, c, k, k), _f(r, o)
    x[n - 1, 0, h // 2, h // 3] = np.nan            # NaN stays NaN through ReLU and pool
    want = _conv64(x, w, b, pad, relu, pool)
    ho = h + 2 * pad - k + 1
    shape = (n, o, ho // 2, ho // 2) if pool else (n, o, ho, ho)
    got = {}
    for which in ("block", "block_parallel"):
        out = np.full(shape, -7.0, np.float32)
        _conv._direct_kernel(which, np.float32, o, k, k)(x, w.reshape(o, -1), b, out,
                                                           pad, pad, relu, pool)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * c * k * k)
        assert (np.isnan(out) == np.isnan(want)).all()
        got[which] = out
    # images are independent: the split changes no image's sums
    np.testing.assert_array_equal(got["block"], got["block_parallel"])


@pytest.mark.parametrize("n,c,h,o,pad", [(6, 6, 14, 16, 0), (3, 1, 12, 6, 2)])
def test_bound_batch_block_and_its_direct_candidate(n, c, h, o, pad):
    r = np.random.default_rng(n + c)
    x, w, b = _f(r, n, c, h, h), _f(r, o, c, 5, 5), _f(r, o)
    node = _block_node(x, w, b, pad, True, True)
    want = _conv64(x, w, b, pad, True, True)
    fn = convblock.bind_block(node)                 # whichever ran faster here
    np.testing.assert_allclose(fn(x, w, b), want, rtol=1e-4, atol=1e-4 * c * 25)
    np.testing.assert_array_equal(fn(x.copy(), w, b), fn(x, w, b))
    attrs = {k: node.attrs[k] for k in ("stride", "padding", "dilation", "groups")}
    direct = convblock._direct_block(node, np.ascontiguousarray(w), b, True, True, attrs,
                                     any_taps=True)
    assert direct is not None
    np.testing.assert_allclose(direct(x, w, b), want, rtol=1e-4, atol=1e-4 * c * 25)
    x2 = _f(r, n + 1, c, h, h)                       # another batch: the op's kernel
    np.testing.assert_allclose(direct(x2, w, b), _conv64(x2, w, b, pad, True, True),
                               rtol=1e-4, atol=1e-4 * c * 25)


def test_faster_picks_the_faster_loop():
    import time
    calls = []

    def slow(a):
        calls.append("slow")
        time.sleep(2e-3)

    def fast(a):
        calls.append("fast")
    assert convblock._faster([slow, fast], lambda f: f(0)) is fast
    assert calls.count("slow") >= 3 and calls.count("fast") >= 3   # warm call + 2 rounds


def _dense_node(m, k, n, relu, r):
    g = Graph()
    xv = g.add_input((m, k), np.float32)
    w, b = _f(r, k, n), _f(r, n)
    node = Node("dense", [xv, g.add_const(w), g.add_const(b)], {"relu": relu})
    node.outputs.append(Value(g._new_id(), (m, n), np.float32, node=node))
    return node, w, b


@pytest.mark.parametrize("m,k,n", [(64, 400, 120), (9, 120, 84), (33, 84, 10),
                                   (64, 17, 3)])
@pytest.mark.parametrize("relu", [True, False])
def test_bound_batch_dense_against_float64(m, k, n, relu):
    r = np.random.default_rng(m + k + n)
    node, w, b = _dense_node(m, k, n, relu, r)
    x = _f(r, m, k)
    want = _dense64(x, w, b, relu)
    fn = gemv.bind_dense(node)
    np.testing.assert_allclose(fn(x, w, b), want, rtol=1e-4, atol=1e-4 * k)
    assert gemv.batch_loop_for(m, k, n) in (None, gemv._dense_serial, gemv._dense_parallel)
    for loop in (gemv._dense_serial, gemv._dense_parallel):    # each candidate itself
        out = np.full((m, n), np.nan, np.float32)
        loop(x, gemv.pack(w), b, relu, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * k)
    x2 = _f(r, m + 1, k)                              # another shape: the op's kernel
    np.testing.assert_allclose(fn(x2, w, b), _dense64(x2, w, b, relu), rtol=1e-4,
                               atol=1e-4 * k)


def test_big_batch_dense_keeps_blas():
    """Past BATCH_LOOP_MACS the loops are not raced: the GEMM path serves."""
    r = np.random.default_rng(9)
    m, k, n = 128, 256, 200
    assert m * k * n > gemv.BATCH_LOOP_MACS
    node, w, b = _dense_node(m, k, n, True, r)
    fn = gemv.bind_dense(node)
    assert fn.__name__ == "dense_gemm"
    x = _f(r, m, k)
    np.testing.assert_allclose(fn(x, w, b), _dense64(x, w, b, True), rtol=1e-4,
                               atol=1e-4 * k)
    np.testing.assert_allclose(OPS["dense"].kernel(x, w, b, relu=True),
                               _dense64(x, w, b, True), rtol=1e-4, atol=1e-4 * k)


def test_fastest_call_keeps_the_incumbent_on_a_near_tie():
    import time

    def a(_):
        time.sleep(1e-3)

    def b(_):
        time.sleep(0.99e-3)
    assert gemv.fastest_call([a, b], lambda f: f(0), margin=1.5) is a


def test_split_loops_race_only_under_a_passive_wait_policy_or_one_blas_thread(monkeypatch):
    from sampan import _threads
    monkeypatch.setattr(_threads, "openmp_wait_policy", lambda: "GOMP_SPINCOUNT=10000")
    monkeypatch.setattr(_threads, "blas_cap", lambda: 1)      # the "onednn" GEMM pool
    assert gemv.threads_beside_blas()
    monkeypatch.setattr(_threads, "blas_cap", lambda: None)   # OpenBLAS on every thread
    assert not gemv.threads_beside_blas()
    monkeypatch.setattr(gemv, "_BATCH_CHOSEN", {})
    monkeypatch.setattr(gemv, "_fastest_of", lambda loops, *a: loops[-1])
    assert gemv.batch_loop_for(64, 40, 30) is gemv._dense_serial      # no split loop
    monkeypatch.setattr(_threads, "openmp_wait_policy", lambda: "OMP_WAIT_POLICY=PASSIVE")
    assert gemv.threads_beside_blas()
    monkeypatch.setattr(gemv, "_BATCH_CHOSEN", {})
    assert gemv.batch_loop_for(64, 40, 30) is gemv._dense_parallel
