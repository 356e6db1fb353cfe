"""The in-place/view fuzzer (fuzz_inplace.py) on fixed seeds, and the minimised cases
it found, each against PyTorch (float64)."""
import warnings

import numpy as np
import pytest
import torch

import sampan
from sampan.errors import SampanError, ShapeError

from . import fuzz_inplace as F


def _both_raise(body, jit=False, sampan_error=SampanError):
    """`body(lib)` raises on torch; on sampan (eager, or jitted) a sampan error, never a
    bare numpy one nor a result."""
    with pytest.raises(RuntimeError):
        body(torch)
    f = sampan.jit(lambda: body(sampan)) if jit else (lambda: body(sampan))
    with pytest.raises(sampan_error):
        f()


# ---------------------------------------------------------------------- found by the fuzzer
@pytest.mark.parametrize("jit", [False, True])
def test_setitem_value_that_does_not_fit_the_part(jit):
    # the jitted graph ran setitem's kernel with a value of the wrong shape: numpy's
    # "could not broadcast" from generated code (the shape rule accepted any value)
    def body(lib):
        y = lib.zeros(2, 3, 2) if lib is torch else sampan.zeros((2, 3, 2))
        y[1] = y * 2.0
        return y
    _both_raise(body, jit, ShapeError)


def test_setitem_value_with_leading_ones_still_fits():
    for lib in (torch, sampan):
        y = lib.zeros(3, 4) if lib is torch else sampan.zeros((3, 4))
        y[0] = lib.ones(1, 4) if lib is torch else sampan.ones((1, 4))
        y[1:] = lib.ones(1, 1, 4) * 2.0 if lib is torch else sampan.ones((1, 1, 4)) * 2.0
        np.testing.assert_array_equal(y.numpy(), [[1] * 4, [2] * 4, [2] * 4])


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("case", ["0d_add_", "imul_grows"])
def test_inplace_result_that_would_grow_the_target(case, jit):
    # eager wrote with np.broadcast_to and failed with numpy's "cannot broadcast a
    # non-scalar to a scalar array" / "more dimensions than allowed by the axis remapping"
    def body(lib):
        z = (lib.ones(2, 3, 1) if lib is torch else sampan.ones((2, 3, 1))) * 1.0
        if case == "0d_add_":
            s = z.sum()
            s.add_(s.unsqueeze(0))
        else:
            m = z.mean(0)           # (3, 1)
            m *= z
    _both_raise(body, jit, ShapeError)


# ---------------------------------------------------------------------- the fuzzer
def test_fuzzer_seeds_agree_with_torch():
    warnings.simplefilter("ignore")
    bad = []
    # every mode (eager; jit with the gradient inside, outside, and half eager), ~7 s
    for seed in range(150):
        for mode, problem in F.check(seed):
            bad.append(f"seed {seed} [{mode}]: {problem.splitlines()[0]}")
    assert not bad, "\n".join(bad[:10])


def _x(lib):
    a = np.array([[1.0, -2.0, 0.5], [-0.5, 3.0, -1.0]])
    return torch.tensor(a, requires_grad=True) if lib is torch else \
        sampan.tensor(a, requires_grad=True)


def _grads_everywhere(body):
    """(values, grad) of `body(lib, x)` on torch, sampan eager, sampan jitted with the
    gradient taken outside and inside: body returns (loss, tensors...)."""
    out = []
    xt = _x(torch)
    r = body(torch, xt)
    r[0].backward()
    out.append(("torch", [t.detach().numpy() for t in r], xt.grad.numpy()))
    xs = _x(sampan)
    r = body(sampan, xs)
    r[0].backward()
    out.append(("eager", [t.numpy() for t in r], xs.grad.numpy()))
    xs = _x(sampan)
    r = sampan.jit(lambda x: body(sampan, x))(xs)
    r[0].backward()
    out.append(("jit, grad outside", [t.numpy() for t in r], xs.grad.numpy()))

    def inside(x):
        r = body(sampan, x)
        return r, sampan.grad(r[0], [x])[0]
    xs = _x(sampan)
    r, g = sampan.jit(inside)(xs)
    out.append(("jit, grad inside", [t.numpy() for t in r], g.numpy()))
    return out


def _assert_all_match(body):
    (_, want_v, want_g), *rest = _grads_everywhere(body)
    for name, vals, g in rest:
        for k, (a, b) in enumerate(zip(vals, want_v)):
            np.testing.assert_allclose(a, b, rtol=1e-12, err_msg=f"{name}: value {k}")
        np.testing.assert_allclose(g, want_g, rtol=1e-12, err_msg=f"{name}: grad")


