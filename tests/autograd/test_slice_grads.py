"""Eager backward of tensors read through several basic-index slices: the engine keeps
the slices pending and materialises them once (SliceGrads). Gradients must equal
PyTorch's, including overlapping slices, slices mixed with a whole-tensor use, hooks
and second order (which takes the op path)."""
import numpy as np
import torch

import sampan
from sampan.autograd.engine import SliceGrads
from sampan.tensor import Tensor


def _both(a, f):
    x = sampan.tensor(a, requires_grad=True)
    f(x).backward()
    t = torch.tensor(a, requires_grad=True)
    f(t).backward()
    return x.grad, t.grad.numpy()


def test_qkv_slices_overlaps_and_whole_use_match_torch():
    a = np.random.default_rng(0).standard_normal((3, 4, 5))

    def f(x):
        q = x.permute(1, 0, 2)
        return ((q[:, 0] * q[:, 1]).sum() + (q[:, 2] ** 2).sum() + q[:, 0].sum()
                + (q[1:3] * 3.0).sum() + (x * x).sum())
    g, ref = _both(a, f)
    assert type(g) is Tensor
    np.testing.assert_allclose(g.numpy(), ref, rtol=1e-12, atol=1e-12)


def test_leaf_read_through_slices_gets_a_dense_grad():
    a = np.random.default_rng(1).standard_normal((4, 3))
    g, ref = _both(a, lambda x: (x[0] * 2.0).sum() + (x[2] ** 3).sum() + x[0, 1])
    assert type(g) is Tensor
    np.testing.assert_allclose(g.numpy(), ref, rtol=1e-12)


def test_hooks_see_dense_tensors_and_second_order_works():
    a = np.random.default_rng(2).standard_normal((2, 3))
    x = sampan.tensor(a, requires_grad=True)
    y = x * 1.0
    seen = []
    y.register_hook(lambda g: seen.append(type(g)))
    (y[0].sum() + (y[1] ** 2).sum()).backward()
    assert seen == [Tensor]
    expect = np.stack([np.ones(3), 2 * a[1]])
    np.testing.assert_allclose(x.grad.numpy(), expect)
    x = sampan.tensor(a, requires_grad=True)
    (g,) = sampan.grad((x[0] ** 3).sum() + (x[1] ** 2).sum(), [x], create_graph=True)
    (gg,) = sampan.grad(g.sum(), [x])
    np.testing.assert_allclose(gg.numpy(), np.stack([6 * a[0], 2 * np.ones(3)]))


def test_merge_and_materialise():
    s = SliceGrads((3, 2), np.float64, [((0,), np.array([1.0, 2.0]))])
    s = s.merge(SliceGrads((3, 2), np.float64, [((slice(0, 2),), np.ones((2, 2)))]))
    np.testing.assert_array_equal(s.tensor().numpy(), [[2, 3], [1, 1], [0, 0]])
