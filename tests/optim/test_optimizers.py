"""Optimisers against PyTorch's on one gradient sequence, state_dict, functional rules."""
import numpy as np
import pytest
import torch

import sampan
import sampan.io as sio
import sampan.optim as so
import sampan.optim.functional as F

SHAPES = [(4, 3), (3,), (2, 2, 2)]

CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.3}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "weight_decay": 0.1, "maximize": True}),
    ("SGD", {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.1, "maximize": True}),
    ("Adam", {}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6}),
    ("Adam", {"lr": 0.01, "amsgrad": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True, "maximize": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "maximize": True}),
    ("Adagrad", {"lr": 0.1}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05, "initial_accumulator_value": 0.3, "eps": 1e-6}),
    ("Adagrad", {"lr": 0.1, "weight_decay": 0.1, "maximize": True}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9}),
    ("RMSprop", {"lr": 0.01, "centered": True}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.9, "momentum": 0.5, "centered": True, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "eps": 1e-4, "maximize": True}),
]


def _data(steps=20, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s) for s in SHAPES]
    grads = [[rng.standard_normal(s) for s in SHAPES] for _ in range(steps)]
    return init, grads


def _feed(params, grads, t, make):
    for i, (p, g) in enumerate(zip(params, grads)):
        # parameter 1 sits out every third step: an optimiser must skip grad=None
        p.grad = None if (i == 1 and t % 3 == 2) else make(g.copy())


def _run_both(name, kw, steps=20, groups=None):
    init, grads = _data(steps)
    sp = [sampan.tensor(a.copy(), requires_grad=True) for a in init]
    tp = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    if groups is None:
        sopt, topt = getattr(so, name)(sp, **kw), getattr(torch.optim, name)(tp, **kw)
    else:
        sopt = getattr(so, name)(groups(sp), **kw)
        topt = getattr(torch.optim, name)(groups(tp), **kw)
    for t in range(steps):
        _feed(sp, grads[t], t, sampan.tensor)
        _feed(tp, grads[t], t, torch.tensor)
        sopt.step()
        topt.step()
    return sp, tp, sopt, topt


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_matches_torch(name, kw):
    sp, tp, sopt, topt = _run_both(name, kw)
    for a, b in zip(sp, tp):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-11, atol=1e-13)
    # the moment estimates agree too, not only the parameters
    sstate = sopt.state_dict()["state"]
    tstate = topt.state_dict()["state"]
    for idx, ts in tstate.items():
        for key, tv in ts.items():
            if key == "step" or not isinstance(tv, torch.Tensor):
                continue
            np.testing.assert_allclose(sstate[idx][key].numpy(), tv.numpy(), rtol=1e-11,
                                       atol=1e-13, err_msg=key)


def test_param_groups_match_torch():
    def groups(ps):
        return [{"params": ps[:2], "lr": 0.05, "momentum": 0.5},
                {"params": ps[2:], "weight_decay": 0.1, "nesterov": True}]
    sp, tp, sopt, _ = _run_both("SGD", {"lr": 0.1, "momentum": 0.9}, groups=groups)
    for a, b in zip(sp, tp):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-11, atol=1e-13)
    assert sopt.param_groups[0]["lr"] == 0.05 and sopt.param_groups[1]["lr"] == 0.1


