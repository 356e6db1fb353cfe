"""Issue 29 item 19: vector_norm with 0 < p < 1 (and p < 0) has gradient 0 at exact zeros
as PyTorch (it was nan: p * 0^(p-1) * sign(0) = inf * 0), and index_add on a 0-d input
adds as PyTorch does (it raised a bare ZeroDivisionError). Eager and jit agree."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.errors import SampanError


def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("p", [0.5, 0.3, 1.5, -0.5])
@pytest.mark.parametrize("dim", [None, 1])
def test_vector_norm_gradient_at_zeros_matches_torch(p, dim):
    torch = _torch()
    x0 = np.array([[0.0, 1.5, -2.0, 0.0], [0.7, 0.0, -0.2, 3.0], [0.0, 0.0, 0.0, 0.0]])
    x = sampan.tensor(x0, requires_grad=True)
    y = sampan.linalg.vector_norm(x, p, dim)
    c = np.arange(1.0, y.numel() + 1).reshape(y.shape)
    (g,) = sampan.grad((y * sampan.tensor(c)).sum(), [x])
    t = torch.tensor(x0, requires_grad=True)
    ty = torch.linalg.vector_norm(t, p, dim)
    (tg,) = torch.autograd.grad((ty * torch.tensor(c)).sum(), t)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12)
    assert np.all(np.isfinite(g.numpy())), g.numpy()
    np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-10, atol=1e-12)


def test_vector_norm_small_p_away_from_zeros_matches_finite_differences():
    from sampan.autograd import gradcheck
    x = sampan.tensor(np.array([[0.4, -1.5, 2.0], [0.9, 0.3, -0.6]]), requires_grad=True)
    assert gradcheck(lambda t: sampan.linalg.vector_norm(t, 0.5, 1), [x])


def test_vector_norm_small_p_eager_and_jit_agree():
    x0 = np.array([[0.0, 1.5, -2.0, 0.0], [0.7, 0.0, -0.2, 3.0]])

    def f(x):
        (g,) = sampan.grad(sampan.linalg.vector_norm(x, 0.5, 1).sum(), [x])
        return g
    eager = f(sampan.tensor(x0, requires_grad=True)).numpy()
    jitted = sampan.jit(f)(sampan.tensor(x0, requires_grad=True)).numpy()
    np.testing.assert_array_equal(jitted, eager)
    assert np.all(np.isfinite(eager))


@pytest.mark.parametrize("index", [np.int64(0), np.array([0])], ids=["0-d", "1-d"])
@pytest.mark.parametrize("dim", [0, -1])
def test_index_add_on_a_0d_input_matches_torch(index, dim):
    torch = _torch()
    x = sampan.tensor(np.float64(1.25), requires_grad=True)
    s = sampan.tensor(np.float64(2.5), requires_grad=True)
    y = sampan.index_add(x, dim, sampan.tensor(np.asarray(index)), s, alpha=2)
    t = torch.index_add(torch.tensor(1.25, dtype=torch.float64), dim,
                        torch.tensor(np.asarray(index)), torch.tensor(2.5, dtype=torch.float64),
                        alpha=2)
    assert y.shape == () and float(y) == float(t) == 6.25
    gx, gs = sampan.grad(y, [x, s])
    assert gx.shape == gs.shape == () and float(gx) == 1.0 and float(gs) == 2.0


def test_index_add_0d_eager_and_jit_agree():
    def f(x, i, s):
        return sampan.index_add(x, 0, i, s)
    args = (np.float32(3.0), np.array([0]), np.float32(-0.5))
    eager = f(*(sampan.tensor(np.asarray(a)) for a in args))
    jitted = sampan.jit(f)(*(sampan.tensor(np.asarray(a)) for a in args))
    assert eager.shape == jitted.shape == () and float(eager) == float(jitted) == 2.5


@pytest.mark.parametrize("dim,index,src", [
    (1, [0], 2.0),                  # no dim 1 in a 0-d input
    (0, [1], 2.0),                  # index out of range
    (0, [0, 0], 2.0),               # two entries for one slot of a scalar
    (0, [0], [2.0]),                # a 1-d source for a 0-d input
])
def test_index_add_on_a_0d_input_refuses_what_torch_refuses(dim, index, src):
    x = sampan.tensor(np.float64(1.0))
    with pytest.raises(SampanError, match="index_add"):
        sampan.index_add(x, dim, sampan.tensor(np.array(index)),
                         sampan.tensor(np.asarray(src, np.float64)))


# index_select and index_copy had the same `dim % x.ndim` (ZeroDivisionError, IndexError)
def test_index_select_and_index_copy_on_a_0d_input_match_torch():
    torch = _torch()
    for index in (np.int64(0), np.array([0])):
        for dim in (0, -1):
            x = sampan.tensor(np.float64(1.25), requires_grad=True)
            s = sampan.tensor(np.float64(-3.0), requires_grad=True)
            i = sampan.tensor(np.asarray(index))
            ti = torch.tensor(np.asarray(index))
            tx = torch.tensor(1.25, dtype=torch.float64)
            y = sampan.index_select(x, dim, i)
            assert y.shape == () and float(y) == float(torch.index_select(tx, dim, ti))
            z = sampan.index_copy(x, dim, i, s)
            tz = torch.index_copy(tx, dim, ti, torch.tensor(-3.0, dtype=torch.float64))
            assert z.shape == () and float(z) == float(tz)
            gx, gs = sampan.grad(z, [x, s])
            assert float(gx) == 0.0 and float(gs) == 1.0


@pytest.mark.parametrize("call", [
    lambda x, i: sampan.index_select(x, 0, i([0, 0])),
    lambda x, i: sampan.index_select(x, 1, i([0])),
    lambda x, i: sampan.index_select(x, 0, i([1])),
    lambda x, i: sampan.index_copy(x, 0, i([0, 0]), sampan.tensor(np.float64(2.0))),
    lambda x, i: sampan.index_copy(x, 0, i([0]), sampan.tensor(np.array([2.0]))),
], ids=["two entries", "dim 1", "out of range", "copy two entries", "copy 1-d source"])
def test_index_select_and_copy_on_a_0d_input_refuse_with_a_sampan_error(call):
    with pytest.raises(SampanError, match="index_(select|copy)"):
        call(sampan.tensor(np.float64(1.0)), lambda v: sampan.tensor(np.array(v)))
