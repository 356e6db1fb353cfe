"""Issue 17 activations, dropouts, containers and small functional helpers against
PyTorch: forward values, input and parameter gradients with the same weights (float64,
_ref.TOL), in-place forms writing their input with torch's gradients, and statistical
checks for the random layers."""
import numpy as np
import pytest
import torch

import sampan
from sampan import nn
from sampan.nn import functional as F

from ._ref import close

TF = torch.nn.functional
# values with the kinks and bounds included, where PyTorch's choice of gradient shows
EDGES = np.array([-4.0, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0])


def _x(seed=0, shape=(3, 4, 5)):
    r = np.random.default_rng(seed)
    a = r.uniform(-4, 4, size=shape)
    a.reshape(-1)[:EDGES.size] = EDGES
    return a


# (sampan layer, torch layer)
LAYERS = [
    (lambda: nn.ReLU6(), lambda: torch.nn.ReLU6()),
    (lambda: nn.Hardswish(), lambda: torch.nn.Hardswish()),
    (lambda: nn.Hardsigmoid(), lambda: torch.nn.Hardsigmoid()),
    (lambda: nn.Hardtanh(-2.0, 1.5), lambda: torch.nn.Hardtanh(-2.0, 1.5)),
    (lambda: nn.Mish(), lambda: torch.nn.Mish()),
    (lambda: nn.LogSigmoid(), lambda: torch.nn.LogSigmoid()),
    (lambda: nn.SELU(), lambda: torch.nn.SELU()),
    (lambda: nn.CELU(0.7), lambda: torch.nn.CELU(0.7)),
    (lambda: nn.ELU(1.3), lambda: torch.nn.ELU(1.3)),
    (lambda: nn.Softsign(), lambda: torch.nn.Softsign()),
    (lambda: nn.Tanhshrink(), lambda: torch.nn.Tanhshrink()),
    (lambda: nn.Threshold(0.5, -2.0), lambda: torch.nn.Threshold(0.5, -2.0)),
    (lambda: nn.Hardshrink(1.0), lambda: torch.nn.Hardshrink(1.0)),
    (lambda: nn.Softshrink(0.5), lambda: torch.nn.Softshrink(0.5)),
    (lambda: nn.GLU(1), lambda: torch.nn.GLU(1)),
    (lambda: nn.GLU(), lambda: torch.nn.GLU()),
    (lambda: nn.Softmin(1), lambda: torch.nn.Softmin(1)),
    (lambda: nn.Softmax2d(), lambda: torch.nn.Softmax2d()),
    (lambda: nn.LeakyReLU(0.2), lambda: torch.nn.LeakyReLU(0.2)),
    (lambda: nn.SiLU(), lambda: torch.nn.SiLU()),
]


# PyTorch's hardsigmoid gradient multiplies by a float32 1/6 and CELU's takes alpha in
# float32, even for float64 tensors: those two agree to float32's precision only
LOOSE = {2: 1e-6, 7: 1e-6}


def _close(a, b, what, tol):
    if tol is None:
        return close(a, b, what=what)
    np.testing.assert_allclose(a, b.detach().numpy(), rtol=tol, atol=tol, err_msg=what)


def _compare(s_layer, t_layer, a, params=(), tol=None):
    xs = sampan.tensor(a.copy(), requires_grad=True)
    xt = torch.tensor(a.copy(), requires_grad=True)
    ys, yt = s_layer(xs), t_layer(xt)
    close(ys.numpy(), yt, what="forward")
    g = np.random.default_rng(1).standard_normal(tuple(yt.shape))
    ys.backward(sampan.tensor(g))
    yt.backward(torch.tensor(g))
    _close(xs.grad.numpy(), xt.grad, "input grad", tol)
    for sp, tp in params:
        close(sp.grad.numpy(), tp.grad, what="param grad")


