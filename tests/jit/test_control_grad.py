"""Gradients of `sampan.cond`, `sampan.scan` and `sampan.while_loop` under `sampan.jit`
(issue 34): against float64 finite differences and PyTorch (`torch.cond`, `torch.func`
over a Python loop), through a jitted call differentiated from eager code, through
`grad` transforms and a training step inside the trace, nested control flow, and second
order. The backward of a control node is itself a control node (checked in the graph)."""
import numpy as np
import pytest
import torch

import sampan
from sampan.errors import SampanError
from sampan.experimental.func import grad as fgrad, jvp

R = np.random.default_rng(34)


def _t(a, rg=True):
    return sampan.tensor(np.array(a, np.float64), requires_grad=rg)


def _fd(f, arrays, i, eps=1e-6):
    """d f(*arrays) / d arrays[i] by central differences (f returns a float)."""
    base = [np.array(a, np.float64) for a in arrays]
    out = np.zeros_like(base[i])
    for idx in np.ndindex(base[i].shape):
        hi = [a.copy() for a in base]
        lo = [a.copy() for a in base]
        hi[i][idx] += eps
        lo[i][idx] -= eps
        out[idx] = (f(*hi) - f(*lo)) / (2 * eps)
    return out


def _ops(g):
    """Names of the ops in `g` and, recursively, in its nodes' blocks."""
    out = []
    for n in g.nodes:
        out.append(n.op)
        for b in getattr(n, "blocks", ()):
            out += _ops(b)
    return out


# ------------------------------------------------------------------------------ cond
def _cond_f(x, w, p):
    return sampan.cond(p, lambda a: sampan.tanh(a * w).sum(),
                       lambda a: (a * a * w).sum(), x)


def _cond_torch(x, w, p):
    return torch.cond(p, lambda a, w: torch.tanh(a * w).sum(),
                      lambda a, w: (a * a * w).sum(), (x, w))


def _cond_py(x, w, p):
    return torch.tanh(x * w).sum() if p else (x * x * w).sum()


@pytest.mark.parametrize("taken", [True, False])
def test_cond_grad_through_jit_matches_torch_func_and_fd(taken):
    xa, wa = R.standard_normal(4), R.standard_normal(4)
    jf = sampan.jit(_cond_f)
    x, w = _t(xa), _t(wa)           # w: captured by the branches' closures
    jf(x, w, sampan.tensor(taken)).backward()
    ref = torch.func.grad(lambda *a: _cond_py(*a, taken), argnums=(0, 1))(
        torch.tensor(xa), torch.tensor(wa))
    np.testing.assert_allclose(x.grad.numpy(), ref[0].numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), ref[1].numpy(), rtol=1e-10, atol=1e-12)

    def num(xa, wa):
        with sampan.no_grad():
            return _cond_f(_t(xa, False), _t(wa, False), sampan.tensor(taken)).item()
    np.testing.assert_allclose(w.grad.numpy(), _fd(num, [xa, wa], 1), rtol=1e-6, atol=1e-8)
    # the gradient is a graph: a cond on the same predicate over the backward blocks
    (node,) = [n for n in jf.backward_graph.nodes if n.op == "cond"]
    assert [b.name for b in node.blocks] == ["then_grad", "else_grad"]


