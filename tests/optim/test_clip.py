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
