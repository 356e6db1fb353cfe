"""autocast: the op table's policy per op (eager and jit agree in dtypes and values), the
dtypes PyTorch's CPU autocast gives for the ops both have, nesting, threads, decorator
and gradients reaching float32 master weights."""
import threading

import numpy as np
import pytest

import sampan
from sampan.amp import autocast, get_autocast_dtype, is_autocast_enabled
from sampan.errors import SampanValueError
from sampan.ops.registry import OPS
from sampan.tensor import Tensor, apply

BF16, F32 = sampan.bfloat16, np.dtype(np.float32)
POLICY_OPS = sorted(n for n, op in OPS.items() if op.amp != "follow")


def _float(a):
    return isinstance(a, np.ndarray) and (a.dtype.kind == "f" or a.dtype == BF16)


def _sample(op):
    """The op's first sample whose float inputs are float32 (the autocast case)."""
    for s in op.samples():
        if any(_float(a) for a in s.args) and all(
                a.dtype == F32 for a in s.args if _float(a)):
            return s
    return None


def _outs(y):
    return list(y) if isinstance(y, tuple) else [y]


@pytest.mark.parametrize("name", POLICY_OPS)
def test_policy_per_op_eager_and_jit(name):
    op = OPS[name]
    s = _sample(op)
    if s is None:
        pytest.skip(f"{name}: no float32 sample")
    # "float32" ops: their inputs in bfloat16, to see them cast up
    args = [a.astype(BF16) if _float(a) and op.amp == "float32" else a for a in s.args]

    def f(*xs):
        with autocast(sampan.bfloat16):
            return apply(op, tuple(xs), dict(s.attrs))
    eager = _outs(f(*[Tensor(a) for a in args]))
    jitted = _outs(sampan.jit(f)(*[Tensor(a) for a in args]))
    want = BF16 if op.amp == "lower" else F32
    for e, j in zip(eager, jitted):
        if e.dtype.kind == "f" or e.dtype == BF16:
            assert e.dtype == want, f"{name}: {e.dtype}, policy {op.amp}"
        assert j.dtype == e.dtype
        a, b = (np.asarray(t.numpy(), np.float64) for t in (e, j))
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)


def _torch():
    return pytest.importorskip("torch")


def _cases(torch):
    F = torch.nn.functional
    sF = sampan.nn.functional
    r = np.random.default_rng(0)
    x = r.standard_normal((4, 8)).astype(np.float32)
    w = r.standard_normal((8, 8)).astype(np.float32)
    img = r.standard_normal((1, 2, 5, 5)).astype(np.float32)
    k = r.standard_normal((3, 2, 3, 3)).astype(np.float32)
    kt = r.standard_normal((2, 3, 3, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 3])
    t, s = torch.tensor, sampan.tensor
    tb = lambda a: t(a).bfloat16()                       # noqa: E731
    sb = lambda a: s(a).to(sampan.bfloat16)              # noqa: E731
    return {   # name: (sampan thunk, torch thunk)
        "matmul": (lambda: s(x) @ s(w), lambda: t(x) @ t(w)),
        "linear": (lambda: sF.linear(s(x), s(w), s(w[0])),
                   lambda: F.linear(t(x), t(w.T), t(w[0]))),
        "conv2d": (lambda: sF.conv2d(s(img), s(k)), lambda: F.conv2d(t(img), t(k))),
        "conv_transpose2d": (lambda: sF.conv_transpose2d(s(img), s(kt)),
                             lambda: F.conv_transpose2d(t(img), t(kt))),
        "einsum": (lambda: sampan.einsum("ij,jk->ik", s(x), s(w)),
                   lambda: torch.einsum("ij,jk->ik", t(x), t(w))),
        "bmm": (lambda: s(x[None]) @ s(w[None]), lambda: torch.bmm(t(x[None]), t(w[None]))),
        "softmax f32": (lambda: sampan.softmax(s(x), -1), lambda: torch.softmax(t(x), -1)),
        "softmax bf16": (lambda: sampan.softmax(sb(x), -1), lambda: torch.softmax(tb(x), -1)),
        "log_softmax f32": (lambda: sampan.log_softmax(s(x), -1),
                            lambda: F.log_softmax(t(x), -1)),
        "cross_entropy": (lambda: sampan.cross_entropy(sb(x), s(y)),
                          lambda: F.cross_entropy(tb(x), t(y))),
        "mse_loss": (lambda: sF.mse_loss(sb(x), s(w[:4])), lambda: F.mse_loss(tb(x), t(w[:4]))),
        "prod": (lambda: sampan.prod(sb(x)), lambda: torch.prod(tb(x))),
        "add bf16+f32": (lambda: sb(x) + s(x), lambda: tb(x) + t(x)),
        "relu bf16": (lambda: sampan.relu(sb(x)), lambda: torch.relu(tb(x))),
        "gelu bf16": (lambda: sampan.gelu(sb(x)), lambda: F.gelu(tb(x))),
        "relu f32": (lambda: sampan.relu(s(x)), lambda: torch.relu(t(x))),
    }


