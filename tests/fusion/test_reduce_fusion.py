"""Reductions fused with their elementwise prologue/epilogue (row kernels) and matmul
epilogues: kernel counts per composite and equality with eager (bit-exact by default)."""
import numpy as np
import pytest

import sampan
from sampan.ops import composite
from sampan.backends.numba.mathlib import pairwise_sum
from sampan.passes.fuse import count_kernels, set_fast_math, set_fuse_reductions
from sampan.passes import fuse as _fuse_mod

_FAST_MATH0 = _fuse_mod.FAST_MATH   # restored after each test that switches it

pytest.importorskip("numba")


@pytest.mark.parametrize("n", [1, 7, 8, 100, 128, 129, 300, 1000, 4099])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_pairwise_sum_is_numpys(n, dt):
    x = (np.random.default_rng(n).standard_normal((3, n)) * 100).astype(dt)
    ref = np.sum(x, axis=-1)
    got = [dt(0) + pairwise_sum(x[i], 0, n, dt(0)) for i in range(3)]
    np.testing.assert_array_equal(np.array(got, dt), ref)


def _rms(x):
    return sampan.rms_norm(x, x.shape[-1])


COMPOSITES = {  # name -> (fn, fused kernels with exact math, with fast math)
    "softmax": (lambda x, w: sampan.softmax(x, -1), 3, 1),
    "log_softmax": (lambda x, w: sampan.log_softmax(x, -1), 6, 1),
    "layer_norm": (lambda x, w: sampan.layer_norm(x, x.shape[-1], w, w), 1, 1),
    "rms_norm": (lambda x, w: _rms(x) * w, None, None),
    "mean_center": (lambda x, w: x - x.mean(-1, keepdims=True), 1, 1),
}


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("shape", [(64, 128), (2, 5, 300), (3, 5)])
@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_reduction_composites_fused_equal_eager(name, shape, fast, monkeypatch):
    # the composites' primitive definitions (over the last axis they normally run as the
    # row ops of ops/rowwise.py): reduction fusion on real max/sum/mean chains
    monkeypatch.setattr(composite, "row_ops", lambda *a: False)
    f, k_exact, k_fast = COMPOSITES[name]
    set_fast_math(fast)
    try:
        r = np.random.default_rng(0)
        x = sampan.Tensor(r.standard_normal(shape).astype(np.float32))
        w = sampan.Tensor(r.standard_normal(shape[-1:]).astype(np.float32))
        j = sampan.jit(f, debug=True)
        got, ref = j(x, w).numpy(), f(x, w).numpy()
        if fast:
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        else:  # exact fusion reproduces the primitives bit for bit
            np.testing.assert_array_equal(got, ref)
        want = k_fast if fast else k_exact
        if want is not None:
            assert count_kernels(j.graph)["total"] == want, str(j.graph)
    finally:
        set_fast_math(_FAST_MATH0)   # as the suite found it (on by default)


def test_reduction_fusion_switch_and_gradients(monkeypatch):
    # through the composites' primitives, which is what reduction fusion works on
    monkeypatch.setattr(composite, "row_ops", lambda *a: False)
    monkeypatch.setattr(_fuse_mod, "FAST_MATH", False)   # bit-exact kernels: compared exactly
    r = np.random.default_rng(1)
    x = sampan.tensor(r.standard_normal((16, 32)).astype(np.float32), requires_grad=True)

    def step(x):
        y = sampan.layer_norm(x, 32)
        loss = (sampan.softmax(y, -1) * y).sum()
        loss.backward()
        return loss, x.grad
    on = sampan.jit(step)
    l1, g1 = on(x)
    x.grad = None
    set_fuse_reductions(False)
    try:
        off = sampan.jit(step)
        _, g2 = off(x)
    finally:
        set_fuse_reductions(True)
    x.grad = None
    l3, g3 = step(x)
    np.testing.assert_array_equal(l1.numpy(), l3.numpy())
    np.testing.assert_array_equal(g1.numpy(), g3.numpy())
    np.testing.assert_array_equal(g2.numpy(), g3.numpy())
    assert count_kernels(on.graph)["total"] < count_kernels(off.graph)["total"]


def test_matmul_epilogue_is_one_fused_kernel_reading_the_gemm():
    nn = sampan.nn
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
    x = sampan.randn(8, 32)
    j = sampan.jit(lambda x: m(x) + x.sum(-1, keepdims=True))
    np.testing.assert_array_equal(j(x).numpy(), (m(x) + x.sum(-1, keepdims=True)).numpy())
    ops = [n.op for n in j.graph.nodes]
    assert ops.count("matmul") == 1 and "relu" not in ops and "add" not in ops, ops
    fused = [n for n in j.graph.nodes if n.op == "fused"]
    mm = next(n for n in j.graph.nodes if n.op == "matmul").outputs[0]
    assert any(mm in n.inputs and n.attrs["body"][0][0] == "add" for n in fused)
