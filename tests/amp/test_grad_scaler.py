"""GradScaler against torch.amp.GradScaler on one loss sequence with injected inf/NaN
steps: the same scales, the same skipped steps, the same parameters and state dicts."""
import numpy as np
import pytest

import sampan
from sampan.amp import GradScaler
from sampan.amp.grad_scaler import GradScalerError

# loss multipliers per step: inf/nan steps must be skipped and back the scale off
FACTORS = [1.0, 1.0, np.inf, 1.0, 1.0, 1.0, 1.0, np.nan, 1.0, 1.0, 1.0, 1.0, 1.0, np.inf,
           np.inf, 1.0, 1.0, 1.0, 1.0]
KW = dict(init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)


def _run_sampan(w0):
    w = sampan.tensor(w0.copy(), requires_grad=True)
    opt = sampan.optim.SGD([w], lr=0.1)
    s = GradScaler(**KW)
    scales, stepped = [], []
    for f in FACTORS:
        opt.zero_grad()
        loss = (w * w).sum() * float(f)
        s.scale(loss).backward()
        before = w.numpy().copy()
        s.step(opt)
        s.update()
        stepped.append(not np.array_equal(before, w.numpy()))
        scales.append(s.get_scale())
    return scales, stepped, w.numpy(), s.state_dict()


class _TorchSGD:
    """Plain SGD, p -= lr * grad, for torch's GradScaler (which reads param_groups and
    calls step): importing torch.optim costs ~4 s of the test budget here."""

    def __init__(self, torch, params, lr):
        self.torch, self.param_groups, self.lr = torch, [{"params": params}], lr

    def step(self):
        with self.torch.no_grad():
            for p in self.param_groups[0]["params"]:
                p -= self.lr * p.grad


def _run_torch(w0):
    torch = pytest.importorskip("torch")
    w = torch.tensor(w0.copy(), requires_grad=True)
    opt = _TorchSGD(torch, [w], lr=0.1)
    s = torch.amp.GradScaler("cpu", **KW)
    scales, stepped = [], []
    for f in FACTORS:
        w.grad = None
        loss = (w * w).sum() * float(f)
        s.scale(loss).backward()
        before = w.detach().numpy().copy()
        s.step(opt)
        s.update()
        stepped.append(not np.array_equal(before, w.detach().numpy()))
        scales.append(s.get_scale())
    return scales, stepped, w.detach().numpy(), s.state_dict()


def test_same_scales_and_skipped_steps_as_torch():
    w0 = np.random.default_rng(0).standard_normal(5).astype(np.float32)
    ours, theirs = _run_sampan(w0), _run_torch(w0)
    assert ours[0] == theirs[0]                 # scale after every update
    assert ours[1] == theirs[1]                 # which steps ran
    assert ours[1].count(False) == 4
    np.testing.assert_allclose(ours[2], theirs[2], rtol=1e-6)
    assert ours[3] == {k: (v if k != "scale" else float(v)) for k, v in theirs[3].items()}


def test_state_dict_round_trip_and_from_torch():
    torch = pytest.importorskip("torch")
    t = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=7)
    s = GradScaler(init_scale=2.0)
    s.load_state_dict(t.state_dict())
    assert s.get_scale() == 64.0 and s.get_growth_interval() == 7
    s2 = GradScaler()
    s2.load_state_dict(s.state_dict())
    assert s2.state_dict() == s.state_dict()
    with pytest.raises(GradScalerError, match="empty"):
        s2.load_state_dict({})
    assert GradScaler(enabled=False).state_dict() == {}


def test_order_errors_and_disabled():
    w = sampan.tensor(np.ones(3, np.float32), requires_grad=True)
    opt = sampan.optim.SGD([w], lr=0.1)
    s = GradScaler()
    with pytest.raises(GradScalerError, match="scale"):
        s.step(opt)
    s.scale((w * w).sum()).backward()
    s.unscale_(opt)
    np.testing.assert_allclose(w.grad.numpy(), 2.0)   # unscaled
    with pytest.raises(GradScalerError, match="already"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(GradScalerError, match="already"):
        s.step(opt)
    s.update()
    off = GradScaler(enabled=False)
    loss = (w * w).sum()
    assert off.scale(loss) is loss and off.get_scale() == 1.0
    with pytest.raises(sampan.errors.SampanValueError):
        GradScaler(growth_factor=0.5)