def test_dtypes_match_pytorch_cpu_autocast():
    torch = _torch()
    names = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
    for name, (fs, ft) in _cases(torch).items():
        with autocast(sampan.bfloat16):
            a = fs()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b = ft()
        assert sampan.dtypes.dtype_name(a.dtype) == names[b.dtype], name
        np.testing.assert_allclose(np.asarray(a.numpy(), np.float32), b.float().numpy(),
                                   rtol=3e-2, atol=3e-2, err_msg=name)


def test_nesting_disabling_and_the_decorator():
    x, w = sampan.randn(3, 4), sampan.randn(4, 2)
    assert not is_autocast_enabled()
    with autocast(sampan.bfloat16):
        assert (x @ w).dtype == BF16 and get_autocast_dtype() == BF16
        with autocast(enabled=False):
            assert (x @ w).dtype == F32 and not is_autocast_enabled()
            with autocast(sampan.float16):
                assert (x @ w).dtype == np.float16
            assert (x @ w).dtype == F32
        assert (x @ w).dtype == BF16
    assert (x @ w).dtype == F32 and get_autocast_dtype() is None

    @autocast(sampan.float16)
    def f(a, b):
        return a @ b
    assert f(x, w).dtype == np.float16 and (x @ w).dtype == F32
    with pytest.raises(SampanValueError, match="bfloat16 or sampan.float16"):
        autocast(sampan.float32)
    from sampan.ops import modes
    with autocast(enabled=False):       # alone it pushes no mode: dispatch stays fast
        assert not modes.HOOKS.active and (x @ w).dtype == F32
        with autocast(sampan.bfloat16):  # and an enabled block inside it still casts
            assert (x @ w).dtype == BF16
        assert not modes.HOOKS.active


def test_thread_local():
    x, w = sampan.randn(3, 4), sampan.randn(4, 2)
    seen = []
    with autocast():
        t = threading.Thread(target=lambda: seen.append((x @ w).dtype))
        t.start()
        t.join()
        assert (x @ w).dtype == BF16
    assert seen == [F32]


def test_gradients_reach_float32_master_weights():
    r = np.random.default_rng(1)
    x = sampan.tensor(r.standard_normal((5, 6)).astype(np.float32))
    w = sampan.tensor(r.standard_normal((6, 3)).astype(np.float32), requires_grad=True)
    b = sampan.tensor(np.zeros(3, np.float32), requires_grad=True)
    y = sampan.tensor(np.array([0, 1, 2, 0, 1]))
    with autocast():
        loss = sampan.cross_entropy(x @ w + b, y)
    assert loss.dtype == F32
    loss.backward()
    assert w.grad.dtype == F32 and b.grad.dtype == F32
    w2 = sampan.tensor(w.numpy(), requires_grad=True)
    b2 = sampan.tensor(b.numpy(), requires_grad=True)
    sampan.cross_entropy(x @ w2 + b2, y).backward()
    np.testing.assert_allclose(w.grad.numpy(), w2.grad.numpy(), rtol=5e-2, atol=1e-2)

    def step(x, y):    # the same under jit: the casts are traced, their gradients too
        with autocast():
            return sampan.cross_entropy(x @ w + b, y)
    w.grad = None
    sampan.jit(step)(x, y).backward()
    assert w.grad.dtype == F32


def test_fused_casts_keep_the_rounding_points():
    """Casts to bf16 end fused groups (rounded on the way out) and casts from bf16 start
    them: with float32 fast math off the jit's results are eager's, bit for bit."""
    from sampan.passes import fuse
    r = np.random.default_rng(2)
    x = sampan.tensor(r.standard_normal((16, 32)).astype(np.float32))
    w1 = sampan.tensor(r.standard_normal((32, 32)).astype(np.float32))
    w2 = sampan.tensor(r.standard_normal((32, 8)).astype(np.float32))
    b = sampan.tensor(r.standard_normal(32).astype(np.float32))

    def f(x):
        with autocast():
            h = sampan.relu(x @ w1 + b)          # cast from bf16, add, relu: one kernel
            return sampan.relu(h * 0.5 - 0.25) @ w2   # ..., cast to bf16 at its end
    prev = fuse.FAST_MATH
    fuse.set_fast_math(False)
    try:
        jf = sampan.jit(f)
        got = jf(x)
        casts = [e for n in jf.graph.nodes if n.op == "fused" for e in n.attrs["body"]
                 if e[0] == "cast"]
    finally:
        fuse.set_fast_math(prev)
    assert got.dtype == BF16 and len(casts) >= 2
    np.testing.assert_array_equal(got.numpy().astype(np.float32),
                                  f(x).numpy().astype(np.float32))