def test_add_param_group_and_errors():
    a = sampan.zeros(2, requires_grad=True)
    b = sampan.zeros(2, requires_grad=True)
    opt = so.Adam([a], lr=0.1)
    opt.add_param_group({"params": [b], "lr": 0.5})
    assert opt.param_groups[1]["betas"] == (0.9, 0.999)
    with pytest.raises(sampan.SampanValueError, match="more than one group"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(sampan.SampanValueError, match="lr"):
        so.SGD([a])
    with pytest.raises(sampan.SampanValueError, match="Nesterov"):
        so.SGD([a], lr=0.1, nesterov=True)
    with pytest.raises(sampan.SampanValueError, match="betas"):
        so.Adam([a], betas=(1.0, 0.9))


def test_zero_grad_and_version_bump():
    w = sampan.ones(3, requires_grad=True)
    opt = so.SGD([w], lr=0.1)
    (w * w).sum().backward()
    v0 = w._version
    opt.step()
    assert w._version == v0 + 1
    np.testing.assert_allclose(w.numpy(), 0.8)
    opt.zero_grad(set_to_none=False)
    assert w.grad is not None and not w.grad.numpy().any()
    opt.zero_grad()
    assert w.grad is None


def test_closure_returns_loss():
    w = sampan.ones(3, requires_grad=True)
    opt = so.SGD([w], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss
    assert float(opt.step(closure)) == 3.0


def test_float32_update_stays_float32_and_in_place():
    w = sampan.ones(4, requires_grad=True)
    storage = w._data
    opt = so.AdamW([w], lr=0.1)
    (w * w).sum().backward()
    opt.step()
    assert w._data is storage and w.dtype == np.float32
    assert opt.state[w]["exp_avg"].dtype == np.float32


@pytest.mark.parametrize("name,kw", [CASES[4], CASES[11], CASES[13], CASES[16], CASES[21]])
@pytest.mark.parametrize("via_file", [False, True])
def test_state_dict_round_trip_continues_identically(name, kw, via_file, tmp_path):
    init, grads = _data(20)

    def build(values):
        ps = [sampan.tensor(a.copy(), requires_grad=True) for a in values]
        return ps, getattr(so, name)([{"params": ps[:1]}, {"params": ps[1:]}], **kw)

    ps, opt = build(init)
    for t in range(10):
        _feed(ps, grads[t], t, sampan.tensor)
        opt.step()
    sd = opt.state_dict()
    if via_file:
        sio.save(sd, tmp_path / "opt.ckpt")
        sd = sio.load(tmp_path / "opt.ckpt")
    ps2, opt2 = build([p.numpy() for p in ps])
    opt2.load_state_dict(sd)
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    for t in range(10, 20):
        for params, o in ((ps, opt), (ps2, opt2)):
            _feed(params, grads[t], t, sampan.tensor)
            o.step()
    for a, b in zip(ps, ps2):
        assert np.array_equal(a.numpy(), b.numpy())


def test_load_state_dict_mismatch_is_clear():
    a = sampan.zeros(2, requires_grad=True)
    sd = so.SGD([a], lr=0.1).state_dict()
    b = sampan.zeros(2, requires_grad=True)
    with pytest.raises(sampan.SampanValueError, match="group 0 has 1 parameters"):
        so.SGD([a, b], lr=0.1).load_state_dict(sd)


# ----------------------------------------------------------------- functional rules
def _functional_run(name, kw, steps=8):
    init, grads = _data(steps, seed=1)
    grads = [[g for g in gs] for gs in grads]
    eager = [sampan.tensor(a.copy(), requires_grad=True) for a in init]
    opt = getattr(so, name)(eager, **kw)
    pure = [sampan.tensor(a.copy()) for a in init]
    states = [None] * len(pure)
    for t in range(steps):
        for p, g in zip(eager, grads[t]):
            p.grad = sampan.tensor(g.copy())
        opt.step()
        for i, g in enumerate(grads[t]):
            pure[i], states[i] = _functional_step(name, kw, pure[i], sampan.tensor(g),
                                                  states[i], t + 1)
    for a, b in zip(eager, pure):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-14)


def _functional_step(name, kw, p, g, st, step):
    kw = dict(kw)
    z = sampan.zeros_like(p)
    if name == "SGD":
        p, buf = F.sgd_update(p, g, st, **kw)
        return p, buf
    if name in ("Adam", "AdamW"):
        b1, b2 = kw.pop("betas", (0.9, 0.999))
        if name == "AdamW":
            kw.setdefault("weight_decay", 0.01)
        st = st or (z, z, z)
        p, m, v, vmax = F.adam_update(p, g, st[0], st[1], step, beta1=b1, beta2=b2,
                                      max_exp_avg_sq=st[2], decoupled=name == "AdamW",
                                      **kw)
        return p, (m, v, vmax)
    if name == "Adagrad":
        init = kw.pop("initial_accumulator_value", 0.0)
        st = st if st is not None else sampan.full_like(p, init)
        return F.adagrad_update(p, g, st, step, **kw)
    st = st or (z, z, z)
    p, sq, ga, buf = F.rmsprop_update(p, g, st[0], st[1], st[2], **kw)
    return p, (sq, ga, buf)


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_functional_agrees_with_eager(name, kw):
    _functional_run(name, kw)


def test_functional_accepts_tensor_step():
    p = sampan.tensor(np.ones(3))
    g = sampan.tensor(np.full(3, 0.5))
    z = sampan.zeros_like(p)
    a = F.adam_update(p, g, z, z, 3, lr=0.1)[0]
    b = F.adam_update(p, g, z, z, sampan.tensor(3.0, dtype="float64"), lr=0.1)[0]
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-14)