@pytest.mark.slow        # torch.cond's first call compiles with dynamo (~7 s)
def test_cond_grad_matches_torch_cond():
    xa, wa = R.standard_normal(4), R.standard_normal(4)
    for taken in (True, False):
        x, w = _t(xa), _t(wa)
        sampan.jit(_cond_f)(x, w, sampan.tensor(taken)).backward()
        tx = torch.tensor(xa, requires_grad=True)
        tw = torch.tensor(wa, requires_grad=True)
        _cond_torch(tx, tw, torch.tensor(taken)).backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_cond_with_a_tuple_of_outputs_one_unused():
    xa, wa = R.standard_normal(3), R.standard_normal(3)

    def f(F, x, w, p):
        if F is sampan:
            a, n = sampan.cond(p, lambda x: (x * w, (x > 0).sum()),
                               lambda x: (sampan.sin(x) - w, (x < 0).sum()), x)
        else:
            a = x * w if p else torch.sin(x) - w
        return (a * a).sum()
    for taken in (True, False):
        x, w = _t(xa), _t(wa)
        sampan.jit(lambda x, w, p: f(sampan, x, w, p))(x, w, sampan.tensor(taken)).backward()
        ref = torch.func.grad(lambda *a: f(torch, *a, taken), argnums=(0, 1))(
            torch.tensor(xa), torch.tensor(wa))
        np.testing.assert_allclose(x.grad.numpy(), ref[0].numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), ref[1].numpy(), rtol=1e-12)


# ------------------------------------------------------------------------------ scan
def _rnn(F, h0, xs, W, U, reverse=False):
    def step(h, x):
        h = F.tanh(h @ W + x @ U)
        return h, (h * h).sum(-1)
    if F is sampan:
        hT, ys = sampan.scan(step, h0, xs, reverse=reverse)
    else:
        h, ys = h0, [None] * xs.shape[0]
        for t in (range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])):
            h, ys[t] = step(h, xs[t])
        hT, ys = h, torch.stack(ys)
    return (ys * F.tensor(np.linspace(0.5, 1.5, xs.shape[0]))[:, None]).sum() + (
        hT ** 3).sum()


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_grad_matches_torch_func_over_a_python_loop(reverse):
    h0a, xsa = R.standard_normal((2, 3)), R.standard_normal((5, 2, 4)) * 0.5
    Wa, Ua = R.standard_normal((3, 3)) * 0.5, R.standard_normal((4, 3)) * 0.5
    W, U = _t(Wa), _t(Ua)          # captured by the body's closure: parameters
    jf = sampan.jit(lambda h0, xs: _rnn(sampan, h0, xs, W, U, reverse))
    h0, xs = _t(h0a), _t(xsa)
    jf(h0, xs).backward()
    ref = torch.func.grad(lambda *a: _rnn(torch, *a, reverse=reverse), argnums=(0, 1, 2, 3))(
        *(torch.tensor(a) for a in (h0a, xsa, Wa, Ua)))
    for got, want in zip((h0, xs, W, U), ref):
        np.testing.assert_allclose(got.grad.numpy(), want.numpy(), rtol=1e-9, atol=1e-11)
    ops = _ops(jf.backward_graph)
    (bw,) = [n for n in jf.backward_graph.nodes if n.op == "scan"]
    assert bw.attrs["reverse"] is (not reverse)
    # the forward scan stacks the carry each step starts from (its residuals): one more y
    (fw,) = [n for n in jf.graph.nodes if n.op == "scan"]
    assert [tuple(v.shape) for v in fw.outputs] == [(2, 3), (5, 2), (5, 2, 3)]
    # one body, whatever the length: the backward holds no unrolled copy of the step
    assert ops.count("tanh") + ops.count("tanh_grad") <= 4


