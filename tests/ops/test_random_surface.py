"""The PyTorch random surface: in-place fills, bernoulli, multinomial and rng state. sampan's
streams are its own (keyed Philox), so distributions are checked with fixed seeds and loose
statistical bounds, and state restores by replaying exactly the same numbers."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.errors import SampanError

N = 20000


def setup_function(_):
    sampan.manual_seed(17)


def test_inplace_fills_keep_shape_and_dtype():
    x = sampan.zeros((N,))
    assert x.uniform_(2.0, 5.0) is x
    a = x.numpy()
    assert a.dtype == np.float32 and 2 <= a.min() and a.max() < 5 and abs(a.mean() - 3.5) < 0.03
    a = x.normal_(1.0, 2.0).numpy()
    assert abs(a.mean() - 1) < 0.06 and abs(a.std() - 2) < 0.06
    a = x.exponential_(4.0).numpy()
    assert a.min() >= 0 and abs(a.mean() - 0.25) < 0.01
    a = x.bernoulli_(0.3).numpy()
    assert set(np.unique(a)) == {0.0, 1.0} and abs(a.mean() - 0.3) < 0.015
    p = sampan.tensor(np.array([0.0, 1.0, 0.5], dtype=np.float32))
    a = sampan.zeros((N, 3), dtype="float64").bernoulli_(p).numpy()
    assert a.dtype == np.float64 and a[:, 0].sum() == 0 and a[:, 1].all()
    assert abs(a[:, 2].mean() - 0.5) < 0.02
    a = x.random_(3, 7).numpy()
    assert set(np.unique(a)) == {3.0, 4.0, 5.0, 6.0}
    i = sampan.zeros((N,), dtype="int64").random_(5).numpy()
    assert i.dtype == np.int64 and set(np.unique(i)) == set(range(5))
    assert sampan.zeros((100,), dtype="int64").random_().numpy().min() >= 0


def test_fill_errors():
    with pytest.raises(SampanError, match="uniform_"):
        sampan.zeros((3,), dtype="int64").uniform_()
    with pytest.raises(SampanError, match="bernoulli_"):
        sampan.zeros((3,)).bernoulli_(1.5)
    with pytest.raises(SampanError, match="exponential_"):
        sampan.zeros((3,)).exponential_(0.0)
    with pytest.raises(SampanError, match="random_"):
        sampan.zeros((3,)).random_(5, 2)


def test_bernoulli():
    p = sampan.full((N,), 0.2)
    b = sampan.bernoulli(p)
    assert b.dtype == p.dtype and b.shape == (N,) and abs(b.numpy().mean() - 0.2) < 0.015
    assert abs(sampan.bernoulli(p, 0.7).numpy().mean() - 0.7) < 0.015
    g1, g2 = sampan.Generator(5), sampan.Generator(5)
    np.testing.assert_array_equal(sampan.bernoulli(p, generator=g1).numpy(),
                                  sampan.bernoulli(p, generator=g2).numpy())
    with pytest.raises(SampanError, match="bernoulli"):
        sampan.bernoulli(sampan.tensor(np.array([-0.1, 0.5])))


def test_multinomial_with_replacement_frequencies():
    w = sampan.tensor(np.array([1.0, 0.0, 3.0, 4.0], dtype=np.float32))
    s = sampan.multinomial(w, N, replacement=True)
    assert s.dtype == np.int64 and s.shape == (N,)
    freq = np.bincount(s.numpy(), minlength=4) / N
    np.testing.assert_allclose(freq, [0.125, 0.0, 0.375, 0.5], atol=0.015)
    s2 = sampan.multinomial(sampan.tensor(np.array([[1.0, 1.0], [0.0, 2.0]])), 7, True)
    assert s2.shape == (2, 7) and (s2.numpy()[1] == 1).all()


def test_multinomial_without_replacement():
    w = sampan.tensor(np.array([[1.0, 2.0, 0.0, 5.0], [3.0, 3.0, 3.0, 0.0]]))
    s = sampan.multinomial(w, 3)
    assert s.shape == (2, 3) and s.dtype == np.int64
    for row, bad in zip(s.numpy(), (2, 3)):
        assert len(set(row)) == 3 and bad not in row
    # the first draw without replacement follows the weights
    rows = sampan.tensor(np.tile(np.array([1.0, 2.0, 0.0, 5.0]), (3000, 1)))
    firsts = sampan.multinomial(rows, 1).numpy()[:, 0]
    np.testing.assert_allclose(np.bincount(firsts, minlength=4) / 3000, [1 / 8, 2 / 8, 0, 5 / 8],
                               atol=0.03)


@pytest.mark.parametrize("probs,n,repl", [([0.5, -0.1], 1, True), ([0.0, 0.0], 1, True),
                                          ([1.0, np.nan], 1, True), ([1.0, 0.0, 2.0], 3, False),
                                          ([1.0, 2.0], 0, True), ([[[1.0]]], 1, True)])
def test_multinomial_errors(probs, n, repl):
    with pytest.raises(SampanError, match="multinomial"):
        sampan.multinomial(sampan.tensor(np.array(probs)), n, replacement=repl)


def test_rng_state_replays():
    sampan.rand(3)
    state = sampan.get_rng_state()
    assert state.dtype == np.int64 and state.shape == (2,)
    a = [sampan.rand(4).numpy(), sampan.randn(2).numpy(),
         sampan.multinomial(sampan.ones((5,)), 2).numpy(), sampan.zeros((3,)).normal_().numpy()]
    sampan.set_rng_state(state)
    b = [sampan.rand(4).numpy(), sampan.randn(2).numpy(),
         sampan.multinomial(sampan.ones((5,)), 2).numpy(), sampan.zeros((3,)).normal_().numpy()]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    g = sampan.Generator(3)
    sampan.rand(2, generator=g)
    st = g.get_state()
    x = sampan.rand(5, generator=g).numpy()
    assert not np.array_equal(x, sampan.rand(5, generator=g).numpy())
    g.set_state(st)
    np.testing.assert_array_equal(x, sampan.rand(5, generator=g).numpy())
    with pytest.raises(SampanError, match="set_rng_state"):
        sampan.set_rng_state(sampan.zeros((3,)))


def test_seeds():
    sampan.manual_seed(1234)
    assert sampan.initial_seed() == 1234 and sampan.default_generator.initial_seed() == 1234
    s = sampan.seed()
    assert isinstance(s, int) and s >= 0 and sampan.initial_seed() == s
    a = sampan.rand(3).numpy()
    sampan.manual_seed(s)
    np.testing.assert_array_equal(a, sampan.rand(3).numpy())


def test_poisson():
    rates = sampan.tensor(np.repeat(np.array([[0.0, 0.5, 4.0, 30.0]], np.float32), 5000, 0))
    c = sampan.poisson(rates)
    assert c.dtype == np.float32 and c.shape == (5000, 4)
    np.testing.assert_allclose(c.numpy().mean(0), [0.0, 0.5, 4.0, 30.0], rtol=0.05, atol=0.02)
    np.testing.assert_allclose(c.numpy().var(0), [0.0, 0.5, 4.0, 30.0], rtol=0.1, atol=0.02)
    s = sampan.get_rng_state()
    a = sampan.poisson(rates[:3]).numpy()
    sampan.set_rng_state(s)
    np.testing.assert_array_equal(a, sampan.poisson(rates[:3]).numpy())
    with pytest.raises(SampanError, match="poisson"):
        sampan.poisson(sampan.tensor(np.array([-1.0])))


def test_traced_draws_advance_and_replay():
    def f(p):
        return sampan.bernoulli(p) + sampan.multinomial(p + 0.1, 2).float().sum() + \
            sampan.poisson(p * 3)
    j = sampan.jit(f)
    p = sampan.full((4,), 0.5)
    sampan.manual_seed(0)
    a, b = j(p).numpy(), j(p).numpy()
    assert not np.array_equal(a, b)
    sampan.manual_seed(0)
    np.testing.assert_array_equal(j(p).numpy(), a)
    sampan.manual_seed(0)
    np.testing.assert_array_equal(f(p).numpy(), a)     # eager draws the same numbers
    with sampan.no_grad():
        w = sampan.zeros((3,), requires_grad=True)
        w.uniform_(-1, 1)
    assert w.requires_grad and (np.abs(w.numpy()) < 1).all() and w.numpy().any()
