"""NAdam, RAdam, Adamax, Adadelta, ASGD, Rprop, LBFGS and SparseAdam against PyTorch's."""
import numpy as np
import pytest
import torch
from test_optimizers import _data, _feed, _run_both

import sampan
import sampan.optim as so

CASES = [
    ("NAdam", {}),
    ("NAdam", {"lr": 0.01, "momentum_decay": 0.01, "weight_decay": 0.1}),
    ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True,
               "maximize": True}),
    ("RAdam", {"lr": 0.01}),
    ("RAdam", {"lr": 0.01, "betas": (0.8, 0.9), "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True,
               "maximize": True}),
    ("Adamax", {}),
    ("Adamax", {"lr": 0.01, "betas": (0.8, 0.95), "weight_decay": 0.1, "maximize": True}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1, "maximize": True}),
    ("ASGD", {}),
    ("ASGD", {"lr": 0.05, "lambd": 0.01, "alpha": 0.5, "t0": 5, "weight_decay": 0.1}),
    ("ASGD", {"lr": 0.05, "t0": 3, "maximize": True}),
    ("Rprop", {}),
    ("Rprop", {"lr": 0.05, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.2), "maximize": True}),
]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


def _close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=kw.get("rtol", 1e-10), atol=kw.get("atol", 1e-12))


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_matches_torch(name, kw):
    sp, tp, sopt, topt = _run_both(name, kw)
    for a, b in zip(sp, tp):
        _close(a.numpy(), b.detach().numpy())
    sstate, tstate = sopt.state_dict()["state"], topt.state_dict()["state"]
    assert sorted(sstate) == sorted(tstate)
    for idx, ts in tstate.items():
        assert set(sstate[idx]) == set(ts)
        for key, tv in ts.items():
            sv = sstate[idx][key]
            sv = sv.numpy() if isinstance(sv, sampan.Tensor) else sv
            _close(sv, tv.numpy() if isinstance(tv, torch.Tensor) else tv)


@pytest.mark.parametrize("name,kw", [CASES[2], CASES[5], CASES[7], CASES[9], CASES[11],
                                     CASES[14]], ids=["NAdam", "RAdam", "Adamax", "Adadelta",
                                                      "ASGD", "Rprop"])
def test_state_dict_round_trip_continues_identically(name, kw):
    init, grads = _data(12)

    def build(values):
        ps = [sampan.tensor(a.copy(), requires_grad=True) for a in values]
        return ps, getattr(so, name)([{"params": ps[:1]}, {"params": ps[1:]}], **kw)

    ps, opt = build(init)
    for t in range(6):
        _feed(ps, grads[t], t, sampan.tensor)
        opt.step()
    ps2, opt2 = build([p.numpy() for p in ps])
    opt2.load_state_dict(opt.state_dict())
    for t in range(6, 12):
        for params, o in ((ps, opt), (ps2, opt2)):
            _feed(params, grads[t], t, sampan.tensor)
            o.step()
    for a, b in zip(ps, ps2):
        assert np.array_equal(a.numpy(), b.numpy())


def test_float32_params_stay_float32():
    for name, kw in CASES[::3]:
        w = sampan.ones(4, requires_grad=True)
        opt = getattr(so, name)([w], **kw)
        (w * w).sum().backward()
        opt.step()
        assert w.dtype == np.float32, name


def test_bad_hyperparameters_name_the_argument():
    w = sampan.zeros(2, requires_grad=True)
    with pytest.raises(sampan.SampanValueError, match="beta1"):
        so.NAdam([w], betas=(1.0, 0.9))
    with pytest.raises(sampan.SampanValueError, match="rho"):
        so.Adadelta([w], rho=1.5)
    with pytest.raises(sampan.SampanValueError, match="etas"):
        so.Rprop([w], etas=(1.5, 1.2))