def test_scan_grad_against_finite_differences():
    h0a, xsa = R.standard_normal((1, 3)), R.standard_normal((4, 1, 2))
    Wa, Ua = R.standard_normal((3, 3)) * 0.5, R.standard_normal((2, 3)) * 0.5

    def num(h0a, xsa, Wa, Ua):
        with sampan.no_grad():
            return _rnn(sampan, *(_t(a, False) for a in (h0a, xsa, Wa, Ua))).item()

    jf = sampan.jit(lambda *a: _rnn(sampan, *a))
    args = [_t(a) for a in (h0a, xsa, Wa, Ua)]
    jf(*args).backward()
    for i, a in enumerate(args):
        np.testing.assert_allclose(a.grad.numpy(), _fd(num, [h0a, xsa, Wa, Ua], i),
                                   rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------ while_loop
def _grow(F, x0, w, n_max=None):
    """x <- x * w + sin(x) while sum(x^2) < 50, at most n_max times."""
    if F is sampan:
        x, _ = sampan.while_loop(lambda x, i: (x * x).sum() < 50.0,
                                 lambda x, i: (x * w + sampan.sin(x), i + 1),
                                 (x0, sampan.tensor(0)), max_iterations=n_max)
    else:
        x, i = x0, 0
        while (x * x).sum() < 50.0 and (n_max is None or i < n_max):
            x, i = x * w + torch.sin(x), i + 1
    return (x * F.tensor(np.array([1.0, -2.0, 0.5]))).sum()


@pytest.mark.parametrize("n_max", [30, 3])       # stops by its condition / at the bound
def test_while_loop_grad_with_max_iterations(n_max):
    x0a, wa = np.array([0.3, -0.2, 0.5]), np.array([1.3, 1.1, 0.9])
    jf = sampan.jit(lambda x0, w: _grow(sampan, x0, w, n_max))
    x0, w = _t(x0a), _t(wa)
    jf(x0, w).backward()
    ref = torch.func.grad(lambda *a: _grow(torch, *a, n_max=n_max), argnums=(0, 1))(
        torch.tensor(x0a), torch.tensor(wa))
    np.testing.assert_allclose(x0.grad.numpy(), ref[0].numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(w.grad.numpy(), ref[1].numpy(), rtol=1e-9, atol=1e-11)

    def num(x0a, wa):
        with sampan.no_grad():
            return _grow(sampan, _t(x0a, False), _t(wa, False), n_max).item()
    np.testing.assert_allclose(w.grad.numpy(), _fd(num, [x0a, wa], 1), rtol=1e-6, atol=1e-8)
    # the forward loop also counts its iterations; the backward replays them into a
    # buffer of max_iterations carries (a scan) and runs the body's gradient in reverse
    (fw,) = [n for n in jf.graph.nodes if n.op == "while_loop"]
    assert fw.attrs["n_carry"] == 3 and fw.attrs["max_iterations"] == n_max
    scans = [n for n in jf.backward_graph.nodes if n.op == "scan"]
    assert [n.attrs["reverse"] for n in scans] == [False, True]
    assert [tuple(v.shape) for v in scans[0].outputs][3:] == [(n_max, 3), (n_max,)]
    assert all(n.attrs["length"] == n_max for n in scans)


def test_while_loop_grad_without_max_iterations_names_it():
    jf = sampan.jit(lambda x0, w: _grow(sampan, x0, w))
    x0, w = _t([0.3, -0.2, 0.5]), _t([1.3, 1.1, 0.9])
    y = jf(x0, w)
    np.testing.assert_allclose(y.item(), _grow(torch, torch.tensor([0.3, -0.2, 0.5]),
                                               torch.tensor([1.3, 1.1, 0.9])).item())
    with pytest.raises(SampanError, match=r"(?s)max_iterations.*test_control_grad\.py:\d+"):
        y.backward()
    # a backward inside the trace (a training step) says so at trace time
    with pytest.raises(SampanError, match="without max_iterations"):
        sampan.jit(lambda x0, w: fgrad(lambda w: _grow(sampan, x0, w))(w))(x0, w)


def test_while_loop_second_order_matches_torch():
    x0a, wa = np.array([0.3, -0.2, 0.5]), np.array([1.3, 1.1, 0.9])

    def gg(F, grad, n_max):
        w = F.tensor(wa)
        return grad(lambda x: (grad(lambda x: _grow(F, x, w, n_max))(x) ** 2).sum())
    for n_max in (30, 3):
        got = sampan.jit(gg(sampan, fgrad, n_max))(sampan.tensor(x0a))
        want = gg(torch, torch.func.grad, n_max)(torch.tensor(x0a))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------ nested
def _nested(F, c0, xs, w):
    """A scan whose body branches on the carry (cond inside the scan body)."""
    def step(c, x):
        if F is sampan:
            c = sampan.cond(c.sum() > 0, lambda c, x: sampan.tanh(c * w + x),
                            lambda c, x: c * 0.5 - x * w, c, x)
        else:
            c = torch.tanh(c * w + x) if c.sum() > 0 else c * 0.5 - x * w
        return c, c.sum()
    if F is sampan:
        cT, ys = sampan.scan(step, c0, xs)
    else:
        c, ys = c0, []
        for t in range(xs.shape[0]):
            c, y = step(c, xs[t])
            ys.append(y)
        cT, ys = c, torch.stack(ys)
    return (ys ** 2).sum() + cT.sum()


def test_cond_inside_scan_body_against_fd_and_torch():
    c0a, xsa, wa = np.array([0.4, -0.1]), R.standard_normal((6, 2)), np.array([0.8, -1.2])
    jf = sampan.jit(lambda c0, xs: _nested(sampan, c0, xs, w))
    w = _t(wa)
    c0, xs = _t(c0a), _t(xsa)
    jf(c0, xs).backward()
    ref = torch.func.grad(lambda *a: _nested(torch, *a), argnums=(0, 1, 2))(
        *(torch.tensor(a) for a in (c0a, xsa, wa)))
    for got, want in zip((c0, xs, w), ref):
        np.testing.assert_allclose(got.grad.numpy(), want.numpy(), rtol=1e-9, atol=1e-11)

    def num(c0a, xsa, wa):
        with sampan.no_grad():
            return _nested(sampan, _t(c0a, False), _t(xsa, False), _t(wa, False)).item()
    np.testing.assert_allclose(xs.grad.numpy(), _fd(num, [c0a, xsa, wa], 1), rtol=1e-6,
                               atol=1e-8)
    ops = _ops(jf.backward_graph)
    assert "scan" in ops and "cond" in ops


# ------------------------------------------------------------------------------ transforms
def test_functional_grad_under_jit_equals_eager():
    h0a, xsa = R.standard_normal((2, 3)), R.standard_normal((5, 2, 4)) * 0.5
    Wa, Ua = R.standard_normal((3, 3)) * 0.5, R.standard_normal((4, 3)) * 0.5
    g = fgrad(lambda W, U, h0, xs: _rnn(sampan, h0, xs, W, U), argnums=(0, 1))
    args = [_t(a, False) for a in (Wa, Ua, h0a, xsa)]
    got = sampan.jit(g)(*args)
    want = g(*args)                       # eager: the Python loop on the tape
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


def test_jitted_training_step_with_scan_matches_eager():
    def make():
        sampan.manual_seed(3)
        return sampan.nn.Linear(3, 3).to(sampan.float64)
    xsa = R.standard_normal((4, 2, 3))

    def step(lin, opt, xs):
        opt.zero_grad()
        hT, ys = sampan.scan(lambda h, x: (sampan.tanh(lin(h) + x), None),
                             sampan.zeros(2, 3, dtype=sampan.float64), xs)
        loss = (hT ** 2).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    lj, le = make(), make()
    oj, oe = sampan.optim.SGD(lj.parameters(), lr=0.1), sampan.optim.SGD(le.parameters(),
                                                                          lr=0.1)
    js = sampan.jit(lambda xs: step(lj, oj, xs))
    for _ in range(2):
        a = js(sampan.tensor(xsa))
        b = step(le, oe, sampan.tensor(xsa))
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10)
    for p, q in zip(lj.parameters(), le.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------ second order
def test_second_order_through_scan_and_cond_matches_torch():
    h0a, xsa = R.standard_normal((1, 3)), R.standard_normal((3, 1, 2)) * 0.5
    Ua = R.standard_normal((2, 3)) * 0.5
    Wa = R.standard_normal((3, 3)) * 0.5

    def gg(F, grad):
        # d/dW of |d loss/dW|^2: reverse over the reverse scan's own gradient graph
        return grad(lambda W: (grad(lambda W: _rnn(F, h0, xs, W, U))(W) ** 2).sum())

    h0, xs, U = (sampan.tensor(a) for a in (h0a, xsa, Ua))
    got = sampan.jit(gg(sampan, fgrad))(sampan.tensor(Wa))
    h0, xs, U = (torch.tensor(a) for a in (h0a, xsa, Ua))
    want = gg(torch, torch.func.grad)(torch.tensor(Wa))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-8, atol=1e-10)

    xa, wa = R.standard_normal(3), R.standard_normal(3)
    for taken in (True, False):
        p = sampan.tensor(taken)
        got = sampan.jit(lambda x: fgrad(lambda x: (fgrad(
            lambda x: _cond_f(x, sampan.tensor(wa), p))(x) ** 2).sum())(x))(
            sampan.tensor(xa))
        tf = (lambda a: torch.tanh(a * torch.tensor(wa)).sum()) if taken else (
            lambda a: (a * a * torch.tensor(wa)).sum())
        want = torch.func.grad(lambda x: (torch.func.grad(tf)(x) ** 2).sum())(
            torch.tensor(xa))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-8, atol=1e-10)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")     # torch.func.jvp's own