@pytest.mark.parametrize("k", range(len(LAYERS)))
def test_activation_layers_match_torch(k):
    s, t = LAYERS[k]
    a = _x(k, {15: (3, 4, 6), 17: (2, 4, 3, 2)}.get(k, (3, 4, 5)))
    _compare(s(), t().double(), a, tol=LOOSE.get(k))


@pytest.mark.parametrize("n", [1, 4])
def test_prelu_weights_and_grads(n):
    s, t = nn.PReLU(n, init=0.1, dtype=sampan.float64), torch.nn.PReLU(n, 0.1).double()
    s.weight._data[...] = np.linspace(-0.3, 0.4, n)
    with torch.no_grad():
        t.weight.copy_(torch.tensor(s.weight.numpy()))
    _compare(s, t, _x(3, (2, 4, 3)), [(s.weight, t.weight)])
    assert repr(s) == repr(t) == f"PReLU(num_parameters={n})"


INPLACE = [
    ("relu", {}), ("relu6", {}), ("leaky_relu", {"negative_slope": 0.1}), ("elu", {}),
    ("selu", {}), ("celu", {"alpha": 0.5}), ("hardtanh", {}), ("hardswish", {}),
    ("hardsigmoid", {}), ("mish", {}), ("silu", {}), ("threshold", {"threshold": 0.2,
                                                                     "value": 3.0}),
]


@pytest.mark.parametrize("name,kw", INPLACE)
def test_inplace_writes_input_and_keeps_torch_grads(name, kw):
    a = _x(5, (4, 5))
    leaf_s = sampan.tensor(a.copy(), requires_grad=True)
    leaf_t = torch.tensor(a.copy(), requires_grad=True)
    xs, xt = leaf_s * 2.0, leaf_t * 2.0
    ys = getattr(F, name)(xs, inplace=True, **kw)
    yt = getattr(TF, name)(xt, inplace=True, **kw)
    assert ys is xs
    close(xs.numpy(), xt, what="x was written")
    (ys * ys).sum().backward()
    (yt * yt).sum().backward()
    tol = 1e-6 if name in ("hardsigmoid", "celu") else None   # see LOOSE
    _close(leaf_s.grad.numpy(), leaf_t.grad, "grad through the in-place op", tol)


def test_inplace_layers_and_leaf_refusal():
    x = sampan.tensor(_x(6, (3, 4)))
    before = x.numpy().copy()
    y = nn.ReLU(inplace=True)(x)
    assert y is x and (x.numpy() == np.maximum(before, 0)).all()
    assert repr(nn.ReLU(inplace=True)) == repr(torch.nn.ReLU(inplace=True))
    leaf = sampan.randn(3, requires_grad=True)
    with pytest.raises(sampan.AutogradError):
        F.relu_(leaf)
    d = sampan.ones(100)
    out = nn.Dropout(0.5, inplace=True)(d)
    assert out is d and set(np.unique(d.numpy())) <= {0.0, 2.0}
    z = sampan.ones(5)
    assert nn.Dropout(0.5, inplace=True).eval()(z) is z and (z.numpy() == 1).all()


def test_extra_repr_like_torch():
    pairs = [(nn.Hardtanh(), torch.nn.Hardtanh()), (nn.ReLU6(True), torch.nn.ReLU6(True)),
             (nn.Threshold(0.1, 2.0), torch.nn.Threshold(0.1, 2.0)),
             (nn.CELU(), torch.nn.CELU()), (nn.SELU(), torch.nn.SELU()),
             (nn.GLU(), torch.nn.GLU()), (nn.Softshrink(), torch.nn.Softshrink()),
             (nn.Softmin(1), torch.nn.Softmin(1)), (nn.Hardswish(True), torch.nn.Hardswish(True)),
             (nn.Dropout2d(0.3), torch.nn.Dropout2d(0.3)),
             (nn.AlphaDropout(0.2), torch.nn.AlphaDropout(0.2)),
             (nn.Dropout(0.1), torch.nn.Dropout(0.1)), (nn.Identity(3, k=1), torch.nn.Identity()),
             (nn.Unflatten(1, (2, 5)), torch.nn.Unflatten(1, (2, 5))),
             (nn.LeakyReLU(0.2, True), torch.nn.LeakyReLU(0.2, True)),
             (nn.Softplus(), torch.nn.Softplus()), (nn.Softmax(dim=1), torch.nn.Softmax(dim=1))]
    for s, t in pairs:
        assert repr(s) == repr(t)


