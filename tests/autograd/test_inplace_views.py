"""In-place ops through views are recorded on the base's history (as PyTorch's
CopySlices does), eager and under sampan.jit; gradient rules save only what they read;
hook handles. Every case runs the same code on torch (float64) and on sampan."""
import numpy as np
import pytest
import torch

import sampan
from sampan.errors import AutogradError

W = np.random.default_rng(0).standard_normal((3, 4))   # weights of the loss: grads differ


def _x():
    return np.arange(12, dtype=np.float64).reshape(3, 4) / 5 - 1


def _u():
    return np.linspace(-1.5, 2.0, 4)


# Each case takes (x, u) (3x4 and 4-vectors requiring grad) and returns a 3x4 tensor;
# the code is the same for both libraries.
CASES = {
    "int_mul_": lambda x, u: _then(x * 1.0, lambda y: y[0].mul_(3.0)),
    "slice_add_": lambda x, u: _then(x * 2.0, lambda y: y[1:, 1:3].add_(u[:2])),
    "zero_": lambda x, u: _then(x * 1.0, lambda y: y[:, 2].zero_()),
    "fill_": lambda x, u: _then(x + 0.0, lambda y: y[2].fill_(7.0)),
    "relu_": lambda x, u: _then(x * 1.0, lambda y: y[:2].relu_()),
    "tanh_": lambda x, u: _then(x * 1.0, lambda y: y[:, ::2].tanh_()),
    "neg_": lambda x, u: _then(x * 1.0, lambda y: y[1].neg_()),
    "copy_": lambda x, u: _then(x * 1.0, lambda y: y[0].copy_(u * 2.0)),
    "sigmoid_detect": lambda x, u: _then(x * 1.0, lambda y: y[:, :2].sigmoid_()),
    "imul_row": lambda x, u: _imul_col(x * 1.0),
    "T_mul_": lambda x, u: _then(x * 1.0, lambda y: y.T.mul_(u.reshape(4, 1))),
    "reshape_mul_": lambda x, u: _then(x * 1.0, lambda y: y.reshape(2, 6).mul_(3.0)),
    "unsqueeze_squeeze": lambda x, u: _then(
        x * 1.0, lambda y: y.unsqueeze(0).squeeze(0)[1].mul_(u)),
    "view_of_view": lambda x, u: _then(x * 1.0, lambda y: y[1:][0][1:3].mul_(u[1:3])),
    "T_then_row": lambda x, u: _then(x * 1.0, lambda y: y.T[1].sigmoid_()),
    "mul_by_input": lambda x, u: _then(x * 1.0, lambda y: y[2].mul_(u)),
    "twice": lambda x, u: _then(x * 1.0, lambda y: (y[0].mul_(2.0), y[:, 0].add_(u[0]))),
    "base_reads_new": lambda x, u: _then(x * 1.0, lambda y: y[1].exp_()) * 2.0,
    "buffer_copy": lambda x, u: _buffer(x, u),
    "sibling_view": lambda x, u: _sibling(x),
    "one_element": lambda x, u: _then(x * 1.0, lambda y: y[1][2].mul_(u[0])),
    "setitem_of_view": lambda x, u: _then(x * 1.0, lambda y: y[2].__setitem__(
        slice(1, 3), u[:2] * 3.0)),
    # not views: a non-leaf overwritten by values that need no gradient
    "whole_zero_": lambda x, u: _then(x * 1.0, lambda y: y.zero_()) + x,
    "whole_fill_": lambda x, u: _then(x * 2.0, lambda y: y.fill_(3.0)),
    "whole_copy_const": lambda x, u: _then(x * 2.0, lambda y: y.copy_(y.detach() * 0.5)),
}
# torch.flip copies; sampan's flip is a numpy view, so writing through it writes row 2
FLIP = lambda x, u: _then(x * 1.0, lambda y: y.flip(0)[0].mul_(u))  # noqa: E731


def _then(y, f):
    f(y)
    return y


def _imul_col(b):
    b[:, 1] *= 5.0
    return b


def _buffer(x, u):
    # a plain zero tensor (no grad) written through views: it gains a history
    z = torch.zeros(3, 4, dtype=x.dtype) if isinstance(x, torch.Tensor) else \
        sampan.zeros((3, 4), dtype=x.dtype)
    z[0].copy_(x[1] * 2.0)
    z[1:, 1].add_(u[:2])
    return z


def _sibling(x):
    y = x * 1.0
    row = y[0]                 # made before the write: sees it (shares memory)
    y[0].mul_(3.0)
    return (y + row.unsqueeze(0)) * 1.0