def test_forward_over_reverse_hessian_vector_products_match_torch_func():
    """jvp of grad (a Hessian-vector product) through scan and cond, under jit."""
    h0a, xsa = R.standard_normal((1, 3)), R.standard_normal((3, 1, 2)) * 0.5
    Ua, Wa, va = (R.standard_normal(s) * 0.5 for s in ((2, 3), (3, 3), (3, 3)))

    def hvp(F, grad, jv, loss):
        return lambda W, v: jv(grad(loss), (W,), (v,))[1]

    got = sampan.jit(hvp(sampan, fgrad, jvp, lambda W: _rnn(
        sampan, *(sampan.tensor(a) for a in (h0a, xsa)), W, sampan.tensor(Ua))))(
        sampan.tensor(Wa), sampan.tensor(va))
    want = hvp(torch, torch.func.grad, torch.func.jvp, lambda W: _rnn(
        torch, *(torch.tensor(a) for a in (h0a, xsa)), W, torch.tensor(Ua)))(
        torch.tensor(Wa), torch.tensor(va))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)

    xa, wa = R.standard_normal(3), R.standard_normal(3)
    for taken in (True, False):
        got = sampan.jit(hvp(sampan, fgrad, jvp, lambda x: _cond_f(
            x, sampan.tensor(wa), sampan.tensor(taken))))(sampan.tensor(xa),
                                                          sampan.tensor(wa))
        want = hvp(torch, torch.func.grad, torch.func.jvp, lambda x: _cond_py(
            x, torch.tensor(wa), taken))(torch.tensor(xa), torch.tensor(wa))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------ eager == jit