def test_write_through_a_detached_alias_under_jit():
    # detach() shares memory: eager (and torch) see d.sub_ in y; the trace gave d a
    # Value of its own, so y (and its views) kept the old values under jit
    def body(lib, x):
        y = x * 2.0
        row = y[0]
        d = y.detach()
        d.sub_(1.0)
        d[1].relu_()
        return (y * y).sum() + (row * 3.0).sum(), y, row, d
    _assert_all_match(body)


def test_write_to_the_source_of_a_detach_under_jit():
    def body(lib, x):
        y = x * 1.0
        d = y.T.detach()
        y[1].mul_(3.0)         # d sees it (shared memory)
        return (y * d.T).sum(), y, d
    _assert_all_match(body)


def test_detach_of_a_view_written_before_it_under_jit():
    # the detach of a stale view took the view's old Value
    def body(lib, x):
        y = x * 1.0
        v = y[:, 1:]
        y.mul_(2.0)
        d = v.detach()
        return (y * 1.0).sum(), d
    _assert_all_match(body)


def test_detached_alias_written_keeps_the_gradient_history():
    # writing the detach of a view of a tensor index copy (the fuzzer's seed 94): the
    # view read in no-grad mode lost its history under jit (refresh_view without grad)
    def body(lib, x):
        t = (x + 0.5)[lib.tensor([0, 0])]
        tt = t.T
        tt.detach().relu_()
        return (t * 2.0).sum() + (tt * 3.0).sum(), t, tt
    _assert_all_match(body)


def test_stale_view_read_in_no_grad_keeps_its_history_under_jit():
    # under jit, v's history was rebuilt in the no_grad block (without a tape), so
    # (v * v).sum() had no grad_fn: "backward: tensor does not require grad"
    def body(lib, x):
        y = x * 1.0
        v = y[0]
        y.mul_(2.0)
        with (torch.no_grad() if lib is torch else sampan.no_grad()):
            w = v * 2.0
        return (v * v).sum(), w
    _assert_all_match(body)


def test_write_through_detach_of_an_expand_raises_under_jit():
    def body(lib):
        y = (lib.ones(3) if lib is torch else sampan.ones((3,))) * 2.0
        y.expand(2, 3).detach().div_(2.0)
        return y
    _both_raise(body, jit=True)


def test_write_through_a_reshape_of_a_detach_under_jit():
    # the write through d's view was undone: reading d to rebuild the view pulled the
    # source's (old) Value back into d (the fuzzer's seed 1765)
    def body(lib, x):
        y = x * -1.5
        d = y.detach()
        d.reshape(3, 2).mul_(2.0)
        d.T.add_(1.0)
        return (y * y).sum(), y, d
    _assert_all_match(body)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("view", ["T", "reshape", "unsqueeze"])
def test_a_view_covering_the_base_overwritten_by_a_constant(view, jit):
    # y.T.fill_(0) made y a constant (requires_grad False, no grad_fn), so
    # y.sum().backward() raised; torch keeps a history (CopySlices) with a zero gradient
    def body(lib, x):
        y = x * 0.5
        v = {"T": lambda: y.T, "reshape": lambda: y.reshape(6),
             "unsqueeze": lambda: y.unsqueeze(0)}[view]()
        v.fill_(2.0)
        return (y * x).sum(), y
    xt = _x(torch)
    lt, yt = body(torch, xt)
    lt.backward()
    xs = _x(sampan)
    f = sampan.jit(lambda x: body(sampan, x)) if jit else (lambda x: body(sampan, x))
    ls, ys = f(xs)
    assert ys.requires_grad
    ls.backward()
    np.testing.assert_allclose(xs.grad.numpy(), xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ys.numpy(), yt.detach().numpy())


def test_write_through_a_detach_is_one_write_for_saved_values():
    # d.sigmoid_() saves d's new value; passing the write on to d's source counted as a
    # second write, so the jitted backward raised "sigmoid saved ... modified" (seed 5847)
    def body(lib, x):
        a = x * -1.5
        d = (x + 2.0).detach()
        d.mul_(a)
        d.sigmoid_()
        return (d * 3.0).sum(), d
    _assert_all_match(body)


def test_views_of_a_detach_source_after_two_writes_under_jit():
    # the source (a view) is rebuilt by the write-through; a second write must still
    # reach it
    def body(lib, x):
        y = x * 1.0
        v = y[1]
        d = v.detach()
        d.add_(1.0)
        w = v * 1.0
        d.mul_(3.0)
        return (y * w.unsqueeze(0)).sum(), y, v, w, d
    _assert_all_match(body)


# ---------------------------------------------------------------------- views made before a trace
_BUF = np.arange(6.0).reshape(2, 3) / 3 - 0.7
_X = np.array([0.5, -1.0, 2.0])


