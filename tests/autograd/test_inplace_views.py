"""In-place ops through views are recorded on the base's history (as PyTorch's
CopySlices does), eager and under sampan.jit; gradient rules save only what they read;
hook handles. Every case runs the same code on torch (float64) and on sampan."""
import numpy as np
import pytest
import torch

import sampan
from sampan.errors import AutogradError

def _then(y, f):
    f(y)
    return y


# ---------------------------------------------------------------------- what each rule saves
SAVE_CASES = {
    "mul_const_then_imul": lambda a, u: _then(a * 2.0, lambda q: q.__imul__(0.5)),
    "div_const_then_idiv": lambda a, u: _then(a / 2.0, lambda q: q.__itruediv__(4.0)),
    "const_mul_then_add_": lambda a, u: _then(3.0 * a, lambda q: q.add_(1.0)),
    "mul_by_tensor_": lambda a, u: _then(a * 1.0, lambda y: y.mul_(u)),       # reads old y
    "div_by_tensor_": lambda a, u: _then(a * 1.0, lambda y: y.div_(u)),       # reads old y
}


def _save_case(lib, case, create_graph):
    mk = (lambda v: torch.tensor(v, requires_grad=True)) if lib is torch else \
        (lambda v: sampan.tensor(v, requires_grad=True))
    a, u = mk(np.array([0.5, -1.5, 2.0])), mk(np.array([1.5, 2.5, -0.5]))
    y = SAVE_CASES[case](a, u)
    loss = (y * y).sum()
    if lib is torch:
        ga, gu = torch.autograd.grad(loss, [a, u], create_graph=create_graph,
                                     allow_unused=True)
    else:
        ga, gu = sampan.grad(loss, [a, u], create_graph=create_graph, allow_unused=True)
    out = [y, ga, gu]
    if create_graph:   # second order: d(sum ga)/d(a, u)
        s = ga.sum()
        out += list(torch.autograd.grad(s, [a, u], allow_unused=True) if lib is torch
                    else sampan.grad(s, [a, u], allow_unused=True))
    return [None if t is None else np.asarray(t.detach().numpy()) for t in out]


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("case", sorted(SAVE_CASES))
def test_inplace_after_op_that_needs_only_the_other_input(case, create_graph):
    want = _save_case(torch, case, create_graph)
    got = _save_case(sampan, case, create_graph)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None or not np.any(g), i
        else:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=str(i))


def test_mul_self_inplace_reads_the_old_value():
    # torch raises here (mul saved y); sampan keeps a copy of the old y: y^2, d/da = 4a^3
    a = sampan.tensor([0.5, -1.5, 2.0], requires_grad=True)
    y = a * 1.0
    y.mul_(y)
    (y * y).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), 4 * a.numpy() ** 3, rtol=1e-12)


def test_modified_saved_input_still_raises():
    a = sampan.tensor([1.0, 2.0], requires_grad=True)
    u = sampan.tensor([3.0, 4.0], requires_grad=True)
    y = a * 1.0
    z = y * u               # u's gradient reads y
    y.add_(1.0)
    with pytest.raises(AutogradError, match="modified in place"):
        z.sum().backward()


def test_saved_old_value_under_jit():
    def body(a, u):
        y = a * 1.0
        y.mul_(u)
        return sampan.grad((y * y).sum(), [a, u])
    a = sampan.tensor([0.5, -1.5, 2.0], requires_grad=True)
    u = sampan.tensor([1.5, 2.5, -0.5], requires_grad=True)
    want = [g.numpy() for g in body(a, u)]
    got = sampan.jit(body)(a, u)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-12)
