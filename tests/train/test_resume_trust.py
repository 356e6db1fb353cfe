"""Resuming can be trusted: damaged checkpoints, killed writes, optimiser states that do not fit."""
import numpy as np
import pytest
import torch

import sampan
from sampan.errors import DTypeError, SampanValueError, ShapeError
from sampan.io import load
from sampan.optim import SGD, Adam


# ----------------------------------------------------------------- optimiser states
def _adam_pair(shapes, steps=3, dtype=np.float32):
    """A sampan Adam and a torch Adam on the same parameters, stepped on the same grads."""
    rng = np.random.default_rng(1)
    init = [rng.standard_normal(s).astype(dtype) for s in shapes]
    ps = [sampan.tensor(a.copy(), requires_grad=True) for a in init]
    tps = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    opt, topt = Adam(ps, lr=0.05), torch.optim.Adam(tps, lr=0.05)
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(8)]

    def step(k):
        for p, tp, g in zip(ps, tps, grads[k]):
            p.grad = sampan.tensor(g.copy())
            tp.grad = torch.tensor(g.copy())
        opt.step()
        topt.step()

    for k in range(steps):
        step(k)
    return ps, tps, opt, step


def _state_copy(opt):
    sd = opt.state_dict()
    return {i: {k: (v.numpy().copy() if hasattr(v, "numpy") else v) for k, v in s.items()}
            for i, s in sd["state"].items()}, sd["param_groups"]


def _bad_states(shapes):
    """(description, state_dict, error class, message pieces) for states that do not fit."""
    donor_ps, _, donor, _ = _adam_pair(shapes)
    good = donor.state_dict()

    def edit(fn):
        sd = {"state": {i: dict(s) for i, s in good["state"].items()},
              "param_groups": [dict(g) for g in good["param_groups"]]}
        fn(sd)
        return sd

    def transpose_slot(sd):  # same size, wrong shape: used to be reshaped silently
        sd["state"][1]["exp_avg_sq"] = sampan.tensor(good["state"][1]["exp_avg_sq"].numpy().T
                                                     .copy())

    def f64_slot(sd):  # used to be cast silently
        sd["state"][1]["exp_avg"] = sampan.tensor(good["state"][1]["exp_avg"].numpy()
                                                  .astype(np.float64))

    def missing_slot(sd):
        del sd["state"][1]["exp_avg_sq"]

    def foreign_param(sd):  # state for a parameter that no group holds
        sd["state"][7] = sd["state"].pop(1)

    def bad_step(sd):
        sd["state"][1]["step"] = -2

    def bad_lr(sd):
        sd["param_groups"][0]["lr"] = -1.0

    return [
        ("shape", edit(transpose_slot), ShapeError,
         ["parameter 1 (shape (4, 3), float32)", "slot 'exp_avg_sq' of shape (3, 4)",
          "expected shape (4, 3)"]),
        ("dtype", edit(f64_slot), DTypeError,
         ["parameter 1 (shape (4, 3), float32)", "slot 'exp_avg' of dtype float64",
          "expected float32"]),
        ("slots", edit(missing_slot), SampanValueError,
         ["slots ['exp_avg', 'step'] for parameter 1", "['exp_avg', 'exp_avg_sq', 'step']"]),
        ("index", edit(foreign_param), SampanValueError,
         ["a state for parameter 7, which no group holds", "expected parameters numbered [0, 1]"]),
        ("step", edit(bad_step), SampanValueError, ["step -2 for parameter 1"]),
        ("hyper", edit(bad_lr), SampanValueError,
         ["hyperparameters in group 0 of the state", "invalid learning rate -1.0"]),
    ]


SHAPES = [(3,), (4, 3)]


@pytest.mark.parametrize("case", range(6),
                         ids=["shape", "dtype", "slots", "index", "step", "hyper"])
def test_optimizer_refuses_a_state_that_does_not_fit_and_loses_nothing(case):
    _, bad, cls, pieces = _bad_states(SHAPES)[case]
    ps, tps, opt, step = _adam_pair(SHAPES)
    before_state, before_groups = _state_copy(opt)
    with pytest.raises(cls) as info:
        opt.load_state_dict(bad)
    msg = str(info.value)
    assert msg.startswith("Adam.load_state_dict: ")
    for piece in pieces:
        assert piece in msg, msg
    # unchanged: same state, and training goes on exactly as torch's Adam does
    after_state, after_groups = _state_copy(opt)
    assert after_groups == before_groups
    assert after_state.keys() == before_state.keys()
    for i in before_state:
        for k, v in before_state[i].items():
            np.testing.assert_array_equal(after_state[i][k], v)
    for k in range(3, 6):
        step(k)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_optimizer_refuses_a_state_for_other_parameters():
    # the same number of parameters, but shaped otherwise (another model)
    _, _, donor, _ = _adam_pair([(3,), (2, 6)])
    _, _, opt, _ = _adam_pair(SHAPES)
    with pytest.raises(ShapeError, match=r"slot 'exp_avg' of shape \(2, 6\) for parameter 1 "
                                         r"\(shape \(4, 3\), float32\); expected shape \(4, 3\)"):
        opt.load_state_dict(donor.state_dict())
    # another number of parameters
    _, _, donor3, _ = _adam_pair([(3,), (4, 3), (2,)])
    with pytest.raises(SampanValueError, match="got a state whose group 0 has 3 parameters; expected 2"):
        opt.load_state_dict(donor3.state_dict())
    # another optimiser's state
    sgd = SGD([sampan.zeros(3, requires_grad=True), sampan.zeros((4, 3), requires_grad=True)],
              lr=0.1, momentum=0.9)
    with pytest.raises(SampanValueError, match=r"slots \['exp_avg', 'exp_avg_sq', 'step'\] "
                                               r"for parameter 0 .*\['momentum_buffer'\]"):
        sgd.load_state_dict(donor.state_dict())
    assert sgd.state == {}


def test_optimizer_state_that_fits_still_loads_through_a_file(tmp_path):
    ps, tps, opt, step = _adam_pair(SHAPES)
    sampan.save(opt.state_dict(), tmp_path / "opt.sampan")
    ps2 = [sampan.tensor(p.numpy().copy(), requires_grad=True) for p in ps]
    opt2 = Adam(ps2, lr=0.05)
    opt2.load_state_dict(load(tmp_path / "opt.sampan"))
    assert opt2.state[ps2[1]]["step"] == 3
    assert opt2.state[ps2[1]]["exp_avg"].dtype == np.float32