def _pre_trace(lib, body, mode):
    """A buffer and a view of it made before the call; `body(buf, v, x)` writes the
    buffer with x (which requires grad) and returns a loss. (loss, d loss/dx, buffer)."""
    mk = (lambda a, rg=False: torch.tensor(a, requires_grad=rg)) if lib is torch else \
        (lambda a, rg=False: sampan.tensor(a, requires_grad=rg))
    buf = mk(_BUF.copy())
    v = buf[1:, 1:]
    x = mk(_X.copy(), True)
    if mode == "eager":
        loss = body(buf, v, x)
        g = (torch.autograd.grad if lib is torch else sampan.grad)(loss, [x])[0]
    elif mode == "jit_in":
        def f(x):
            loss = body(buf, v, x)
            return loss, sampan.grad(loss, [x])[0]
        loss, g = sampan.jit(f)(x)
    else:
        loss = sampan.jit(lambda x: body(buf, v, x))(x)
        g = sampan.grad(loss, [x])[0]
    return float(loss.detach()), g.detach().numpy().copy(), buf.detach().numpy().copy()


PRE_TRACE = {
    # the view's history was not rebuilt: its gradient missed the trace's write (silently
    # wrong), or it had none ("backward: tensor does not require grad")
    "base_mul_": lambda buf, v, x: (buf.mul_(x), (v * 3.0).sum() + (buf * buf).sum())[1],
    "row_add_": lambda buf, v, x: (buf[0].add_(x * 2.0), (v * v).sum())[1],
    "copy_": lambda buf, v, x: (buf.copy_(x.expand(2, 3) * 1.0), v.sin().sum())[1],
    # a write through the view: it read the view as a constant of its own array
    "through_view": lambda buf, v, x: (v.add_(x[:2]), (buf * buf).sum())[1],
}


@pytest.mark.parametrize("mode", ["jit_in", "jit_out"])
@pytest.mark.parametrize("case", sorted(PRE_TRACE))
def test_view_made_before_the_trace_of_a_base_written_inside(case, mode):
    want = _pre_trace(torch, PRE_TRACE[case], "eager")
    got = _pre_trace(sampan, PRE_TRACE[case], mode)
    for a, b, what in zip(got, want, ("loss", "grad", "buffer")):
        np.testing.assert_allclose(a, b, rtol=1e-12, err_msg=what)


def test_write_through_a_view_made_before_the_trace_on_every_call():
    # the view was read as a constant (its values at trace time): every call after the
    # first wrote the same row again, and the view was left holding a traced Value
    for lib in (torch, sampan):
        buf = torch.zeros(2, 3) if lib is torch else sampan.zeros((2, 3))
        v = buf[0]

        def step(x):
            v.add_(x)
            return (buf * 1.0).sum()
        f = step if lib is torch else sampan.jit(step)
        sums = [float(f(lib.ones(3) if lib is torch else sampan.ones((3,))))
                for _ in range(3)]
        assert sums == [3.0, 6.0, 9.0]
        np.testing.assert_array_equal(v.numpy(), [3.0, 3.0, 3.0])


