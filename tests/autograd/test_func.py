"""sampan.experimental.func: grad / value_and_grad / vjp against torch.func, finite
differences in float64, nesting, and the same transforms under sampan.jit."""
import numpy as np
import pytest
import torch

import sampan
from sampan.errors import AutogradError
from sampan.experimental.func import grad, hessian, value_and_grad, vjp


def _params(seed=0):
    r = np.random.default_rng(seed)
    return {"w1": r.standard_normal((5, 4)), "b1": r.standard_normal(4),
            "w2": r.standard_normal((4, 3))}


def _loss(F, p, x):
    h = F.tanh(x @ p["w1"] + p["b1"])
    return ((h @ p["w2"]) ** 2).mean()


def test_grad_of_parameter_dict_matches_torch_func():
    p = _params()
    x = np.random.default_rng(1).standard_normal((6, 5))
    sp = {k: sampan.tensor(v) for k, v in p.items()}
    value, g = value_and_grad(lambda p, x: _loss(sampan, p, x))(sp, sampan.tensor(x))
    tp = {k: torch.tensor(v) for k, v in p.items()}
    tg = torch.func.grad(lambda p, x: _loss(torch, p, x))(tp, torch.tensor(x))
    assert set(g) == set(p)
    for k in p:
        np.testing.assert_allclose(g[k].numpy(), tg[k].numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(value.item(), _loss(torch, tp, torch.tensor(x)).item(),
                               rtol=1e-12)
    # the caller's tensors are left alone: nothing requires grad, nothing accumulated
    assert not any(t.requires_grad or t.grad is not None for t in sp.values())


def test_argnums_tuple_against_finite_differences():
    r = np.random.default_rng(2)
    a, b = r.standard_normal((3, 4)), r.standard_normal(4)

    def f(a, b):
        return (sampan.sin(a) * b).sum() + (a ** 2).mean()

    ga, gb = grad(f, argnums=(0, 1))(sampan.tensor(a), sampan.tensor(b))
    eps = 1e-6
    for arr, g, i in ((a, ga, 0), (b, gb, 1)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            hi, lo = arr.copy(), arr.copy()
            hi[idx] += eps
            lo[idx] -= eps
            args_hi = [sampan.tensor(a), sampan.tensor(b)]
            args_lo = [sampan.tensor(a), sampan.tensor(b)]
            args_hi[i], args_lo[i] = sampan.tensor(hi), sampan.tensor(lo)
            num[idx] = (f(*args_hi).item() - f(*args_lo).item()) / (2 * eps)
        np.testing.assert_allclose(g.numpy(), num, rtol=1e-6, atol=1e-8)


def test_transforms_nest():
    x = sampan.tensor(np.array(2.0))
    assert grad(grad(lambda x: x ** 3))(x).item() == pytest.approx(12.0)
    assert grad(grad(grad(lambda x: x ** 3)))(x).item() == pytest.approx(6.0)
    v = np.array([0.5, -1.0, 2.0])
    hess_diag = grad(lambda x: grad(lambda y: (y ** 3).sum())(x).sum())(sampan.tensor(v))
    np.testing.assert_allclose(hess_diag.numpy(), 6 * v)


def test_has_aux_unused_input_and_value():
    def f(x, y):
        return (x * x).sum(), {"n": 3}

    x, y = sampan.tensor(np.array([1.0, -2.0])), sampan.tensor(np.array([5.0]))
    (value, aux), (gx, gy) = value_and_grad(f, argnums=(0, 1), has_aux=True)(x, y)
    assert aux == {"n": 3} and value.item() == 5.0 and not value.requires_grad
    np.testing.assert_array_equal(gx.numpy(), [2.0, -4.0])
    np.testing.assert_array_equal(gy.numpy(), [0.0])   # y unused: zero, like torch.func
    g, aux = grad(f, has_aux=True)(x, y)
    np.testing.assert_array_equal(g.numpy(), [2.0, -4.0])
    assert grad(lambda x: sampan.tensor(1.0))(x).numpy().tolist() == [0.0, 0.0]


def test_vjp_matches_torch():
    r = np.random.default_rng(3)
    a, b, ct = r.standard_normal((3, 4)), r.standard_normal((4, 2)), r.standard_normal((3, 2))
    out, fn = vjp(lambda a, b: sampan.tanh(a @ b), sampan.tensor(a), sampan.tensor(b))
    ga, gb = fn(sampan.tensor(ct))
    tout, tfn = torch.func.vjp(lambda a, b: torch.tanh(a @ b), torch.tensor(a),
                               torch.tensor(b))
    tga, tgb = tfn(torch.tensor(ct))
    np.testing.assert_allclose(out.numpy(), tout.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ga.numpy(), tga.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gb.numpy(), tgb.numpy(), rtol=1e-12, atol=1e-12)
    ga2, _ = fn(sampan.tensor(2 * ct))   # callable again
    np.testing.assert_allclose(ga2.numpy(), 2 * tga.numpy(), rtol=1e-12, atol=1e-12)


def test_under_jit_equals_eager():
    p = {k: sampan.tensor(v.astype(np.float32)) for k, v in _params(4).items()}
    x = sampan.tensor(np.random.default_rng(5).standard_normal((6, 5)).astype(np.float32))
    vg = value_and_grad(lambda p, x: _loss(sampan, p, x))

    def sgd_step(p, x):
        value, g = vg(p, x)
        return value, {k: p[k] - 0.1 * g[k] for k in p}

    ev, ep = sgd_step(p, x)
    jv, jp = sampan.jit(sgd_step)(p, x)
    np.testing.assert_allclose(jv.numpy(), ev.numpy(), rtol=1e-6)
    for k in p:
        np.testing.assert_allclose(jp[k].numpy(), ep[k].numpy(), rtol=1e-5, atol=1e-6)


def test_errors_name_the_function_and_the_problem():
    x = sampan.tensor(np.ones(3))

    def vec(x):
        return x * 2

    with pytest.raises(AutogradError, match=r"^grad\(.*vec\): .*one-element.*\(3,\)"):
        grad(vec)(x)
    with pytest.raises(AutogradError, match="argument 0 has dtype int64"):
        grad(lambda i: i.sum())(sampan.tensor(np.arange(3)))
    with pytest.raises(AutogradError, match="argnums has 2"):
        grad(lambda x: x.sum(), argnums=2)(x)
    with pytest.raises(AutogradError, match="argnums must be"):
        grad(lambda x: x.sum(), argnums=())
    with pytest.raises(AutogradError, match="has_aux=True"):
        grad(lambda x: x.sum(), has_aux=True)(x)
    with pytest.raises(AutogradError, match=r"argument 0\['a'\] is a str"):
        grad(lambda p: p["b"].sum())({"a": "no", "b": x})
    _, fn = vjp(vec, x)
    with pytest.raises(AutogradError, match=r"cotangent of shape \(2,\)"):
        fn(sampan.tensor(np.ones(2)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.func.jacrev's own
def test_jacrev_and_hessian_match_torch_func():
    from sampan.experimental.func import hessian, jacrev
    r = np.random.default_rng(6)
    w, x = r.standard_normal((3, 2)), r.standard_normal((4, 3))

    def f(F, w, x):
        return F.tanh(x @ w)

    def loss(F, w, x):
        return (F.tanh(x @ w) ** 2).sum()

    J = jacrev(lambda w, x: f(sampan, w, x))(sampan.tensor(w), sampan.tensor(x))
    tJ = torch.func.jacrev(lambda w, x: f(torch, w, x))(torch.tensor(w), torch.tensor(x))
    assert J.shape == (4, 2, 3, 2)
    np.testing.assert_allclose(J.numpy(), tJ.numpy(), rtol=1e-12, atol=1e-12)
    Jw, Jx = jacrev(lambda w, x: f(sampan, w, x), argnums=(0, 1))(sampan.tensor(w),
                                                                   sampan.tensor(x))
    tJx = torch.func.jacrev(lambda w, x: f(torch, w, x), argnums=1)(torch.tensor(w),
                                                                     torch.tensor(x))
    np.testing.assert_allclose(Jx.numpy(), tJx.numpy(), rtol=1e-12, atol=1e-12)
    H = hessian(lambda w, x: loss(sampan, w, x))(sampan.tensor(w), sampan.tensor(x))
    tH = torch.func.hessian(lambda w, x: loss(torch, w, x))(torch.tensor(w), torch.tensor(x))
    assert H.shape == (3, 2, 3, 2)
    np.testing.assert_allclose(H.numpy(), tH.numpy(), rtol=1e-10, atol=1e-12)
    hj = sampan.jit(lambda w, x: hessian(lambda w, x: loss(sampan, w, x))(w, x))
    np.testing.assert_allclose(hj(sampan.tensor(w), sampan.tensor(x)).numpy(), tH.numpy(),
                               rtol=1e-10, atol=1e-12)
    with pytest.raises(AutogradError, match="argnums must be one int"):
        hessian(lambda w: w.sum(), argnums=(0,))
    with pytest.raises(AutogradError, match="argnums 1 must name a tensor"):
        jacrev(lambda w, s: w * s, argnums=1)(sampan.tensor(w), 2.0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_jvp_matches_torch_func():
    from sampan.experimental.func import jvp
    r = np.random.default_rng(7)
    a, b = r.standard_normal((4, 5)), r.standard_normal((5, 3))
    ta, tb = r.standard_normal((4, 5)), r.standard_normal((5, 3))

    def f(F, a, b):
        return F.softmax(F.tanh(a @ b), -1) * F.exp(a[:, :3])

    out, jv = jvp(lambda a, b: f(sampan, a, b), (sampan.tensor(a), sampan.tensor(b)),
                  (sampan.tensor(ta), sampan.tensor(tb)))
    tout, tjv = torch.func.jvp(lambda a, b: f(torch, a, b), (torch.tensor(a), torch.tensor(b)),
                               (torch.tensor(ta), torch.tensor(tb)))
    np.testing.assert_allclose(out.numpy(), tout.numpy(), rtol=1e-12)
    np.testing.assert_allclose(jv.numpy(), tjv.numpy(), rtol=1e-10, atol=1e-12)
    assert not jv.requires_grad and not out.requires_grad
    jf = sampan.jit(lambda a, b, ta, tb: jvp(lambda a, b: f(sampan, a, b), (a, b), (ta, tb)))
    jout, jjv = jf(*(sampan.tensor(v) for v in (a, b, ta, tb)))
    np.testing.assert_allclose(jjv.numpy(), tjv.numpy(), rtol=1e-10, atol=1e-12)
    # an output that ignores the input: zero tangent
    _, z = jvp(lambda a: sampan.tensor(np.ones(2)), (sampan.tensor(a),), (sampan.tensor(ta),))
    np.testing.assert_array_equal(z.numpy(), [0.0, 0.0])
    with pytest.raises(AutogradError, match=r"tangent 0 has shape \(5, 3\)"):
        jvp(lambda a: a, (sampan.tensor(a),), (sampan.tensor(tb),))


def test_second_order_of_softplus_and_bce_with_logits_at_zero():
    """At logits exactly 0 (a zero-initialised linear model) the curvature is sigmoid'(0) =
    1/4; the max/abs composite these were built from gave 0 there (abs' gradient is 0)."""
    import sampan.nn.functional as F
    x = sampan.tensor(np.zeros(3))
    np.testing.assert_allclose(hessian(lambda x: sampan.softplus(x).sum())(x).numpy(),
                               0.25 * np.eye(3))
    r = np.random.default_rng(8)
    a, y = r.standard_normal((5, 3)), (r.random(5) > 0.5).astype(np.float64)

    def loss(F, w, a, y):
        return F.binary_cross_entropy_with_logits(a @ w, y)

    h = hessian(lambda w: loss(F, w, sampan.tensor(a), sampan.tensor(y)))(x)
    th = torch.func.hessian(lambda w: loss(torch.nn.functional, w, torch.tensor(a),
                                           torch.tensor(y)))(torch.zeros(3, dtype=torch.float64))
    np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=1e-12, atol=1e-15)


def test_second_order_through_non_differentiable_ops_under_jit():
    """abs' gradient multiplies by sign(x), an op without a gradient rule: eagerly it was
    never taped, but the tracer taped it when the backward pass built a graph
    (create_graph) and the second backward pass then called its missing rule."""
    import sampan.nn.functional as F
    x = np.random.default_rng(9).standard_normal(4)

    def f(x):
        return (sampan.abs(x) ** 1.5).sum() + F.smooth_l1_loss(x, x * 0) + sampan.floor(x).sum()

    def tf(x):
        return ((torch.abs(x) ** 1.5).sum() + torch.nn.functional.smooth_l1_loss(x, x * 0)
                + torch.floor(x).sum())

    want = torch.func.hessian(tf)(torch.tensor(x)).numpy()
    got = sampan.jit(lambda x: hessian(f)(x))(sampan.tensor(x))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(hessian(f)(sampan.tensor(x)).numpy(), want, rtol=1e-12,
                               atol=1e-15)


def test_functional_call_gradients_of_layer_weights_match_torch():
    from sampan import nn
    from sampan.experimental.func import functional_call
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x = np.random.default_rng(10).standard_normal((5, 4)).astype(np.float32)
    y = np.array([0, 2, 1, 1, 0])
    params = {k: v.detach() for k, v in m.named_parameters()}
    originals = list(m.parameters())

    def loss(p, x, y):
        return sampan.cross_entropy(functional_call(m, p, (x,)), y)

    g = grad(loss)(params, sampan.tensor(x), sampan.tensor(y))
    jg = sampan.jit(lambda p, x, y: grad(loss)(p, x, y))(params, sampan.tensor(x),
                                                          sampan.tensor(y))
    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    tp = {k: torch.tensor(v.numpy().T.copy() if v.ndim == 2 else v.numpy())
          for k, v in params.items()}   # sampan's Linear weight is (in, out)
    tg = torch.func.grad(lambda p, x, y: torch.nn.functional.cross_entropy(
        torch.func.functional_call(tm, p, (x,)), y))(tp, torch.tensor(x), torch.tensor(y))
    for k in params:
        want = tg[k].numpy().T if tg[k].ndim == 2 else tg[k].numpy()
        np.testing.assert_allclose(g[k].numpy(), want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(jg[k].numpy(), want, rtol=1e-5, atol=1e-7)
    # the layer is untouched: its own parameters, no grads accumulated
    assert all(a is b for a, b in zip(m.parameters(), originals))
    assert all(p.grad is None for p in m.parameters())
    np.testing.assert_allclose(m(sampan.tensor(x)).numpy(),
                               functional_call(m, params, (sampan.tensor(x),)).numpy())


def test_functional_call_ties_restores_and_errors():
    from sampan import nn
    from sampan.experimental.func import functional_call

    class Tied(nn.Layer):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)
            self.b.weight = self.a.weight      # tied
            self.register_buffer("scale", sampan.tensor(np.float32(2.0)))

        def forward(self, x):
            return self.b(self.a(x)) * self.scale

    m = Tied()
    x = sampan.tensor(np.ones((1, 3), np.float32))
    w = sampan.tensor(np.eye(3, dtype=np.float32))
    z = sampan.tensor(np.zeros(3, np.float32))
    out = functional_call(m, {"a.weight": w, "a.bias": z, "b.bias": z,
                              "scale": sampan.tensor(np.float32(3.0))}, (x,))
    np.testing.assert_array_equal(out.numpy(), [[3.0, 3.0, 3.0]])   # tie followed
    assert m.b.weight is m.a.weight and float(m.scale.item()) == 2.0   # restored

    class Boom(Exception):
        pass

    def hook(layer, args, out):
        raise Boom

    h = m.register_forward_hook(hook)
    with pytest.raises(Boom):
        functional_call(m, {"a.weight": w}, (x,))
    h.remove()
    assert m.a.weight is not w                                        # restored on error
    with pytest.raises(AutogradError, match="no parameter or buffer named 'c.weight'"):
        functional_call(m, {"c.weight": w}, (x,))
    with pytest.raises(AutogradError, match=r"'a.weight' has shape \(3, 3\), got \(2,\)"):
        functional_call(m, {"a.weight": sampan.zeros(2)}, (x,))
    with pytest.raises(AutogradError, match="missing scale, a.bias, b.bias$"):  # b.weight: tied
        functional_call(m, {"a.weight": w}, (x,), strict=True)