def _tuple_scan(p, h0, xs1, xs2):
    def step(c, x):
        h, n = c
        h = sampan.tanh(h @ p["M"] + x[0] * x[1] + p["w"])
        return (h, n + 1), (h.sum(), h * 2)
    (h, _), (y1, y2) = sampan.scan(step, (h0, sampan.tensor(0)), (xs1, xs2), reverse=True)
    return h.sum() + y1.sum() + (y2 ** 2).sum()


def _scan_in_scan(p, h0, xs):
    def outer(h, x):
        g, _ = sampan.scan(lambda c, xx: (sampan.sin(c * p["w"] + xx), None), h, x)
        return g, g.sum()
    h, ys = sampan.scan(outer, h0, xs)
    return h.sum() + ys.sum()


def _while_in_scan(p, h0, xs):
    def step(h, x):
        h, _ = sampan.while_loop(lambda h, i: i < 3, lambda h, i: (
            sampan.tanh(h @ p["M"] + x), i + 1), (h, sampan.tensor(0)), max_iterations=5)
        return h, None
    return (sampan.scan(step, h0, xs)[0] ** 2).sum()


def _cond_in_while(p, x0):
    def body(x, i):
        return sampan.cond(x.sum() > 0, lambda x: x * p["w"] - 1.0,
                           lambda x: sampan.cos(x) + p["w"], x), i + 1
    x, _ = sampan.while_loop(lambda x, i: i < 6, body, (x0, sampan.tensor(0)),
                             max_iterations=10)
    return (x * x).sum()


