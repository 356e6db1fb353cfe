"""sampan.jit agrees with eager where it used to bake in or drop things (issue 16, items
10-12): gradients through jitted calls, guards on what a trace read, grads accumulated
by a backward inside a jitted function, and tensors made from data inside it."""
import numpy as np
import torch

import sampan
from sampan import nn


# ---------------------------------------------------------------------- item 12
def test_backward_inside_jit_accumulates_into_an_existing_grad():
    def f(x):
        (x * x).sum().backward()
        return x.grad * 1.0

    xe = sampan.tensor([1.0, 2.0], requires_grad=True)
    xj = sampan.tensor([1.0, 2.0], requires_grad=True)
    xt = torch.tensor([1.0, 2.0], requires_grad=True)
    jf = sampan.jit(f)
    for _ in range(3):
        ge, gj = f(xe), jf(xj)
        (xt * xt).sum().backward()
        np.testing.assert_array_equal(gj.numpy(), ge.numpy())
    np.testing.assert_array_equal(xj.grad.numpy(), xt.grad.numpy())    # [6, 12]
    np.testing.assert_array_equal(xe.grad.numpy(), xt.grad.numpy())
    xj.grad = None            # and back to no grad: the first trace applies again
    jf(xj)
    np.testing.assert_array_equal(xj.grad.numpy(), [2.0, 4.0])
    assert jf.n_traces == 2


def test_tensors_made_from_data_inside_jit_are_fresh_each_call():
    def f(x):
        acc = sampan.tensor([0.0, 0.0])
        acc.add_(x)
        buf = sampan.from_numpy(np.ones(2, np.float32))
        buf.mul_(x)
        return acc, buf, sampan.tensor([7.0, 7.0])

    jf = sampan.jit(f)
    x = sampan.tensor([1.0, 2.0])
    for _ in range(3):
        a, b, c = jf(x)
        ea, eb, ec = f(x)
        np.testing.assert_array_equal(a.numpy(), ea.numpy())
        np.testing.assert_array_equal(b.numpy(), eb.numpy())
        np.testing.assert_array_equal(c.numpy(), ec.numpy())
        c.add_(1.0)           # changing a result must not change the next call's
    assert jf.n_traces == 1


def test_batch_norm_created_per_call_matches_eager_and_torch():
    r = np.random.default_rng(0)
    xs = r.standard_normal((6, 3)).astype(np.float32) * 2 + 1

    def f(x):
        bn = nn.BatchNorm1d(3)
        return bn(x), bn.running_mean, bn.running_var, bn.num_batches_tracked

    jf = sampan.jit(f)
    x = sampan.tensor(xs)
    for _ in range(3):
        out_j, out_e = jf(x), f(x)
        bn_t = torch.nn.BatchNorm1d(3)
        yt = bn_t(torch.from_numpy(xs))
        ref = (yt.detach().numpy(), bn_t.running_mean.numpy(), bn_t.running_var.numpy(),
               bn_t.num_batches_tracked.numpy())
        for a, b, c in zip(out_j, out_e, ref):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(a.numpy(), c, rtol=1e-5, atol=1e-5)
