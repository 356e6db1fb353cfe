"""Issue 17 Layer surface against PyTorch: device=/dtype= on every constructor, dtype
conversions, dotted look-ups, full backward hooks (order and tuple contents), zero_grad,
and sampan.nn.utils (clipping, parameter vectors) against torch.nn.utils."""
import numpy as np
import pytest
import torch

import sampan
from sampan import nn

from ._ref import close


def _layer_classes():
    """Every exported layer class (the generic keywords must reach them all)."""
    out = []
    for name in nn.__all__:
        obj = getattr(nn, name)
        if isinstance(obj, type) and issubclass(obj, nn.Layer):
            out.append(obj)
    return out


def test_every_layer_constructor_takes_device_and_dtype():
    classes = _layer_classes()
    assert len(classes) > 60
    for cls in classes:
        assert getattr(cls.__init__, "_factory_kwargs", False) or cls.__init__ is \
            nn.Layer.__init__ or any(getattr(b.__dict__.get("__init__"), "_factory_kwargs",
                                             False) for b in cls.__mro__), cls


@pytest.mark.parametrize("make", [lambda **k: nn.Linear(3, 4, **k),
                                  lambda **k: nn.PReLU(3, **k),
                                  lambda **k: nn.Conv2d(2, 3, 3, **k),
                                  lambda **k: nn.BatchNorm1d(4, **k),
                                  lambda **k: nn.LayerNorm(4, **k),
                                  lambda **k: nn.Embedding(5, 2, **k),
                                  lambda **k: nn.ReLU(**k)])
def test_dtype_and_device_keywords(make):
    m = make(dtype=sampan.float64, device="cpu")
    for _, t in list(m.named_parameters()) + list(m.named_buffers()):
        if t.dtype.kind == "f":
            assert t.dtype == sampan.float64
    with pytest.raises(sampan.DeviceError):
        make(device="cuda")
    with pytest.raises(sampan.DeviceError):
        make(device="mps")


def test_user_layer_gets_the_keywords_too():
    class Net(nn.Layer):
        def __init__(self, n):
            super().__init__()
            self.fc = nn.Linear(n, 2)
            self.register_buffer("steps", sampan.zeros(1, dtype="int64"))

    net = Net(3, dtype="float64")
    assert net.fc.weight.dtype == sampan.float64 and net.steps.dtype == sampan.int64


def test_dtype_conversions_in_place_like_torch():
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    w = m[0].weight
    t = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    for meth, td in [("half", torch.float16), ("bfloat16", torch.bfloat16),
                     ("double", torch.float64), ("float", torch.float32)]:
        assert getattr(m, meth)() is m
        getattr(t, meth)()
        assert str(m[0].weight.dtype).replace("bfloat16", "bfloat16") == str(td)[6:]
        assert m[1].num_batches_tracked.dtype == sampan.int64   # not floating: kept
    assert m[0].weight is w    # the same Parameter objects: optimisers keep working
    assert m.to(sampan.float64) is m and w.dtype == sampan.float64
    assert m.to("cpu", sampan.float32) is m and w.dtype == sampan.float32
    assert m.to(sampan.zeros(1, dtype="float64")).type(sampan.float16) is m
    assert w.dtype == sampan.float16
    with pytest.raises(sampan.DeviceError):
        m.to("cuda")
    with pytest.raises(sampan.SampanValueError):
        m.to(sampan.int32)


def test_dotted_lookups_and_registration():
    net = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.BatchNorm1d(3), nn.ReLU()))
    assert net.get_submodule("1.0") is net[1][0]
    assert net.get_submodule("") is net
    assert net.get_parameter("1.0.weight") is net[1][0].weight
    assert net.get_buffer("1.0.running_mean") is net[1][0].running_mean
    with pytest.raises(AttributeError, match="no sub-layer 'x'"):
        net.get_submodule("1.x")
    with pytest.raises(AttributeError, match="no parameter"):
        net.get_parameter("0.running_mean")
    head = nn.Linear(3, 1)
    net.register_module("head", head)
    net.add_module("tail", nn.Identity())
    assert net.get_submodule("head") is head and "head.weight" in net.state_dict()
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_zero_grad_like_torch():
    m = nn.Linear(2, 2)
    m(sampan.randn(3, 2)).sum().backward()
    g = m.weight.grad
    m.zero_grad(set_to_none=False)
    assert m.weight.grad is g and (g.numpy() == 0).all()
    m.zero_grad()
    assert m.weight.grad is None


def _hook_run(mk_s, mk_t, inputs, mapping):
    calls = {"s": [], "t": []}

    def hooks(layer, key, lib):
        def pre(mod, grad_output):
            calls[key].append(("pre", [None if g is None else _np(g) for g in grad_output]))

        def full(mod, grad_input, grad_output):
            calls[key].append(("full", [None if g is None else _np(g) for g in grad_input],
                               [None if g is None else _np(g) for g in grad_output]))
        h1 = layer.register_full_backward_pre_hook(pre)
        h2 = layer.register_full_backward_hook(full)
        return h1, h2

    s, t = mk_s(), mk_t()
    for sn, tn in mapping.items():
        s.get_parameter(sn)._data[...] = t.get_parameter(tn).detach().numpy().T \
            if sn == "weight" and isinstance(s, nn.Linear) else \
            t.get_parameter(tn).detach().numpy()
    hs, _ = hooks(s, "s", sampan), hooks(t, "t", torch)
    s_in = [sampan.tensor(a, requires_grad=rg) for a, rg in inputs]
    t_in = [torch.tensor(a, requires_grad=rg) for a, rg in inputs]
    s(*s_in).sum().backward()
    t(*t_in).sum().backward()
    assert [c[0] for c in calls["s"]] == [c[0] for c in calls["t"]] == ["pre", "full"]
    for cs, ct in zip(calls["s"], calls["t"]):
        for a, b in zip(cs[1:], ct[1:]):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert (x is None) == (y is None)
                if x is not None:
                    close(x, y)
    for h in hs:
        h.remove()
    calls["s"].clear()
    s(*[sampan.tensor(a, requires_grad=rg) for a, rg in inputs]).sum().backward()
    assert calls["s"] == []
    return s_in, t_in


