"""The sparse ops (sampan.ops.sparse): forward against numpy/PyTorch, gradients by
finite differences, and the gradient of a lookup being the summed rows of unique ids."""

import numpy as np
import pytest
import torch

import sampan
from sampan.autograd import gradcheck, gradgradcheck
from sampan.ops.sparse import (
    pair_dots,
    pair_dots_grad,
    rows_gather,
    rows_scatter_add,
    triu_gather,
    triu_scatter,
)


def _f64(r, *shape):
    return sampan.tensor(r.standard_normal(shape), requires_grad=True)


def test_rows_gather_forward_and_summed_row_gradient():
    r = np.random.default_rng(0)
    src = r.standard_normal((6, 4)).astype(np.float32)
    idx = np.array([5, 0, 5, 5, 2])
    x = sampan.tensor(src, requires_grad=True)
    y = rows_gather(x, idx)
    np.testing.assert_array_equal(y.numpy(), src[idx])
    g = r.standard_normal((5, 4)).astype(np.float32)
    (y * sampan.tensor(g)).sum().backward()
    tx = torch.tensor(src, requires_grad=True)
    (tx[torch.tensor(idx)] * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)
    assert (x.grad.numpy()[[1, 3, 4]] == 0).all()


def test_gradchecks_float64():
    r = np.random.default_rng(1)
    idx = np.array([3, 0, 3, 1])
    assert gradcheck(lambda s: rows_gather(s, idx), [_f64(r, 5, 3)])
    assert gradcheck(lambda v: rows_scatter_add(v, idx, 6), [_f64(r, 4, 3)])
    assert gradcheck(triu_gather, [_f64(r, 2, 4, 4)])
    assert gradcheck(lambda v: triu_scatter(v, 4), [_f64(r, 2, 6)])
    assert gradgradcheck(lambda s: rows_gather(s, idx) ** 2, [_f64(r, 5, 3)])
    assert gradcheck(pair_dots, [_f64(r, 2, 4, 3)])
    assert gradcheck(pair_dots_grad, [_f64(r, 2, 6), _f64(r, 2, 4, 3)])
    assert gradgradcheck(pair_dots, [_f64(r, 2, 4, 3)])


def test_triu_matches_numpy_and_pair_interaction_matches_torch():
    r = np.random.default_rng(2)
    t = r.standard_normal((3, 5, 4)).astype(np.float32)
    iu, ju = np.triu_indices(5, 1)
    x = sampan.tensor(t, requires_grad=True)
    pairs = triu_gather(sampan.matmul(x, sampan.transpose(x, 1, 2)))
    tt = torch.tensor(t, requires_grad=True)
    tp = torch.bmm(tt, tt.transpose(1, 2))[:, iu, ju]
    np.testing.assert_allclose(pairs.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-5)
    g = r.standard_normal(pairs.shape).astype(np.float32)
    (pairs * sampan.tensor(g)).sum().backward()
    (tp * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-5)
    y = sampan.tensor(t, requires_grad=True)
    direct = pair_dots(y)
    np.testing.assert_allclose(direct.numpy(), pairs.numpy(), rtol=1e-5, atol=1e-6)
    (direct * sampan.tensor(g)).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-5)
    back = triu_scatter(sampan.tensor(g), 5).numpy()
    assert (back[:, iu, ju] == g).all() and np.count_nonzero(back) == np.count_nonzero(g)


def test_bad_shapes_name_the_op():
    with pytest.raises(sampan.SampanError, match="rows_gather"):
        rows_gather(np.zeros((3, 2, 2), np.float32), np.array([0]))
    with pytest.raises(sampan.SampanError, match="triu_scatter"):
        triu_scatter(np.zeros((2, 5), np.float32), 4)
    with pytest.raises(sampan.SampanError, match="rows_gather"):
        rows_gather(np.zeros((3, 2), np.float32), np.array([3]))


def test_numpy_fallbacks_match_numba_kernels():
    # the ops' default kernels (numba's loops where installed) against their numpy kernels
    from sampan.ops.registry import OPS

    r = np.random.default_rng(3)
    t = r.standard_normal((3, 5, 4)).astype(np.float32)
    g = r.standard_normal((3, 10)).astype(np.float32)
    pd, pdg = OPS["pair_dots"], OPS["pair_dots_grad"]
    fast = pd.kernel(t), pdg.kernel(g, t)
    slow = pd.kernels["numpy"](t), pdg.kernels["numpy"](g, t)
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