# ---------------------------------------------------------------------- dropouts
@pytest.mark.parametrize("layer,shape,lead", [(nn.Dropout1d, (40, 30, 6), 2),
                                              (nn.Dropout2d, (40, 30, 3, 2), 2),
                                              (nn.Dropout3d, (40, 30, 2, 2, 2), 2),
                                              (nn.Dropout2d, (300, 3, 4), 1)])
def test_channel_dropout_masks_whole_channels(layer, shape, lead):
    x = sampan.ones(*shape)
    y = layer(0.3)(x).numpy()
    flat = y.reshape(int(np.prod(shape[:lead])), -1)
    # each channel is all zeros or all 1/(1-p)
    assert ((flat == 0).all(1) | np.isclose(flat, 1 / 0.7).all(1)).all()
    frac = (flat[:, 0] == 0).mean()
    assert abs(frac - 0.3) < 0.08
    assert layer(0.3).eval()(x) is x


def test_alpha_dropout_keeps_mean_and_variance():
    x = sampan.randn(200000, dtype=sampan.float64)
    y = nn.AlphaDropout(0.2)(x).numpy()
    assert abs(y.mean()) < 0.02 and abs(y.var() - 1.0) < 0.02
    f = nn.FeatureAlphaDropout(0.4)(sampan.randn(400, 200, 3, dtype=sampan.float64)).numpy()
    assert abs(f.mean()) < 0.03 and abs(f.var() - 1.0) < 0.03
    # one mask value per channel: the dropped channels are constant
    per = f.reshape(400 * 200, 3)
    const = np.isclose(per, per[:, :1]).all(1)
    assert abs(const.mean() - 0.4) < 0.03
    e = sampan.randn(10)
    assert nn.AlphaDropout(0.2).eval()(e) is e
    assert F.alpha_dropout(e, 0.5) is e   # PyTorch's default training=False


def test_dropout_gradient_uses_the_mask():
    x = sampan.ones(50, 20, 4, requires_grad=True)
    y = F.dropout1d(x, 0.5)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.detach().numpy())


# ---------------------------------------------------------------------- containers
def test_parameter_list_and_dict_register_like_torch():
    ps = nn.ParameterList([sampan.zeros(3, 4), nn.Parameter(sampan.ones(2))])
    ps.append(sampan.zeros(1))
    tl = torch.nn.ParameterList([torch.zeros(3, 4), torch.ones(2), torch.zeros(1)])
    assert [n for n, _ in ps.named_parameters()] == [n for n, _ in tl.named_parameters()]
    assert list(ps.state_dict()) == list(tl.state_dict())
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in ps)
    assert len(ps) == 3 and ps[-1].shape == (1,)
    assert repr(ps).replace("sampan.", "torch.") == repr(tl)
    pd = nn.ParameterDict({"a": sampan.zeros(2), "b": nn.Parameter(sampan.ones(1, 2))})
    pd["c"] = sampan.zeros(3)
    td = torch.nn.ParameterDict({"a": torch.zeros(2), "b": torch.ones(1, 2),
                                 "c": torch.zeros(3)})
    assert list(pd.state_dict()) == list(td.state_dict()) == ["a", "b", "c"]
    assert "b" in pd and list(pd.keys()) == ["a", "b", "c"]
    del pd["a"]
    assert [n for n, _ in pd.named_parameters()] == ["b", "c"]
    m = nn.Sequential(nn.Linear(2, 2), nn.ParameterList([sampan.zeros(2)]))
    assert list(m.state_dict()) == ["0.weight", "0.bias", "1.0"]
    with pytest.raises(sampan.SampanValueError):
        pd["x.y"] = sampan.zeros(1)


