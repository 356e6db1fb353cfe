"""sampan.experimental.vmap against torch.func.vmap: values, in_dims/out_dims, nesting,
per-sample gradients, gradients through vmap, and under jit."""
import numpy as np
import pytest
import torch

import sampan
from sampan.experimental import grad, vmap


def _r(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape)


def test_in_dims_out_dims_match_torch():
    xs, w = _r(5, 3), _r(3, 4, seed=1)
    got = vmap(lambda x, w: (x @ w).tanh(), in_dims=(0, None))(sampan.tensor(xs),
                                                                sampan.tensor(w))
    want = torch.func.vmap(lambda x, w: (x @ w).tanh(), in_dims=(0, None))(
        torch.tensor(xs), torch.tensor(w))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    a = _r(3, 6, 2)
    got = vmap(lambda x: (x.sum(0), x * 2), in_dims=1, out_dims=(0, 2))(sampan.tensor(a))
    want = torch.func.vmap(lambda x: (x.sum(0), x * 2), in_dims=1, out_dims=(0, 2))(
        torch.tensor(a))
    for g, t in zip(got, want):
        assert tuple(g.shape) == tuple(t.shape)
        np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-12)


def test_nested_vmap_is_an_outer_product():
    a, b = _r(4), _r(3, seed=2)
    f = vmap(vmap(lambda x, y: x * y, in_dims=(None, 0)), in_dims=(0, None))
    np.testing.assert_allclose(f(sampan.tensor(a), sampan.tensor(b)).numpy(), np.outer(a, b))


def test_per_sample_gradients_match_torch():
    w, xs, ys = _r(3), _r(6, 3, seed=3), _r(6, seed=4)

    def loss(w, x, y):
        return ((x * w).sum() - y) ** 2
    got = vmap(grad(loss), in_dims=(None, 0, 0))(*map(sampan.tensor, (w, xs, ys)))
    want = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(
        *map(torch.tensor, (w, xs, ys)))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


def test_gradient_through_vmap_and_under_jit():
    xs = sampan.tensor(_r(4, 3), requires_grad=True)
    y = vmap(lambda x: (x.sin() * x).sum())(xs)
    y.sum().backward()
    t = torch.tensor(xs.numpy(), requires_grad=True)
    torch.func.vmap(lambda x: (x.sin() * x).sum())(t).sum().backward()
    np.testing.assert_allclose(xs.grad.numpy(), t.grad.numpy(), rtol=1e-12)
    f = sampan.jit(vmap(lambda x: sampan.softmax(x, -1)))
    z = sampan.randn(3, 5)
    np.testing.assert_allclose(f(z).numpy(), sampan.softmax(z, -1).numpy(), rtol=1e-6)


def test_errors_name_the_problem():
    with pytest.raises(sampan.ShapeError, match="one size"):
        vmap(lambda x, y: x + y)(sampan.randn(3, 2), sampan.randn(4, 2))
    with pytest.raises(sampan.SampanValueError, match="no argument is mapped"):
        vmap(lambda x: x, in_dims=None)(sampan.randn(3))
    with pytest.raises(sampan.ShapeError, match="no such dim"):
        vmap(lambda x: x, in_dims=2)(sampan.randn(3))
    with pytest.raises(sampan.SampanValueError, match="randomness"):
        vmap(lambda x: x, randomness="same")
