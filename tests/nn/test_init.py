"""Initialisers: distributions (moments and bounds on large samples with fixed seeds),
seeding through sampan.manual_seed / a Generator, and the default layer inits."""
import math

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.nn import init


def _t(*shape):
    return sampan.zeros(*shape)


def test_uniform_normal_constant():
    w = init.uniform_(_t(300, 300), -2.0, 3.0).numpy()
    assert w.min() >= -2.0 and w.max() < 3.0
    assert abs(w.mean() - 0.5) < 0.02 and abs(w.var() - 25 / 12) < 0.05
    w = init.normal_(_t(300, 300), 1.0, 2.0).numpy()
    assert abs(w.mean() - 1.0) < 0.02 and abs(w.std() - 2.0) < 0.02
    assert np.all(init.constant_(_t(3, 3), 0.5).numpy() == 0.5)
    assert np.all(init.ones_(_t(2)).numpy() == 1) and np.all(init.zeros_(sampan.ones(2))
                                                            .numpy() == 0)
    assert np.all(init.eye_(_t(3, 4)).numpy() == np.eye(3, 4))


def test_xavier_kaiming_scales():
    # 2-d weights are Linear weights (in, out): fan_in = shape[0]
    w = init.xavier_uniform_(_t(400, 200)).numpy()
    a = math.sqrt(6 / 600)
    assert np.abs(w).max() <= a and abs(w.std() - a / math.sqrt(3)) < 0.01 * a
    w = init.xavier_normal_(_t(400, 200), gain=2.0).numpy()
    assert abs(w.std() - 2 * math.sqrt(2 / 600)) < 0.01
    w = init.kaiming_uniform_(_t(400, 200), nonlinearity="relu").numpy()
    b = math.sqrt(2) * math.sqrt(3 / 400)
    assert np.abs(w).max() <= b and abs(w.std() - math.sqrt(2 / 400)) < 0.002
    w = init.kaiming_normal_(_t(400, 200), mode="fan_out", nonlinearity="relu").numpy()
    assert abs(w.std() - math.sqrt(2 / 200)) < 0.002
    # conv weights (out, in, kh, kw): fan_in = in * kh * kw
    assert init.fan_in_and_fan_out(_t(16, 6, 5, 5)) == (150, 400)
    assert init.calculate_gain("leaky_relu", 0.2) == pytest.approx(math.sqrt(2 / 1.04))
    with pytest.raises(sampan.SampanValueError, match="mode 'fan_mid'"):
        init.kaiming_normal_(_t(3, 3), mode="fan_mid")


def test_trunc_normal_and_orthogonal():
    w = init.trunc_normal_(_t(400, 400), mean=0.5, std=1.0, a=-0.5, b=1.0).numpy()
    assert w.min() >= -0.5 and w.max() <= 1.0
    from scipy.stats import truncnorm
    ref = truncnorm(-1.0, 0.5, loc=0.5, scale=1.0)
    assert abs(w.mean() - ref.mean()) < 0.01 and abs(w.std() - ref.std()) < 0.01
    w = init.trunc_normal_(_t(300, 300), std=0.02, a=-0.04, b=0.04).numpy()
    assert np.abs(w).max() <= 0.04 and abs(w.std() - truncnorm(-2, 2, scale=0.02).std()) < 1e-3
    q = init.orthogonal_(_t(6, 10)).numpy()
    np.testing.assert_allclose(q @ q.T, np.eye(6), atol=1e-5)
    q = init.orthogonal_(_t(10, 6), gain=2.0).numpy().astype(np.float64)
    np.testing.assert_allclose(q.T @ q, 4 * np.eye(6), atol=1e-5)


def test_seeding():
    sampan.manual_seed(7)
    a = init.normal_(_t(5, 5)).numpy().copy()
    b = init.normal_(_t(5, 5)).numpy().copy()
    sampan.manual_seed(7)
    np.testing.assert_array_equal(init.normal_(_t(5, 5)).numpy(), a)
    assert not np.array_equal(a, b)
    g1, g2 = sampan.Generator(3), sampan.Generator(3)
    np.testing.assert_array_equal(init.uniform_(_t(4), generator=g1).numpy(),
                                  init.uniform_(_t(4), generator=g2).numpy())
    sampan.manual_seed(1)
    m1 = nn.Linear(4, 3).weight.numpy().copy()
    sampan.manual_seed(1)
    np.testing.assert_array_equal(nn.Linear(4, 3).weight.numpy(), m1)


def test_init_is_not_recorded():
    p = nn.Parameter(sampan.zeros(3, 3))
    init.normal_(p)
    assert p.grad_fn is None and p.requires_grad


def test_default_layer_inits():
    fc = nn.Linear(100, 300)
    w = fc.weight.numpy()
    assert np.abs(w).max() <= 0.1 and abs(w.std() - 0.1 / math.sqrt(3)) < 0.003
    emb = nn.Embedding(300, 100)
    assert abs(emb.weight.numpy().std() - 1.0) < 0.02