def test_unflatten_and_identity():
    x = np.arange(60.0).reshape(3, 20)
    for size in [(4, 5), (2, -1), [2, 2, 5]]:
        s = nn.Unflatten(1, size)(sampan.tensor(x))
        t = torch.nn.Unflatten(1, size)(torch.tensor(x))
        close(s.numpy(), t)
    assert nn.Unflatten(-1, (5, 4))(sampan.tensor(x)).shape == (3, 5, 4)
    with pytest.raises(sampan.ShapeError, match="Unflatten"):
        nn.Unflatten(1, (3, 5))(sampan.tensor(x))
    i = nn.Identity(54, unused="argument")
    t = sampan.ones(2)
    assert i(t) is t


# ---------------------------------------------------------------------- functional helpers
def test_functional_forms_match_torch():
    a = _x(7, (4, 6))
    xs, xt = sampan.tensor(a), torch.tensor(a)
    for name, kw in [("prelu", None), ("softmin", {"dim": 0}), ("glu", {"dim": 1}),
                     ("hardshrink", {"lambd": 1.0}), ("softshrink", {"lambd": 1.0}),
                     ("logsigmoid", {}), ("tanhshrink", {}), ("softsign", {})]:
        if kw is None:
            w = np.array([0.3])
            close(F.prelu(xs, sampan.tensor(w)).numpy(), TF.prelu(xt, torch.tensor(w)))
            continue
        close(getattr(F, name)(xs, **kw).numpy(), getattr(TF, name)(xt, **kw), what=name)
    for p, dim in [(2.0, 1), (1.0, 0), (3.0, -1), (float("inf"), 1)]:
        close(F.normalize(xs, p, dim).numpy(), TF.normalize(xt, p, dim), what=f"p={p}")
    close(F.normalize(xs, dim=0, eps=1e-3).numpy(), TF.normalize(xt, dim=0, eps=1e-3))
    with pytest.raises(sampan.ShapeError, match="glu"):
        F.glu(sampan.zeros(3, 5))


def test_one_hot_is_int64_and_infers_classes():
    s = F.one_hot(sampan.tensor([[2, 0], [1, 4]]))
    t = TF.one_hot(torch.tensor([[2, 0], [1, 4]]))
    assert s.dtype == sampan.int64 and s.shape == tuple(t.shape) == (2, 2, 5)
    np.testing.assert_array_equal(s.numpy(), t.numpy())
    assert F.one_hot(sampan.tensor([1]), 3).shape == (1, 3)


def test_gumbel_softmax_statistics_and_straight_through():
    logits = np.log(np.array([0.1, 0.2, 0.7]))
    x = sampan.tensor(np.tile(logits, (20000, 1)), requires_grad=True)
    y = F.gumbel_softmax(x, tau=0.5, hard=True)
    h = y.numpy()
    assert set(np.unique(h)) == {0.0, 1.0} and (h.sum(1) == 1).all()
    # argmax of logits + Gumbel noise samples the softmax of the logits
    np.testing.assert_allclose(h.mean(0), [0.1, 0.2, 0.7], atol=0.015)
    w = sampan.tensor(np.random.default_rng(0).standard_normal((20000, 3)))
    (y * w).sum().backward()
    assert x.grad.shape == x.shape and np.isfinite(x.grad.numpy()).all()
    assert np.abs(x.grad.numpy()).sum() > 0   # the soft sample's gradient flows
    soft = F.gumbel_softmax(sampan.tensor(np.tile(logits, (5, 1))), tau=2.0, dim=-1).numpy()
    np.testing.assert_allclose(soft.sum(1), 1.0)
    assert (soft > 0).all() and (soft < 1).all()
