"""Every op of the table, every sample: eager and jit agree on values and gradients."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import sampan
from sampan.ops.composite import COMPOSITES
from sampan.ops.registry import NOT_DIFFERENTIABLE, OPS
from sampan.tensor import Tensor, apply


def _cases():
    for name, op in sorted(OPS.items()):
        if op.samples is None:
            continue
        for i, s in enumerate(op.samples()):
            yield pytest.param(name, i, id=f"{name}-{i}")


def _diff_idx(op, s):
    if op.grad in (None, NOT_DIFFERENTIABLE):
        return ()
    if s.diff is not None:
        return tuple(s.diff)
    return tuple(i for i, a in enumerate(s.args)
                 if sampan.dtypes.is_floating(np.asarray(a).dtype)
                 and i not in op.nondiff_inputs)


def _check_same(a, b, rtol=1e-6):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.dtype.kind == "f" or a.dtype == sampan.bfloat16:
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol,
                                   atol=1e-6)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name,i", list(_cases()))
def test_op_eager_equals_jit(name, i):
    op = OPS[name]
    s = op.samples()[i]
    diff = _diff_idx(op, s)
    arrays = [np.asarray(a) for a in s.args]

    def run(*xs):
        y = apply(op, xs, dict(s.attrs))
        ys = y if isinstance(y, tuple) else (y,)
        if not diff:
            return ys
        loss = sum(((t * t).sum() for t in ys), sampan.zeros((), dtype=ys[0].dtype))
        gs = sampan.grad(loss, [xs[k] for k in diff], allow_unused=True)
        return ys + tuple(g for g in gs if g is not None)

    def fresh():
        return [Tensor(a.copy(), requires_grad=k in diff) for k, a in enumerate(arrays)]
    eager = run(*fresh())
    jf = sampan.jit(run, debug=True)
    specs = op.shape_rule(*[sampan.ops.registry.Spec(a.shape, a.dtype) for a in arrays],
                          **s.attrs)
    specs = specs if isinstance(specs, (tuple, list)) else (specs,)
    if any(isinstance(d, str) for sp in specs for d in sp.shape):
        with pytest.raises(sampan.jit.TracingError, match="depends on the data"):
            jf(*fresh())
        return
    got = jf(*fresh())
    assert len(got) == len(eager)
    for a, b in zip(eager, got):
        _check_same(a.numpy(), b.numpy())
    sampan.ir.verify(jf.graph)
    g = jf.graph
    assert sampan.ir.parse(str(g), {c.name: c.const for c in g.consts}) == g


def _comp_cases():
    for name, (fn, samples) in sorted(COMPOSITES.items()):
        for i, _ in enumerate(samples()):
            yield pytest.param(name, i, id=f"{name}-{i}")


@pytest.mark.parametrize("name,i", list(_comp_cases()))
def test_composite_eager_equals_jit(name, i):
    fn, samples = COMPOSITES[name]
    s = samples()[i]
    is_arr = [isinstance(a, np.ndarray) for a in s.args]
    diff = s.diff if s.diff is not None else tuple(
        k for k, a in enumerate(s.args) if is_arr[k] and a.dtype.kind == "f")

    def run(*xs):
        y = fn(*xs, **s.attrs)
        ts = [x for k, x in enumerate(xs) if k in diff]
        gs = sampan.grad(y.sum(), ts, allow_unused=True) if ts else ()
        return (y,) + tuple(g for g in gs if g is not None)

    def fresh():
        return [Tensor(a.copy(), requires_grad=k in diff) if is_arr[k] else a
                for k, a in enumerate(s.args)]
    eager = run(*fresh())
    got = sampan.jit(run, debug=True)(*fresh())
    for a, b in zip(eager, got):
        _check_same(a.numpy(), b.numpy(), rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["add", "mul", "sub", "maximum", "div"]),
       st.lists(st.integers(1, 4), min_size=0, max_size=3),
       st.lists(st.booleans(), min_size=3, max_size=3))
def test_binary_broadcast_property(name, shape, ones):
    a_shape = tuple(shape)
    b_shape = tuple(1 if o else d for d, o in zip(shape, ones))
    r = np.random.default_rng(len(shape))
    a = r.uniform(0.5, 2, a_shape).astype(np.float32)
    b = r.uniform(0.5, 2, b_shape).astype(np.float32)
    f = getattr(sampan, name)

    def run(x, y):
        z = f(x, y).tanh()
        gx, gy = sampan.grad(z.sum(), [x, y])
        return z, gx, gy
    eager = run(Tensor(a, requires_grad=True), Tensor(b, requires_grad=True))
    got = sampan.jit(run)(Tensor(a, requires_grad=True), Tensor(b, requires_grad=True))
    for e, g in zip(eager, got):   # fused fast-math tanh: a few ulps from numpy's
        np.testing.assert_allclose(e.numpy(), g.numpy(), rtol=1e-5, atol=1e-6)
