"""LambdaLR, MultiplicativeLR, ConstantLR, PolynomialLR, CyclicLR, CosineAnnealingWarmRestarts,
SequentialLR and ChainedScheduler against PyTorch's, and their state_dict resume."""
import numpy as np
import pytest
from test_lr_scheduler import _opts, _seq
from torch.optim import lr_scheduler as tls

import sampan
import sampan.io as sio
from sampan.optim import lr_scheduler as sls

STEPS = 36


class Warm:  # a callable object: its attributes are state, as in torch
    def __init__(self, n):
        self.n = n

    def __call__(self, t):
        return min(1.0, (t + 1) / self.n)


def both(make):
    return (lambda o: make(sls, o), lambda o: make(tls, o))


SCHEDULES = {
    "lambda": both(lambda m, o: m.LambdaLR(o, lr_lambda=lambda t: 0.9 ** t + 0.01 * t)),
    "lambda_per_group": both(lambda m, o: m.LambdaLR(o, lr_lambda=[Warm(6), lambda t: 0.97 ** t])),
    "multiplicative": both(lambda m, o: m.MultiplicativeLR(o, lr_lambda=lambda t: 0.95)),
    "multiplicative_t": both(lambda m, o: m.MultiplicativeLR(o, lr_lambda=lambda t: 1 - t / 80)),
    "constant": both(lambda m, o: m.ConstantLR(o, factor=0.4, total_iters=7)),
    "polynomial": both(lambda m, o: m.PolynomialLR(o, total_iters=25, power=2.0)),
    "polynomial_1": both(lambda m, o: m.PolynomialLR(o, total_iters=10)),
    "warm_restarts": both(lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=5, eta_min=0.001)),
    "warm_restarts_mult": both(lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2)),
    "cyclic_triangular": both(lambda m, o: m.CyclicLR(o, base_lr=0.01, max_lr=[0.1, 0.2],
                                                      step_size_up=4, cycle_momentum=False)),
    "cyclic_triangular2": both(lambda m, o: m.CyclicLR(o, base_lr=0.01, max_lr=0.1,
                                                       step_size_up=3, step_size_down=5,
                                                       mode="triangular2",
                                                       cycle_momentum=False)),
    "cyclic_exp_range": both(lambda m, o: m.CyclicLR(o, base_lr=[0.01, 0.02], max_lr=0.1,
                                                     step_size_up=5, mode="exp_range",
                                                     gamma=0.97, cycle_momentum=False)),
    "sequential": both(lambda m, o: m.SequentialLR(
        o, [m.ConstantLR(o, factor=0.2, total_iters=4), m.ExponentialLR(o, gamma=0.9),
            m.CosineAnnealingLR(o, T_max=8, eta_min=0.01)], milestones=[6, 20])),
    "sequential_linear_step": both(lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.1, total_iters=5), m.StepLR(o, 4, gamma=0.5)],
        milestones=[5])),
    "chained": both(lambda m, o: m.ChainedScheduler(
        [m.ConstantLR(o, factor=0.1, total_iters=3), m.ExponentialLR(o, gamma=0.9)])),
    "chained_cosine_floor": both(lambda m, o: m.ChainedScheduler(
        [m.ExponentialLR(o, gamma=0.97), m.CosineAnnealingLR(o, T_max=7, eta_min=0.01),
         m.PolynomialLR(o, total_iters=30, power=0.5)])),
    "chained_lambda_overrides": both(lambda m, o: m.ChainedScheduler(
        [m.StepLR(o, 3, gamma=0.5), m.LambdaLR(o, lambda t: 1 / (t + 1)),
         m.MultiplicativeLR(o, lambda t: 0.99)])),
    "sequential_multiplicative": both(lambda m, o: m.SequentialLR(
        o, [m.ExponentialLR(o, gamma=0.9), m.MultiplicativeLR(o, lambda t: 0.95 + 0.001 * t)],
        milestones=[5])),
    "chained_three": both(lambda m, o: m.ChainedScheduler(
        [m.LinearLR(o, start_factor=0.2, total_iters=6), m.StepLR(o, 5, gamma=0.7),
         m.MultiStepLR(o, [10, 17], gamma=0.5)])),
}


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_schedule_matches_torch(kind):
    so, to = _opts()
    mk_s, mk_t = SCHEDULES[kind]
    ss, ts = mk_s(so), mk_t(to)
    np.testing.assert_allclose(_seq(so, ss, STEPS), _seq(to, ts, STEPS), rtol=1e-10,
                               atol=1e-14)
    np.testing.assert_allclose(ss.get_last_lr(), ts.get_last_lr(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("opt_name,key,mode", [("SGD", "momentum", "triangular"),
                                               ("Adam", "betas", "exp_range")])
def test_cyclic_cycles_momentum_like_torch(opt_name, key, mode):
    extra = {"momentum": 0.9} if opt_name == "SGD" else {}
    so, to = _opts(opt_name, **extra)
    kw = {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 4, "mode": mode, "gamma": 0.95,
          "base_momentum": 0.7, "max_momentum": 0.95}
    ss, ts = sls.CyclicLR(so, **kw), tls.CyclicLR(to, **kw)
    np.testing.assert_allclose(_seq(so, ss, STEPS, momentum=key),
                               _seq(to, ts, STEPS, momentum=key), rtol=1e-10, atol=1e-14)


def test_warm_restarts_fractional_epochs_match_torch():
    for t_mult in (1, 2):
        so, to = _opts()
        ss = sls.CosineAnnealingWarmRestarts(so, T_0=3, T_mult=t_mult, eta_min=0.002)
        ts = tls.CosineAnnealingWarmRestarts(to, T_0=3, T_mult=t_mult, eta_min=0.002)
        a, b = [], []
        for epoch in range(12):
            for i in range(4):
                e = epoch + i / 4
                ss.step(e), ts.step(e)
                a.append(ss.get_last_lr())
                b.append(ts.get_last_lr())
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
        assert ss.last_epoch == ts.last_epoch


@pytest.mark.parametrize("kind", ["lambda_per_group", "multiplicative", "warm_restarts_mult",
                                  "cyclic_triangular2", "sequential", "chained_three",
                                  "chained_cosine_floor", "sequential_multiplicative"])
def test_state_dict_resume(kind, tmp_path):
    mk = SCHEDULES[kind][0]
    o1, _ = _opts()
    full = _seq(o1, mk(o1), STEPS)
    o2, _ = _opts()
    s2 = mk(o2)
    head = _seq(o2, s2, 13)
    sio.save({"opt": o2.state_dict(), "sched": s2.state_dict()}, tmp_path / "s.ckpt")
    saved = sio.load(tmp_path / "s.ckpt")
    o3, _ = _opts()
    s3 = mk(o3)
    o3.load_state_dict(saved["opt"])
    s3.load_state_dict(saved["sched"])
    tail = _seq(o3, s3, STEPS - 13)
    np.testing.assert_allclose(np.concatenate([head, tail]), full, rtol=1e-15)


def test_callable_object_state_round_trips_but_functions_do_not_travel():
    so, _ = _opts()
    s = sls.LambdaLR(so, lr_lambda=[Warm(6), lambda t: 1.0])
    sd = s.state_dict()
    assert sd["lr_lambdas"] == [{"n": 6}, None]
    fresh = Warm(99)
    s2 = sls.LambdaLR(_opts()[0], lr_lambda=[fresh, lambda t: 1.0])
    s2.load_state_dict(sd)
    assert fresh.n == 6


def test_composites_check_their_schedulers():
    so, _ = _opts()
    other, _ = _opts()
    with pytest.raises(sampan.SampanValueError, match="milestone"):
        sls.SequentialLR(so, [sls.StepLR(so, 3)], milestones=[2])
    with pytest.raises(sampan.SampanValueError, match="another optimiser"):
        sls.ChainedScheduler([sls.StepLR(so, 3), sls.StepLR(other, 3)])
    with pytest.raises(sampan.SampanValueError, match="ReduceLROnPlateau"):
        sls.SequentialLR(so, [sls.StepLR(so, 3), sls.ReduceLROnPlateau(so)], milestones=[2])
    with pytest.raises(sampan.SampanValueError, match="mode"):
        sls.CyclicLR(so, 0.1, 1.0, mode="sawtooth", cycle_momentum=False)
