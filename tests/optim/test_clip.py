"""Gradient clipping against torch.nn.utils."""
import numpy as np
import pytest
import torch

import sampan
from sampan.optim import clip_grad_norm_, clip_grad_value_


def _pair(scale):
    rng = np.random.default_rng(0)
    gs = [rng.standard_normal(s) * scale for s in [(5, 4), (4,), (3, 3)]]
    sp, tp = [], []
    for g in gs:
        a = sampan.zeros(g.shape, dtype="float64", requires_grad=True)
        a.grad = sampan.tensor(g.copy())
        b = torch.zeros(g.shape, dtype=torch.float64, requires_grad=True)
        b.grad = torch.tensor(g.copy())
        sp.append(a)
        tp.append(b)
    sp.append(sampan.zeros(2, requires_grad=True))  # no grad: ignored
    return sp, tp


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("scale", [0.01, 10.0])
def test_clip_grad_norm_matches_torch(norm_type, scale):
    sp, tp = _pair(scale)
    a = clip_grad_norm_(sp, 1.5, norm_type=norm_type)
    b = torch.nn.utils.clip_grad_norm_(tp, 1.5, norm_type=norm_type)
    np.testing.assert_allclose(float(a), float(b), rtol=1e-12)
    for p, q in zip(sp, tp):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12)


def test_clip_grad_norm_nonfinite():
    w = sampan.zeros(2, requires_grad=True)
    w.grad = sampan.tensor([np.inf, 1.0])
    with pytest.raises(sampan.SampanValueError, match="non-finite"):
        clip_grad_norm_([w], 1.0, error_if_nonfinite=True)


def test_clip_grad_value_matches_torch():
    sp, tp = _pair(3.0)
    clip_grad_value_(sp, 0.7)
    torch.nn.utils.clip_grad_value_(tp, 0.7)
    for p, q in zip(sp, tp):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())


@pytest.mark.parametrize("how", [("norm", 2.0), ("norm", float("inf")), ("norm", 1.0),
                                 ("value", None)])
def test_clipping_inside_a_jitted_step_equals_eager(how):
    """Clipping between backward() and step() inside sampan.jit is traced with ops (it
    worked on the gradients' arrays with numpy and failed to trace)."""
    import sampan.nn.functional as F
    from sampan import nn
    from sampan.passes.manager import pipeline
    kind, order = how
    x = sampan.tensor(np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32))
    y = sampan.tensor(np.random.default_rng(2).standard_normal((16, 3)).astype(np.float32))

    def make():
        sampan.manual_seed(4)
        m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        opt = sampan.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(m(x), y) * 10
            loss.backward()
            if kind == "norm":
                total = sampan.optim.clip_grad_norm_(m.parameters(), 0.3, norm_type=order)
            else:
                sampan.optim.clip_grad_value_(m.parameters(), 0.05)
                total = loss
            opt.step()
            return loss, total
        return m, step

    m_e, step_e = make()
    m_j, step_j = make()
    unfused = [p for p in pipeline("train") if p != "fuse_elementwise"]
    step_j = sampan.jit(step_j, pipeline=unfused)
    for _ in range(4):
        le, ne = step_e(x, y)
        lj, nj = step_j(x, y)
        np.testing.assert_allclose(lj.item(), le.item(), rtol=1e-5)
        np.testing.assert_allclose(nj.item(), ne.item(), rtol=1e-5)
    for a, b in zip(m_e.parameters(), m_j.parameters()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    if kind == "norm":
        with pytest.raises(sampan.SampanValueError, match="error_if_nonfinite"):
            sampan.jit(lambda x: (m_j(x).sum().backward(), sampan.optim.clip_grad_norm_(
                m_j.parameters(), 1.0, error_if_nonfinite=True))[1])(x)


def test_clipping_takes_a_generator_of_parameters():
    """The parameters may be any iterable, read once (a generator was consumed by the
    traced-or-not check and then nothing was clipped)."""
    from sampan import nn
    m = nn.Linear(3, 2)
    (m(sampan.randn(4, 3)) ** 2).sum().backward()
    total = clip_grad_norm_((p for p in m.parameters()), 1e-3)
    norm = np.sqrt(sum((p.grad.numpy() ** 2).sum() for p in m.parameters()))
    assert total.item() > 1e-2 and norm == pytest.approx(1e-3, rel=1e-3)
    clip_grad_value_((p for p in m.parameters()), 1e-5)
    assert max(np.abs(p.grad.numpy()).max() for p in m.parameters()) <= 1e-5
