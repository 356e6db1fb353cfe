"""Learning-rate schedules against PyTorch's for 40 steps, and state_dict resume."""
import numpy as np
import pytest
import torch
from torch.optim import lr_scheduler as tls

import sampan
import sampan.io as sio
from sampan.optim import lr_scheduler as sls

STEPS = 40


def _opts(name="SGD", **kw):
    kw.setdefault("lr", 0.1)
    sp = [sampan.zeros(2, requires_grad=True), sampan.zeros(3, requires_grad=True)]
    tp = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    sgroups = [{"params": sp[:1]}, {"params": sp[1:], "lr": kw["lr"] * 3}]
    tgroups = [{"params": tp[:1]}, {"params": tp[1:], "lr": kw["lr"] * 3}]
    return (getattr(sampan.optim, name)(sgroups, **kw),
            getattr(torch.optim, name)(tgroups, **kw))


def _seq(opt, sched, steps=STEPS, momentum=None):
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in opt.param_groups])
        if momentum:
            out[-1] += [g[momentum][0] if momentum == "betas" else g[momentum]
                        for g in opt.param_groups]
        opt.step()
        sched.step()
    return np.array(out)


SCHEDULES = {
    "step": (lambda o: sls.StepLR(o, step_size=7, gamma=0.5),
             lambda o: tls.StepLR(o, step_size=7, gamma=0.5)),
    "multistep": (lambda o: sls.MultiStepLR(o, milestones=[20, 5, 12, 12], gamma=0.3),
                  lambda o: tls.MultiStepLR(o, milestones=[20, 5, 12, 12], gamma=0.3)),
    "exponential": (lambda o: sls.ExponentialLR(o, gamma=0.93),
                    lambda o: tls.ExponentialLR(o, gamma=0.93)),
    "cosine": (lambda o: sls.CosineAnnealingLR(o, T_max=15, eta_min=0.001),
               lambda o: tls.CosineAnnealingLR(o, T_max=15, eta_min=0.001)),
    "linear": (lambda o: sls.LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=17),
               lambda o: tls.LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=17)),
    "warmup_cosine": (
        lambda o: sls.LinearWarmup(o, 8, after=sls.CosineAnnealingLR(o, T_max=25),
                                   start_factor=0.1),
        lambda o: tls.SequentialLR(o, [tls.LinearLR(o, start_factor=0.1, total_iters=8),
                                       tls.CosineAnnealingLR(o, T_max=25)], milestones=[8])),
    "onecycle": (lambda o: sls.OneCycleLR(o, max_lr=[0.5, 1.0], total_steps=STEPS,
                                          cycle_momentum=False),
                 lambda o: tls.OneCycleLR(o, max_lr=[0.5, 1.0], total_steps=STEPS,
                                          cycle_momentum=False)),
    "onecycle_linear_3": (
        lambda o: sls.OneCycleLR(o, max_lr=0.4, total_steps=STEPS + 5, pct_start=0.25,
                                 anneal_strategy="linear", three_phase=True,
                                 cycle_momentum=False),
        lambda o: tls.OneCycleLR(o, max_lr=0.4, total_steps=STEPS + 5, pct_start=0.25,
                                 anneal_strategy="linear", three_phase=True,
                                 cycle_momentum=False)),
}


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_schedule_matches_torch(kind):
    so, to = _opts()
    mk_s, mk_t = SCHEDULES[kind]
    ss, ts = mk_s(so), mk_t(to)
    a, b = _seq(so, ss), _seq(to, ts)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(ss.get_last_lr(), ts.get_last_lr(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("opt_name,key", [("SGD", "momentum"), ("Adam", "betas")])
def test_onecycle_cycles_momentum_like_torch(opt_name, key):
    extra = {"momentum": 0.9} if opt_name == "SGD" else {}
    so, to = _opts(opt_name, **extra)
    ss = sls.OneCycleLR(so, max_lr=0.3, epochs=4, steps_per_epoch=10)
    ts = tls.OneCycleLR(to, max_lr=0.3, epochs=4, steps_per_epoch=10)
    np.testing.assert_allclose(_seq(so, ss, momentum=key), _seq(to, ts, momentum=key),
                               rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("kw", [{"mode": "min", "factor": 0.5, "patience": 2},
                                {"mode": "max", "factor": 0.3, "patience": 1, "cooldown": 2,
                                     "threshold": 0.05, "threshold_mode": "abs", "min_lr": 0.01}])
def test_reduce_on_plateau_matches_torch(kw):
    so, to = _opts()
    ss = sls.ReduceLROnPlateau(so, **kw)
    ts = tls.ReduceLROnPlateau(to, **kw)
    rng = np.random.default_rng(0)
    metrics = np.concatenate([np.linspace(1.0, 0.5, 8), 0.5 + 0.02 * rng.random(32)])
    a, b = [], []
    for m in metrics:
        so.step(), to.step()
        ss.step(m), ts.step(m)
        a.append([g["lr"] for g in so.param_groups])
        b.append([g["lr"] for g in to.param_groups])
    np.testing.assert_allclose(a, b, rtol=1e-12)
    assert a[-1] != a[0]  # it did cut the rate


@pytest.mark.parametrize("kind", ["cosine", "warmup_cosine", "onecycle", "multistep"])
def test_scheduler_state_dict_resume(kind, tmp_path):
    mk = SCHEDULES[kind][0]
    o1, _ = _opts()
    s1 = mk(o1)
    full = _seq(o1, s1, STEPS)
    o2, _ = _opts()
    s2 = mk(o2)
    head = _seq(o2, s2, 15)
    sio.save({"opt": o2.state_dict(), "sched": s2.state_dict()}, tmp_path / "s.ckpt")
    saved = sio.load(tmp_path / "s.ckpt")
    o3, _ = _opts()
    s3 = mk(o3)
    o3.load_state_dict(saved["opt"])
    s3.load_state_dict(saved["sched"])
    tail = _seq(o3, s3, STEPS - 15)
    assert np.array_equal(np.concatenate([head, tail]), full)


def test_onecycle_past_total_steps_raises():
    so, _ = _opts()
    s = sls.OneCycleLR(so, max_lr=0.1, total_steps=3, cycle_momentum=False)
    for _ in range(3):
        s.step()
    with pytest.raises(sampan.SampanValueError, match="past total_steps"):
        s.step()
