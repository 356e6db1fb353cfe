"""Issue 31: under jit the elementwise and row ops around bf16 GEMMs are fused in
bfloat16: the generated numba kernels read and write bfloat16 as its uint16 bits with
float32 compute (no float32 copy of an operand or result): the numbers of the float32
chain rounded once at the kernel's outputs, as before, bit for bit."""
import numpy as np
import pytest

import sampan
import sampan.nn.functional as F
from sampan import dtypes as dt
from sampan.backends.numba.mathlib import bf16_load, bf16_store
from sampan.jit.api import trace
from sampan.passes import fuse as fuse_mod
from sampan.passes.fuse import fuse_graph
from sampan.runtime import compile_graph
from sampan.runtime.codegen import NODE_KERNELS


@pytest.fixture(autouse=True)
def _fast_math():
    """bfloat16 arithmetic fuses only with the fusion's fast math on (its default; other
    tests may leave it off)."""
    before = fuse_mod.FAST_MATH
    fuse_mod.set_fast_math(True)
    yield
    fuse_mod.set_fast_math(before)


def _bf(*shape, seed=0, scale=1.0):
    r = np.random.default_rng(seed)
    return (r.standard_normal(shape) * scale).astype(np.float32).astype(dt.bfloat16)


def _bits(a):
    return np.asarray(a).view(np.uint16)


def test_bf16_load_store_match_ml_dtypes_bit_for_bit():
    from numba import njit

    @njit
    def round_trip(x, o, back):
        for i in range(x.shape[0]):
            o[i] = bf16_store(x[i])
            back[i] = bf16_load(o[i])
    r = np.random.default_rng(0)
    x = np.concatenate([
        r.standard_normal(20000).astype(np.float32) * np.float32(1e3),
        r.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.array([np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-40, 1.00390625,
                  1.01171875], np.float32)])       # the last two: ties to even
    o, back = np.empty(x.shape, np.uint16), np.empty(x.shape, np.float32)
    round_trip(x, o, back)
    with np.errstate(invalid="ignore"):
        want = x.astype(dt.bfloat16)
    nan = np.isnan(x)
    assert np.array_equal(o[~nan], _bits(want)[~nan])
    assert np.isnan(back[nan]).all()
    assert np.array_equal(back[~nan], want[~nan].astype(np.float32))


def _kernel(fn, *arrays):
    """The generated kernel of fn's one fused node, and fn compiled (fused)."""
    g = trace(fn, tuple(sampan.tensor(a) for a in arrays))[0]
    assert fuse_graph(g) >= 1
    node = next(n for n in g.nodes if n.op == "fused")
    run = compile_graph(g)
    return NODE_KERNELS["fused"](node), lambda *xs: _one(run(*xs))


def _one(r):
    return r[0] if isinstance(r, (tuple, list)) and len(r) == 1 else r


def _f32_chain(fn, *arrays):
    """fn in float32 on the bf16 inputs, rounded to bfloat16 once at the end."""
    out = fn(*[sampan.tensor(a.astype(np.float32)) for a in arrays])
    return out.numpy().astype(dt.bfloat16)


def _ulps(a, b):
    return int(np.abs(_bits(a).astype(np.int32) - _bits(b).astype(np.int32)).max())


@pytest.mark.parametrize("shape_b", [(48,), (6, 48), (1,)])
def test_elementwise_kernel_reads_and_writes_bf16_bits(shape_b):
    a, b = _bf(6, 48), _bf(*shape_b, seed=1)
    fn = lambda x, y: (x + y) * x - y                   # noqa: E731
    k, _ = _kernel(fn, a, b)
    assert "bf16_load(" in k.source and "bf16_store(" in k.source
    assert "dtype=np.float32" not in k.source and ".astype(_bf16)" not in k.source
    got = k(a, b)
    want = _f32_chain(fn, a, b)
    assert got.dtype == dt.bfloat16 and np.array_equal(_bits(got), _bits(want))
    # into a planned bfloat16 buffer, without a copy
    buf = np.empty(want.shape, dt.bfloat16)
    assert k(a, b, out=[buf]) is buf and np.array_equal(_bits(buf), _bits(want))
    # a mathlib body (GELU's erf): within one bfloat16 ulp of the float32 chain
    fn2 = lambda x, y: sampan.gelu(x + y) * x           # noqa: E731
    k2, _ = _kernel(fn2, a, b)
    got2 = k2(a, b)
    assert "bf16_store(" in k2.source and _ulps(got2, _f32_chain(fn2, a, b)) <= 1