def _scan_in_cond(p, h0, xs):
    return sampan.cond(h0.sum() > 0, lambda h, xs: sampan.scan(
        lambda c, x: (c * p["w"] + x, None), h, xs)[0].sum(),
        lambda h, xs: (h * xs.sum(0)).sum(), h0, xs)


@pytest.mark.parametrize("f,shapes", [
    (_tuple_scan, [(2, 3), (4, 2, 3), (4, 2, 3)]), (_scan_in_scan, [(3,), (2, 4, 3)]),
    (_while_in_scan, [(3,), (3, 3)]), (_cond_in_while, [(3,)]),
    (_scan_in_cond, [(3,), (4, 3)])], ids=lambda x: getattr(x, "__name__", ""))
def test_structured_and_nested_control_flow_grads_equal_eager(f, shapes):
    """Eager runs the Python (its tape is the reference); jit differentiates the nodes."""
    r = np.random.default_rng(7)
    params = {"w": r.standard_normal(3), "M": r.standard_normal((3, 3)) * 0.4}
    args = [r.standard_normal(s) for s in shapes]

    def run(jit):
        p = {k: _t(v) for k, v in params.items()}
        xs = [_t(a) for a in args]
        out = (sampan.jit(lambda *a: f(p, *a)) if jit else (lambda *a: f(p, *a)))(*xs)
        out.backward()
        return [out] + [t.grad for t in list(p.values()) + xs]
    for e, j in zip(run(False), run(True)):
        if e is None and j is not None:   # read by the branch not taken only: as torch.cond,
            assert not j.numpy().any()    # the node's gradient gives it zeros
            continue
        assert (e is None) == (j is None)
        if e is not None:
            np.testing.assert_allclose(j.numpy(), e.numpy(), rtol=1e-12, atol=1e-14)


def test_scan_grad_in_a_traced_step_with_a_symbolic_batch():
    W = _t(np.eye(3) * 0.5)

    def step(h0, xs):
        W.grad = None
        hT, ys = sampan.scan(lambda h, x: ((h @ W + x).tanh(),) * 2, h0, xs)
        (ys.sum() + (hT ** 2).sum()).backward()
        return W.grad * 1.0
    js = sampan.jit(step, dynamic={0: {0: "B"}, 1: {1: "B"}})
    for b in (2, 5):                 # one program for both batch sizes
        h0, xs = sampan.tensor(np.ones((b, 3))), sampan.tensor(R.standard_normal((4, b, 3)))
        np.testing.assert_allclose(js(h0, xs).numpy(), step(h0, xs).numpy(), rtol=1e-12)
    assert str(js.graph.inputs[0]).endswith("f64[B,3]")


def test_backward_graphs_verify_and_round_trip_through_the_ir_text():
    from sampan.ir import parse, verify
    w = _t(np.array([0.8, -1.2]))
    js = sampan.jit(lambda c0, xs: _nested(sampan, c0, xs, w))
    js(_t(np.array([0.4, -0.1])), _t(np.ones((6, 2)))).backward()
    jw = sampan.jit(lambda x0, w: _grow(sampan, x0, w, 7))
    jw(_t([0.3, -0.2, 0.5]), _t([1.3, 1.1, 0.9])).backward()
    for g in (js.graph, js.backward_graph, jw.graph, jw.backward_graph):
        verify(g)
        consts = {c.name: c.const for b in g.walk() for c in b.consts if c.name is not None}
        assert parse(str(g), consts) == g