def _np(g):
    return g.numpy() if isinstance(g, sampan.Tensor) else g.detach().numpy()


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_full_backward_hooks_match_torch():
    r = np.random.default_rng(0)
    a = r.standard_normal((4, 3))
    _hook_run(lambda: nn.Linear(3, 2, dtype="float64"),
              lambda: torch.nn.Linear(3, 2).double(), [(a, True)],
              {"weight": "weight", "bias": "bias"})
    # input without grad: the hook still runs, with grad_input (None,)
    _hook_run(lambda: nn.Linear(3, 2, dtype="float64"),
              lambda: torch.nn.Linear(3, 2).double(), [(a, False)],
              {"weight": "weight", "bias": "bias"})
    b = r.standard_normal((4, 5))
    _hook_run(lambda: nn.Bilinear(3, 5, 2, dtype="float64"),
              lambda: torch.nn.Bilinear(3, 5, 2).double(), [(a, True), (b, True)],
              {"weight": "weight", "bias": "bias"})
    _hook_run(lambda: nn.Bilinear(3, 5, 2, dtype="float64"),
              lambda: torch.nn.Bilinear(3, 5, 2).double(), [(a, False), (b, True)],
              {"weight": "weight", "bias": "bias"})


def test_backward_hooks_may_replace_gradients():
    m = nn.Linear(3, 2)
    x = sampan.randn(4, 3, requires_grad=True)
    m.register_full_backward_pre_hook(lambda mod, go: (go[0] * 0.0,))
    m(x).sum().backward()
    assert (x.grad.numpy() == 0).all() and (m.weight.grad.numpy() == 0).all()
    m2 = nn.Linear(3, 2)
    x2 = sampan.randn(4, 3, requires_grad=True)
    m2.register_full_backward_hook(lambda mod, gi, go: (gi[0] * 2.0,))
    m2(x2).sum().backward()
    ref = np.ones((4, 2)) @ m2.weight.numpy().T * 2.0
    np.testing.assert_allclose(x2.grad.numpy(), ref, rtol=1e-6)


# ---------------------------------------------------------------------- nn.utils
def _pair(seed):
    s = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 3)).to(sampan.float64)
    t = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 3)).double()
    for (_, sp), (_, tp) in zip(s.named_parameters(), t.named_parameters()):
        sp._data[...] = tp.detach().numpy().T if sp.ndim == 2 else tp.detach().numpy()
    x = np.random.default_rng(seed).standard_normal((6, 4)) * 3
    s(sampan.tensor(x)).pow(2).sum().backward()
    t(torch.tensor(x)).pow(2).sum().backward()
    return s, t


def _grads(m):
    return [p.grad.numpy() if isinstance(p.grad, sampan.Tensor) else p.grad.numpy()
            for p in m.parameters()]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf"), "inf"])
def test_clip_grad_norm_matches_torch(norm_type):
    s, t = _pair(0)
    ns = nn.utils.clip_grad_norm_(s.parameters(), 1.5, norm_type=norm_type, foreach=True)
    nt = torch.nn.utils.clip_grad_norm_(t.parameters(), 1.5, norm_type=norm_type)
    close(ns.numpy(), nt, what="total norm")
    for a, p in zip(_grads(s), t.parameters()):
        close(a.T if a.ndim == 2 else a, p.grad, what="clipped grad")


def test_clip_grad_value_and_nonfinite():
    s, t = _pair(1)
    nn.utils.clip_grad_value_(s.parameters(), 0.5, foreach=None)
    torch.nn.utils.clip_grad_value_(t.parameters(), 0.5)
    for a, p in zip(_grads(s), t.parameters()):
        close(a.T if a.ndim == 2 else a, p.grad)
    p = nn.Parameter(sampan.zeros(2))
    p.grad = sampan.tensor([float("nan"), 1.0])
    with pytest.raises(sampan.SampanValueError, match="non-finite"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)


def test_parameter_vectors_match_torch():
    s, t = _pair(2)
    vs = nn.utils.parameters_to_vector([p for p in s.parameters() if p.ndim == 1])
    vt = torch.nn.utils.parameters_to_vector([p for p in t.parameters() if p.ndim == 1])
    close(vs.numpy(), vt)
    v = np.arange(float(sum(p.numel() for p in s.parameters())))
    nn.utils.vector_to_parameters(sampan.tensor(v), s.parameters())
    assert float(s[0].weight.numpy()[0, 1]) == 1.0 and float(s[1].bias.numpy()[-1]) == v[-1]
    with pytest.raises(sampan.ShapeError, match="vector_to_parameters"):
        nn.utils.vector_to_parameters(sampan.zeros(3), s.parameters())
    w = nn.Parameter(sampan.ones(2, 2))
    (nn.utils.parameters_to_vector([w]) * 3.0).sum().backward()   # differentiable
    assert (w.grad.numpy() == 3.0).all()