def test_mixed_kernel_bf16_in_float32_out_and_column_sum():
    a = _bf(8, 32)
    def fn(x):
        return sampan.cast(x, "float32") * 3.0, sampan.cast(x, "float32").sum((0,))
    k, run = _kernel(fn, a)
    assert "bf16_load(" in k.source
    got = run(a)
    want = fn(sampan.tensor(a))
    assert got[0].dtype == np.float32 and np.array_equal(got[0], want[0].numpy())
    np.testing.assert_allclose(got[1], want[1].numpy(), rtol=1e-6)


def _centred(x):
    xf = sampan.cast(x, "float32")            # as autocast runs row statistics
    return sampan.cast((xf - sampan.mean(xf, -1, keepdim=True)) * xf, "bfloat16")


def _max_shift(x):
    xf = sampan.cast(x, "float32")
    return sampan.cast(sampan.exp(xf - sampan.amax(xf, -1, keepdim=True)), "bfloat16")


@pytest.mark.parametrize("fn", [_centred, _max_shift])
def test_row_kernels_read_and_write_bf16_bits(fn):
    a = _bf(16, 300, seed=2)                  # rows longer than one pairwise block
    k, run = _kernel(fn, a)
    assert "bf16_load(" in k.source and "bf16_store(" in k.source
    assert "dtype=np.float32" not in k.source and ".astype(_bf16)" not in k.source
    got = run(a)
    want = fn(sampan.tensor(a)).numpy()       # eager: the same float32 chain
    assert got.dtype == dt.bfloat16 and _ulps(got, want) <= 1


def _block(x, t, w1, b1, w2, b2, g, bt):
    h = F.linear(sampan.layer_norm(x, 64, g, bt), w1, b1)
    h = sampan.gelu(h)
    y = x + F.linear(h, w2, b2)
    return (sampan.softmax(y, -1) * t).sum()


def test_jit_autocast_block_fuses_in_bf16_and_matches_eager():
    r = np.random.default_rng(3)

    def p(*s, scale=0.1):
        return sampan.tensor((r.standard_normal(s) * scale).astype(np.float32),
                             requires_grad=True)
    x = sampan.tensor(r.standard_normal((32, 64)).astype(np.float32))
    t = sampan.tensor(r.standard_normal((32, 64)).astype(np.float32))
    ps = [p(64, 128), p(128), p(128, 64), p(64), p(64, scale=1.0), p(64)]

    def step(x):
        with sampan.amp.autocast(sampan.bfloat16):
            loss = _block(x, t, *ps)
        loss.backward()
        return loss

    grads = []
    for run in (step, sampan.jit(step)):
        for t in ps:
            t.grad = None
        loss = run(x)
        grads.append((float(loss.item()), [t.grad.numpy().copy() for t in ps]))
    (le, ge), (lj, gj) = grads
    assert lj == pytest.approx(le, rel=1e-3)
    for a, b in zip(gj, ge):
        np.testing.assert_allclose(a, b, rtol=3e-2, atol=3e-2 * float(np.abs(b).max()))
    g = sampan.jit(step)
    g(x)
    kernels = [NODE_KERNELS["fused"](n) for n in g.graph.nodes if n.op == "fused"
               and any(v.dtype == dt.bfloat16 for v in list(n.inputs) + list(n.outputs))]
    assert kernels, str(g.graph)
    assert all("dtype=np.float32" not in k.source for k in kernels)
    assert any("bf16_store(" in k.source for k in kernels)


def test_relu_grad_of_bf16_runs_on_the_bits_exactly():
    """W2's bf16 backward: relu_grad on bfloat16 through a loop over the uint16 bits,
    equal to numpy's where(a > 0, g, 0) on every class of value."""
    from sampan.ops.registry import OPS
    r = np.random.default_rng(5)
    a = np.concatenate([r.standard_normal(5000).astype(np.float32),
                        np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40],
                                 np.float32)]).astype(dt.bfloat16)
    g = r.standard_normal(a.shape).astype(np.float32).astype(dt.bfloat16)
    got = OPS["relu_grad"].kernel(a.reshape(-1, 2), g.reshape(-1, 2))
    with np.errstate(invalid="ignore"):
        want = np.where(a > 0, g, g.dtype.type(0)).astype(g.dtype).reshape(-1, 2)
    assert got.dtype == dt.bfloat16 and np.array_equal(_bits(got), _bits(want))