def _torch_run(case):
    x = torch.tensor(_x(), requires_grad=True)
    u = torch.tensor(_u(), requires_grad=True)
    y = CASES[case](x, u)
    (y * torch.tensor(W)).sum().backward()
    return (y.detach().numpy(), x.grad.numpy(),
            None if u.grad is None else u.grad.numpy())


def _sampan_body(case, x, u):
    return _run_body(CASES[case], x, u)


def _run_body(f, x, u):
    y = f(x, u)
    gx, gu = sampan.grad((y * sampan.tensor(W)).sum(), [x, u], allow_unused=True)
    return y, gx, gu


def _np(t):
    return None if t is None else np.asarray(t.numpy())


@pytest.mark.parametrize("case", sorted(CASES))
def test_eager_matches_torch(case):
    ye, gxe, gue = _torch_run(case)
    x = sampan.tensor(_x(), requires_grad=True)
    u = sampan.tensor(_u(), requires_grad=True)
    y, gx, gu = _sampan_body(case, x, u)
    np.testing.assert_allclose(_np(y), ye, rtol=1e-12, atol=1e-12, err_msg="forward")
    np.testing.assert_allclose(_np(gx), gxe, rtol=1e-12, atol=1e-12, err_msg="grad x")
    if gue is None:
        assert gu is None or not np.any(_np(gu))
    else:
        np.testing.assert_allclose(_np(gu), gue, rtol=1e-12, atol=1e-12, err_msg="grad u")


@pytest.mark.parametrize("case", ["int_mul_", "slice_add_", "zero_", "copy_", "sigmoid_detect",
                                  "imul_row", "T_mul_", "reshape_mul_", "view_of_view",
                                  "twice", "buffer_copy", "sibling_view", "one_element",
                                  "whole_zero_", "whole_fill_"])
def test_jit_matches_torch(case):
    ye, gxe, gue = _torch_run(case)
    x = sampan.tensor(_x(), requires_grad=True)
    u = sampan.tensor(_u(), requires_grad=True)
    f = sampan.jit(lambda x, u: _sampan_body(case, x, u))
    y, gx, gu = f(x, u)
    np.testing.assert_allclose(_np(y), ye, rtol=1e-12, atol=1e-12, err_msg="forward")
    np.testing.assert_allclose(_np(gx), gxe, rtol=1e-12, atol=1e-12, err_msg="grad x")
    if gue is not None:
        np.testing.assert_allclose(_np(gu), gue, rtol=1e-12, atol=1e-12, err_msg="grad u")


@pytest.mark.parametrize("jit", [False, True])
def test_flip_is_a_view_eager_and_jit(jit):
    ye, gxe, gue = _torch_run("mul_by_input")       # y.flip(0)[0] is y[2]
    x = sampan.tensor(_x(), requires_grad=True)
    u = sampan.tensor(_u(), requires_grad=True)
    body = (lambda x, u: _run_body(FLIP, x, u))
    y, gx, gu = (sampan.jit(body) if jit else body)(x, u)
    for got, want in [(y, ye), (gx, gxe), (gu, gue)]:
        np.testing.assert_allclose(_np(got), want, rtol=1e-12, atol=1e-12)


def _second_order(lib, grad, jit=False):
    def body(x, u):
        y = x * x
        y[0].mul_(u)
        y.T[1].sigmoid_()
        gx, gu = grad((y * y).sum(), [x, u], create_graph=True)
        return (y, gx, gu) + tuple(grad(gx.sum() + (gu * gu).sum(), [x, u]))
    x = lib.tensor(np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]]), requires_grad=True)
    u = lib.tensor(np.array([1.5, -2.0, 0.5]), requires_grad=True)
    out = (sampan.jit(body) if jit else body)(x, u)
    return [np.asarray(t.detach().numpy()) for t in out]


@pytest.mark.parametrize("jit", [False, True])
def test_double_backward_through_inplace_views(jit):
    want = _second_order(torch, torch.autograd.grad)
    got = _second_order(sampan, sampan.grad, jit)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14, err_msg=str(i))


def test_backward_from_a_view_written_through_its_base():
    for lib in (torch, sampan):
        x = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x * 1.0
        v = y[1:]
        y.mul_(4.0)                 # v's values are 4x now; so is its gradient
        v.backward(lib.tensor([1.0, 1.0]))
        np.testing.assert_allclose(x.grad.numpy(), [0.0, 4.0, 4.0])


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


