"""Autograd engine: iterative backward, accumulation, hooks, retain_graph, higher order,
version counter."""
import numpy as np
import pytest
import torch

import sampan
from sampan import AutogradError


def test_chain_of_10000_ops_does_not_recurse():
    x = sampan.tensor(np.ones(4), requires_grad=True)
    y = x
    for _ in range(10000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(4, 1.0001 ** 10000), rtol=1e-4)


def test_grad_accumulates_and_diamond():
    x = sampan.tensor([1.0, 2.0, 3.0], requires_grad=True)
    a = x * 2
    y = (a * a + a).sum()   # diamond: a used twice
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (2 * 2 * x.numpy() + 1))
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (4 * x.numpy() + 1) + 3)


def test_backward_twice_needs_retain_graph():
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    with pytest.raises(AutogradError, match="second time"):
        z = (x.exp() * x).sum()
        z.backward()
        z.backward()


def test_higher_order_matches_torch():
    xv = np.array([0.3, -1.2, 2.0])
    x = sampan.tensor(xv, dtype="float64", requires_grad=True)
    tx = torch.tensor(xv, requires_grad=True)
    y = (sampan.tanh(x) * x ** 3).sum()
    ty = (torch.tanh(tx) * tx ** 3).sum()
    (g,) = sampan.grad(y, [x], create_graph=True)
    (tg,) = torch.autograd.grad(ty, [tx], create_graph=True)
    (gg,) = sampan.grad(g.sum(), [x], create_graph=True)
    (tgg,) = torch.autograd.grad(tg.sum(), [tx], create_graph=True)
    (ggg,) = sampan.grad(gg.sum(), [x])
    (tggg,) = torch.autograd.grad(tgg.sum(), [tx])
    for a, b in [(g, tg), (gg, tgg), (ggg, tggg)]:
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-10)


def test_grad_of_nonleaf_and_unused():
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3
    y = (h * h).sum()
    gh, gx = sampan.grad(y, [h, x], retain_graph=True)
    np.testing.assert_allclose(gh.numpy(), 2 * h.numpy())
    np.testing.assert_allclose(gx.numpy(), 18 * x.numpy())
    z = sampan.tensor([1.0], requires_grad=True)
    with pytest.raises(AutogradError, match="not used"):
        sampan.grad(y, [z], retain_graph=True)
    assert sampan.grad(y, [z], allow_unused=True) == (None,)
    assert x.grad is None  # grad() does not accumulate


def test_hooks_and_retain_grad():
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    h = x * 2
    h.retain_grad()
    h.register_hook(lambda g: g * 10)   # replaces the gradient flowing on
    h.sum().backward()
    np.testing.assert_allclose(seen[0], [20.0, 20.0])
    np.testing.assert_allclose(x.grad.numpy(), [20.0, 20.0])


def test_no_grad_and_detach():
    x = sampan.tensor([1.0], requires_grad=True)
    with sampan.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    z = (x * 2).detach()
    assert not z.requires_grad

    @sampan.no_grad()
    def f(t):
        return t * 3
    assert not f(x).requires_grad
    assert sampan.is_grad_enabled()


def test_inplace_on_saved_tensor_raises():
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    a = x * 1.0
    y = a * a          # mul saves a
    a.add_(1.0)        # modifies a saved tensor
    with pytest.raises(AutogradError, match="modified in place"):
        y.sum().backward()


def test_inplace_on_view_of_saved_tensor_raises():
    x = sampan.tensor([1.0, 2.0, 3.0], requires_grad=True)
    a = x.exp()        # exp saves its output
    v = a[1:]
    with sampan.no_grad():
        v.mul_(2.0)
    with pytest.raises(AutogradError, match="modified in place"):
        a.sum().backward()


def test_inplace_not_saved_is_fine_and_correct():
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    a = x * 2.0
    b = a + 1.0        # add saves nothing
    a.add_(x)          # a now = 3x, history continues from the in-place add
    (a.sum() + b.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 5.0])
    y = sampan.tensor([1.0, 2.0], requires_grad=True)
    c = y * 2.0
    c.mul_(y)           # mul reads the old c for y's gradient: mul_ keeps a copy of it
    c.sum().backward()  # c = 2y^2
    np.testing.assert_allclose(y.grad.numpy(), [4.0, 8.0])


def test_inplace_on_leaf_requiring_grad_raises():
    x = sampan.tensor([1.0], requires_grad=True)
    with pytest.raises(AutogradError, match="leaf"):
        x.add_(1.0)
    with sampan.no_grad():
        x.add_(1.0)
    assert x.numpy()[0] == 2.0


def test_setitem_is_differentiable():
    x = sampan.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    v = sampan.tensor([7.0, 8.0, 9.0], requires_grad=True)
    y = x * 1.0
    y[1] = v * 2
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[1, 1, 1], [0, 0, 0]])
    np.testing.assert_allclose(v.grad.numpy(), [2, 2, 2])


def test_gradcheck_detects_wrong_gradient():
    from sampan.autograd import gradcheck
    from sampan.ops.registry import defop, OPS
    from sampan.ops._util import elementwise_rule
    from sampan.tensor import apply
    op = defop("_test_bad_square", elementwise_rule("_bad"), kernel=np.square,
               grad=lambda g, y, a: g * a)   # wrong: should be 2*a*g
    try:
        x = sampan.tensor(np.array([0.5, 1.5]), dtype="float64", requires_grad=True)
        with pytest.raises(AutogradError, match="differ"):
            gradcheck(lambda t: apply(op, (t,), {}), [x])
    finally:
        del OPS["_test_bad_square"]


def test_nonscalar_backward_needs_gradient():
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(AutogradError, match="one-element"):
        (x * 2).backward()
    (x * 2).backward(sampan.tensor([1.0, 0.5]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 1.0])
