"""sampan.jit agrees with eager where it used to bake in or drop things (issue 16, items
10-12): gradients through jitted calls, guards on what a trace read, grads accumulated
by a backward inside a jitted function, and tensors made from data inside it."""
import warnings

import numpy as np
import pytest
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


# ---------------------------------------------------------------------- item 10
def _torch_linear(layer):
    t = torch.nn.Linear(layer.weight.shape[0], layer.weight.shape[1], dtype=torch.float64)
    with torch.no_grad():           # sampan's Linear stores (in, out); torch's (out, in)
        t.weight.copy_(torch.from_numpy(layer.weight.numpy().T.copy()))
        t.bias.copy_(torch.from_numpy(layer.bias.numpy().copy()))
    return t


def test_jitted_function_is_differentiable_from_outside_like_eager_and_torch():
    r = np.random.default_rng(1)
    A, B = r.standard_normal((4, 3)), r.standard_normal((3, 2))

    def f(x, w):
        h = (x @ w).tanh()
        return h, (h * h).sum(axis=1)

    jf = sampan.jit(f)
    grads = {}
    for mode in ("eager", "jit"):
        a = sampan.tensor(A, requires_grad=True)
        w = sampan.tensor(B, requires_grad=True)
        fn = jf if mode == "jit" else f
        for _ in range(2):                        # accumulates over calls, as eager
            h, s = fn(a * 2.0, w)                 # an argument with a history: a flows too
            assert h.requires_grad and s.requires_grad
            (h.sum() + (s * sampan.tensor([1.0, 2.0, 3.0, 4.0])).sum()).backward()
        grads[mode] = (a.grad.numpy(), w.grad.numpy())
    at = torch.tensor(A, requires_grad=True)
    wt = torch.tensor(B, requires_grad=True)
    for _ in range(2):
        ht = (at * 2.0 @ wt).tanh()
        (ht.sum() + ((ht * ht).sum(1) * torch.tensor([1.0, 2.0, 3.0, 4.0],
                                                      dtype=torch.float64)).sum()).backward()
    for gj, ge, gt in zip(grads["jit"], grads["eager"], (at.grad.numpy(), wt.grad.numpy())):
        np.testing.assert_allclose(gj, ge, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(gj, gt, rtol=1e-6, atol=1e-12)
    assert jf.n_traces == 2       # w without a grad, then with one (a trace may read it)
    # the gradient's nodes carry the line of the forward op they differentiate
    tanh_line = f"test_jit_trust.py:{f.__code__.co_firstlineno + 1}"
    raw = jf._last.vjp.raw_graph
    assert any(n.op == "tanh_grad" and n.loc == tanh_line for n in raw.nodes), str(raw)
    assert tanh_line in str(jf.backward_graph)


def test_jitted_layer_trains_with_backward_and_optimizer_outside():
    r = np.random.default_rng(2)
    X, Y = r.standard_normal((8, 3)), r.standard_normal((8, 1))

    def make():
        sampan.manual_seed(3)
        return nn.Sequential(nn.Linear(3, 6, dtype="float64"), nn.Tanh(),
                             nn.Linear(6, 1, dtype="float64"))
    me, mj = make(), make()
    mt = torch.nn.Sequential(_torch_linear(me[0]), torch.nn.Tanh(), _torch_linear(me[2]))
    jm = sampan.jit(mj)
    oe = sampan.optim.SGD(me.parameters(), lr=0.1, momentum=0.9)
    oj = sampan.optim.SGD(mj.parameters(), lr=0.1, momentum=0.9)
    ot = torch.optim.SGD(mt.parameters(), lr=0.1, momentum=0.9)
    x, y = sampan.tensor(X), sampan.tensor(Y)
    for _ in range(4):
        for m, o in ((me, oe), (jm, oj)):
            o.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
            o.step()
        ot.zero_grad()
        ((mt(torch.from_numpy(X)) - torch.from_numpy(Y)) ** 2).mean().backward()
        ot.step()
    for pe, pj in zip(me.parameters(), mj.parameters()):
        np.testing.assert_allclose(pj.grad.numpy(), pe.grad.numpy(), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(pj.numpy(), pe.numpy(), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(mj[0].weight.numpy(), mt[0].weight.detach().numpy().T,
                               rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(mj[2].bias.grad.numpy(), mt[2].bias.grad.numpy(),
                               rtol=1e-6, atol=1e-12)
    assert jm.n_traces <= 2


def test_batch_norm_and_dropout_layer_gradients_match_eager():
    r = np.random.default_rng(4)
    x = sampan.tensor(r.standard_normal((6, 3)))

    def run(jitted):
        sampan.manual_seed(1)
        m = nn.Sequential(nn.Linear(3, 5, dtype="float64"), nn.BatchNorm1d(5, dtype="float64"),
                          nn.Dropout(0.3), nn.Linear(5, 1, dtype="float64"))
        f = sampan.jit(m) if jitted else m
        sampan.manual_seed(5)
        for _ in range(2):
            (f(x) ** 2).sum().backward()
        return [p.grad.numpy() for p in m.parameters()] + [m[1].running_mean.numpy()]
    for a, b in zip(run(True), run(False)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)


def test_jitted_call_gradient_errors_are_clear():
    jf = sampan.jit(lambda x: (x * x).sum())
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    y = jf(x)
    with sampan.no_grad():
        x.add_(1.0)                          # the gradient reads x: as eager, this raises
    with pytest.raises(sampan.AutogradError, match="modified in place"):
        y.backward()
    with pytest.raises(sampan.AutogradError, match="create_graph=True.*jitted call"):
        sampan.grad(jf(x), [x], create_graph=True)
    with sampan.no_grad():
        assert not jf(x).requires_grad


def test_untraceable_gradient_says_where_to_put_the_backward():

    def f(x):
        h = x * 2.0
        h.register_hook(lambda g: g * float(g.sum()))   # reads the gradient's value
        return h.sum()
    x = sampan.tensor([1.0, 2.0], requires_grad=True)
    y = sampan.jit(f)(x)
    np.testing.assert_array_equal(y.numpy(), f(x).numpy())
    with pytest.raises(sampan.AutogradError, match="jitted call f could not be traced.*"
                                                   "float.*Put the backward inside"):
        y.backward()
    f(x).backward()                                     # eager runs the hook
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])

    def g(x):
        w = sampan.tensor([3.0, 4.0], requires_grad=True)
        z = x * w
        (gw,) = sampan.grad(z.sum(), [w])   # a backward inside frees z's history
        return z + gw
    with pytest.raises(sampan.AutogradError, match="call g ran backward.*itself"):
        sampan.jit(g)(x).sum().backward()

    def step(x):
        z = x * x
        z.sum().backward()
        return z
    with pytest.raises(sampan.AutogradError, match="call step ran backward.*itself"):
        sampan.jit(step)(x).sum().backward()


# ---------------------------------------------------------------------- item 11
_OFFSET = 1.0


def _add_offset(x):
    return x + _OFFSET


def test_captured_python_values_are_guarded_and_retraced():
    x = sampan.tensor([1.0, 2.0])
    cfg = {"scale": 2.0}
    f = sampan.jit(lambda x: x * cfg["scale"])
    np.testing.assert_array_equal(f(x).numpy(), [2.0, 4.0])
    cfg["scale"] = 5.0                                  # a dict item read by the trace
    np.testing.assert_array_equal(f(x).numpy(), [5.0, 10.0])
    cfg["scale"] = 2.0                                  # back: the first trace is reused
    np.testing.assert_array_equal(f(x).numpy(), [2.0, 4.0])
    assert f.n_traces == 2

    k = 2
    g = sampan.jit(lambda x: x * k)
    g(x)
    k = 3                                               # a rebound closure variable
    np.testing.assert_array_equal(g(x).numpy(), [3.0, 6.0])

    h = sampan.jit(lambda x: _add_offset(x) * 2.0)      # a global read by a called function
    h(x)
    global _OFFSET
    _OFFSET = 10.0
    try:
        np.testing.assert_array_equal(h(x).numpy(), [22.0, 24.0])
    finally:
        _OFFSET = 1.0
    np.testing.assert_array_equal(h(x).numpy(), [4.0, 6.0])


def test_replaced_parameter_is_used_and_gets_the_gradient():
    r = np.random.default_rng(5)
    sampan.manual_seed(0)
    m = nn.Linear(3, 2, dtype="float64")
    jm = sampan.jit(m)
    x = sampan.tensor(r.standard_normal((4, 3)))
    jm(x)
    W = r.standard_normal((3, 2))
    m.weight = nn.Parameter(sampan.tensor(W))
    y = jm(x)
    yt = torch.from_numpy(x.numpy()) @ torch.tensor(W, requires_grad=True)
    np.testing.assert_allclose(y.numpy(), (yt + torch.from_numpy(m.bias.numpy())).detach(),
                               rtol=1e-12)
    (y ** 2).sum().backward()
    wt = torch.tensor(W, requires_grad=True)
    ((torch.from_numpy(x.numpy()) @ wt + torch.from_numpy(m.bias.numpy())) ** 2).sum() \
        .backward()
    np.testing.assert_allclose(m.weight.grad.numpy(), wt.grad.numpy(), rtol=1e-10)


@pytest.mark.filterwarnings("ignore::sampan.jit.RetraceWarning")
def test_captured_layer_changes_are_seen():
    class Scaled(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.drop = nn.Dropout(0.5)
            self.scale = 2.0

        def forward(self, x):
            return self.drop(self.fc(x)) * self.scale

    sampan.manual_seed(0)
    model = Scaled()
    model.eval()
    f = sampan.jit(lambda x: model(x).sum(axis=1))
    x = sampan.randn(4, 3)
    with sampan.no_grad():
        f(x)
        model.scale = 3.0                                   # a Layer attribute
        np.testing.assert_allclose(f(x).numpy(), model(x).sum(axis=1).numpy(), rtol=1e-6)
        model.fc.weight = nn.Parameter(sampan.ones(3, 3))   # a replaced sub-layer parameter
        np.testing.assert_allclose(f(x).numpy(), model(x).sum(axis=1).numpy(), rtol=1e-6)
        model.train()                                       # dropout on: a new trace
        sampan.manual_seed(1)
        a = f(x).numpy()
        sampan.manual_seed(1)
        np.testing.assert_allclose(a, model(x).sum(axis=1).numpy(), rtol=1e-6)
    assert f.n_traces == 4


def test_captured_constant_tensor_changed_in_place_is_seen():
    W = sampan.tensor([[1.0, 2.0], [3.0, 4.0]])
    f = sampan.jit(lambda x: x @ W.T)                   # W.T is folded at compile time
    x = sampan.tensor([[1.0, 1.0]])
    np.testing.assert_array_equal(f(x).numpy(), [[3.0, 7.0]])
    W.mul_(2.0)
    np.testing.assert_array_equal(f(x).numpy(), (x.numpy() @ W.numpy().T))


def test_retrace_warning_names_the_changed_value():
    cfg = {"scale": 1.0}
    f = sampan.jit(lambda x: x * cfg["scale"])
    x = sampan.ones(2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for s in (1.0, 2.0, 3.0, 4.0):
            cfg["scale"] = s
            f(x)
    msgs = [str(m.message) for m in w if issubclass(m.category, sampan.jit.RetraceWarning)]
    assert msgs and "'cfg'" in msgs[-1]
    np.testing.assert_array_equal(f(x).numpy(), [4.0, 4.0])


scale = 1.0       # a module global that shares its name with an attribute read below


def test_attribute_names_are_not_guarded_as_globals():
    global scale

    class Box:
        scale = 2.0
    box = Box()
    f = sampan.jit(lambda x: x * box.scale)
    x = sampan.ones(2)
    f(x)
    for i in range(3):
        scale = float(i)   # not what f reads: no retrace
        f(x)
    assert f.n_traces == 1


def test_retrace_warning_names_a_constant_tensor_changed_in_place():
    W = sampan.ones(2, 2)
    f = sampan.jit(lambda x: x @ W)
    x = sampan.ones(1, 2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(4):
            W.add_(1.0)
            f(x)
    msgs = [str(m.message) for m in w if issubclass(m.category, sampan.jit.RetraceWarning)]
    assert msgs and "f32[2, 2]" in msgs[-1] and "changed in place" in msgs[-1]
    assert "pass it as an argument" in msgs[-1]
    np.testing.assert_array_equal(f(x).numpy(), x.numpy() @ W.numpy())