# ---------------------------------------------------------------------- errors
def test_inplace_on_view_of_leaf_raises_eager_and_jit():
    w = sampan.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    with pytest.raises(AutogradError, match=r"(?s)mul_: got a view .* leaf .*test_inplace_views"):
        w[0].mul_(2.0)
    with pytest.raises(AutogradError, match="view .* leaf"):
        sampan.jit(lambda: w[:, 1].add_(1.0))()
    with sampan.no_grad():                 # an optimizer-style update is fine
        w[0].mul_(2.0)
        w.T[1].add_(1.0)
    np.testing.assert_array_equal(w.numpy(), [[2.0, 5.0], [3.0, 5.0]])
    assert w.is_leaf and w.requires_grad


def test_inplace_on_broadcast_view_raises():
    e = (sampan.tensor([1.0, 2.0], requires_grad=True) * 1.0).expand(3, 2)
    with pytest.raises(AutogradError, match="add_: got a read-only"):
        e[0].add_(1.0)


@pytest.mark.parametrize("jit", [False, True])
def test_reshape_that_copies_is_no_view(jit):
    def f(lib, x):
        y = x * 1.0
        y.T.reshape(-1).mul_(2.0)          # a copy: y unchanged
        y[:, 1:].reshape(-1).add_(1.0)     # a copy too
        y.T[1:].reshape(4).mul_(3.0)       # rows 1..2 of y.T: contiguous? no: a copy
        y[1:].reshape(3).add_(5.0)         # a view: y[1] changes
        return y
    t = f(torch, torch.arange(6.0).reshape(2, 3))
    body = (lambda x: f(sampan, x))
    s = (sampan.jit(body) if jit else body)(sampan.tensor(np.arange(6.0).reshape(2, 3)))
    np.testing.assert_array_equal(s.numpy(), t.numpy())


def test_view_of_state_updated_in_jit_persists():
    buf = sampan.zeros((2, 3))
    ref = sampan.zeros((2, 3))

    def f(b, x):
        b[1, :2].add_(x)
        b.T[2].mul_(2.0)
        return b.sum() * 1.0

    step = sampan.jit(lambda x: f(buf, x))
    x = sampan.tensor([1.0, 2.0])
    for _ in range(3):
        np.testing.assert_allclose(step(x).numpy(), f(ref, x).numpy())
    np.testing.assert_array_equal(buf.numpy(), ref.numpy())
    assert step.n_traces == 1


# ---------------------------------------------------------------------- hook handles
def test_register_hook_returns_removable_handle():
    for lib in (torch, sampan):
        x = lib.tensor([1.0, 2.0], requires_grad=True)
        y = x * 3.0
        seen = []
        hx = x.register_hook(lambda g: g * 10.0)
        hy = y.register_hook(lambda g: seen.append(1))
        (y * y).sum().backward()
        first = x.grad.numpy().copy()
        hx.remove()
        hy.remove()
        hy.remove()                       # a second remove does nothing
        x.grad = None
        y = x * 3.0
        (y * y).sum().backward()
        np.testing.assert_allclose(first, [180.0, 360.0])
        np.testing.assert_allclose(x.grad.numpy(), [18.0, 36.0])
        assert seen == [1]


def test_optimizer_style_update_through_views_of_a_parameter_in_jit():
    def step(w, x):
        (w * x).sum().backward()
        with sampan.no_grad():
            w[0].sub_(w.grad[0] * 0.5)
            w.T[2].mul_(0.5)
        w.grad = None
        return w.sum() * 1.0

    we = sampan.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    wj = sampan.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    x = sampan.tensor(np.linspace(0.5, 1.5, 6).reshape(2, 3))
    jstep = sampan.jit(lambda x: step(wj, x))
    for _ in range(3):
        np.testing.assert_allclose(jstep(x).numpy(), step(we, x).numpy(), rtol=1e-12)
    np.testing.assert_allclose(wj.numpy(), we.numpy(), rtol=1e-12)
    assert wj.is_leaf and jstep.n_traces == 1


def test_reshape_of_a_result_computed_from_a_transpose_is_the_same_in_eager_and_jit():
    # numpy gives `x.T * 2` the transposed layout, so eager's reshape of it copied while the
    # tracer (which sees no layouts) made it a view: jit silently gave zeros. Fresh results
    # are C-contiguous now, so the reshape is a view in both (torch documents either).
    def prog(x):
        p = x.T * 2.0
        r = p.reshape(12, 1)
        p.mul_(0.0)
        return r * 1.0, p.sum()

    x = np.random.default_rng(0).standard_normal((3, 4))
    eager = prog(sampan.tensor(x))
    jitted = sampan.jit(prog)(sampan.tensor(x))
    for a, b in zip(eager, jitted):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(eager[0].numpy(), np.zeros((12, 1)))
    assert (x.T * 2.0).flags.f_contiguous      # the layout that made eager copy before
    assert (sampan.tensor(x).T * 2.0).numpy().flags.c_contiguous