def test_jit_gradient_of_a_captured_tensor_the_call_writes_in_place():
    # the gradient of the call was captured at the tensor's node after the call's write
    # (neg), not at the value the call read: d/du came out with the wrong sign
    def run(lib, jit):
        u = lib.tensor(np.array([0.5, -1.0, 2.0, 1.0]), requires_grad=True)
        s = (u * 1.0).sum()                       # eager history, outside the call

        def f(u):
            v = s.unsqueeze(0)
            s.neg_()
            return (s * 2.0).sum() + (v * 3.0).sum() + (u * 0.5).sum()
        loss = sampan.jit(f)(u) if jit else f(u)
        loss.backward()
        return float(loss.detach()), u.grad.numpy()
    want = run(torch, False)
    for jit in (False, True):
        got = run(sampan, jit)
        assert got[0] == pytest.approx(want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_detach_made_before_the_trace_shares_writes_with_its_source():
    # d = y.detach() made before the call: the call wrote d (lifted as its own state)
    # and y (another state) separately, and the write-backs clobbered each other
    # (the fuzzer's seed 253, first half eager)
    def run(lib, jit):
        x = lib.tensor(np.arange(12.0).reshape(3, 4) / 4 - 1.0, requires_grad=True)
        u = lib.tensor(np.linspace(-1.0, 1.0, 4), requires_grad=True)
        y = x + 1.0
        d = y.detach()

        def f(u):
            d[1:] = (u * 2.0).unsqueeze(0)
            y.neg_()
            return (y * y).sum() + (d * 3.0).sum()
        loss = sampan.jit(f)(u) if jit else f(u)
        loss.backward()
        return (y.detach().numpy().copy(), d.detach().numpy().copy(), x.grad.numpy(),
                u.grad.numpy())
    want = run(torch, False)
    for jit in (False, True):
        for a, b in zip(run(sampan, jit), want):
            np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("made_before", [True, False])
def test_jit_residual_that_is_a_slice_of_state_the_call_writes_back(made_before):
    # mul's gradient for s reads the old v, a basic-index slice of y's state input; the
    # write-back of y overwrote it before backward (a getitem was not counted as a view
    # when finding the residuals that share an input's array)
    def run(lib, jit):
        u = lib.tensor(np.array([0.5, -1.0, 2.0, 1.0]), requires_grad=True)
        y = u + 1.0
        v0 = y[:] if made_before else None

        def f(u):
            v = v0 if made_before else y[1:]
            s = u[:v.shape[0]] * 3.0
            v.mul_(s)
            return (v * 1.0).sum()
        loss = sampan.jit(f)(u) if jit else f(u)
        return (torch.autograd.grad if lib is torch else sampan.grad)(loss, [u])[0]
    want = run(torch, False).numpy()
    for jit in (False, True):
        np.testing.assert_allclose(run(sampan, jit).numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("pipeline", ["none", "train"])
@pytest.mark.parametrize("case", ["own_column", "broadcast_then_written", "T_of_itself"])
def test_jit_state_whose_new_value_views_an_input(case, pipeline):
    # the new value of state was a numpy view of an input's array (x.copy_(x[:, :1])):
    # the write-back copied it onto that array while reading it (seeds 3246, 1562)
    def run(lib, jit):
        x = lib.tensor(np.arange(6.0).reshape(2, 3) - 2.0, requires_grad=True)
        y = x * 1.0
        s = y.sum(1, keepdim=True) if lib is torch else y.sum(1, keepdims=True)

        def f(x):
            cl = (lambda t: t.clone()) if lib is torch else (lambda t: t)
            if case == "own_column":
                y.copy_(cl(y[:, 2:]))
            elif case == "broadcast_then_written":
                y.copy_(s)
                s.add_(1.0)
            else:
                sq = y[:, :2].reshape(2, 2) if lib is torch else y[:, :2].reshape(2, 2)
                sq.T.copy_(cl(sq))
            return (y * y).sum() + (s * 1.0).sum()
        loss = sampan.jit(f, pipeline=pipeline)(x) if jit else f(x)
        loss.backward()
        return y.detach().numpy().copy(), s.detach().numpy().copy(), x.grad.numpy()
    want = run(torch, False)
    for jit in (False, True):
        for a, b in zip(run(sampan, jit), want):
            np.testing.assert_allclose(a, b, rtol=1e-12)


def test_detach_in_the_trace_of_a_view_made_before_it_is_returned_intact():
    # d = v.detach() in the call, of a view v made before it: d kept v's array, was
    # returned as a tensor from outside, and the call's gradient trace then synced it to
    # a traced Value for good ("numpy was called on a traced value"; seed 10433)
    def run(lib, jit):
        u = lib.tensor(np.array([0.5, -1.0, 2.0, 1.0]), requires_grad=True)
        y = u + 2.0
        v = y[:3]
        w = v[:2]

        def f(u):
            a = w[:1]
            d = v.detach()
            a.tanh_()
            return (y * u).sum(), d
        loss, d = sampan.jit(f)(u) if jit else f(u)
        loss.backward()
        return d.numpy().copy(), y.detach().numpy().copy(), u.grad.numpy()
    want = run(torch, False)
    for jit in (False, True):
        for a, b in zip(run(sampan, jit), want):
            np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("jit", [False, True])
def test_setitem_gradient_for_a_value_with_extra_leading_ones(jit):
    # x[:, 0] = v with v (1, 1, 2) for a part (1, 2): the value's gradient was
    # unbroadcast to a shape with more dims than it, and reshape failed (seed 13903)
    def run(lib, jit):
        x = lib.tensor(np.arange(6.0).reshape(1, 3, 2) / 5 - 0.3, requires_grad=True)
        u = lib.tensor(np.array([[[1.5, -2.0]]]), requires_grad=True)

        def f(x, u):
            y = x * 1.0
            y[:, 0] = u * 3.0
            return (y * y).sum()
        loss = sampan.jit(f)(x, u) if jit else f(x, u)
        loss.backward()
        return x.grad.numpy(), u.grad.numpy()
    for a, b in zip(run(sampan, jit), run(torch, False)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
