"""sampan.jit: whole training steps, state write-back, caching, errors."""
import warnings

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.tensor import Tensor


def _data(seed, n=16, d=6, k=3):
    r = np.random.default_rng(seed)
    return (Tensor(r.standard_normal((n, d)).astype(np.float32)),
            Tensor(r.standard_normal((n, k)).astype(np.float32)))


def _mlp():
    sampan.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _sgd_step(model, x, y, lr=0.05):
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    with sampan.no_grad():
        for p in model.parameters():
            p.sub_(p.grad * lr)
    for p in model.parameters():
        p.grad = None
    return loss


def test_mlp_training_50_steps_matches_eager():
    x, y = _data(0)
    eager_m, jit_m = _mlp(), _mlp()
    step = sampan.jit(lambda x, y: _sgd_step(jit_m, x, y))
    for i in range(50):
        le = _sgd_step(eager_m, x, y)
        lj = step(x, y)
        np.testing.assert_allclose(lj.numpy(), le.numpy(), rtol=1e-5, err_msg=f"step {i}")
    for (n, a), (_, b) in zip(eager_m.named_parameters(), jit_m.named_parameters()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6, err_msg=n)
        assert b.grad is None
    assert step.n_traces == 1
    assert "matmul" in str(step.graph) and "def " in step.code
    assert [n for n, _ in step.pass_timings] == sampan.passes.pipeline("train")


def _lstm_params(seed):
    r = np.random.default_rng(seed)
    d, h = 4, 8
    return {"wx": Tensor(r.standard_normal((d, 4 * h)).astype(np.float32) * 0.3,
                         requires_grad=True),
            "wh": Tensor(r.standard_normal((h, 4 * h)).astype(np.float32) * 0.3,
                         requires_grad=True),
            "b": Tensor(np.zeros(4 * h, np.float32), requires_grad=True),
            "wy": Tensor(r.standard_normal((h, 2)).astype(np.float32) * 0.3,
                         requires_grad=True)}


def _lstm_step(P, mom, xs, y, lr=0.1, beta=0.9):
    hdim = P["wh"].shape[0]
    h = sampan.zeros(xs.shape[1], hdim)
    c = sampan.zeros(xs.shape[1], hdim)
    for t in range(xs.shape[0]):
        z = xs[t] @ P["wx"] + h @ P["wh"] + P["b"]
        i, f, g, o = z.split(hdim, axis=1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
    loss = ((h @ P["wy"] - y) ** 2).mean()
    loss.backward()
    with sampan.no_grad():  # SGD with momentum: the buffers are state mutated in place
        for k, p in P.items():
            mom[k].mul_(beta).add_(p.grad)
            p.sub_(mom[k] * lr)
    for p in P.values():
        p.grad = None
    return loss


def test_lstm_like_recurrence_50_steps_matches_eager():
    r = np.random.default_rng(3)
    xs = Tensor(r.standard_normal((5, 6, 4)).astype(np.float32))
    y = Tensor(r.standard_normal((6, 2)).astype(np.float32))
    Pe, Pj = _lstm_params(1), _lstm_params(1)
    me = {k: sampan.zeros(*p.shape) for k, p in Pe.items()}
    mj = {k: sampan.zeros(*p.shape) for k, p in Pj.items()}
    step = sampan.jit(lambda xs, y: _lstm_step(Pj, mj, xs, y))
    for i in range(50):
        le = _lstm_step(Pe, me, xs, y)
        lj = step(xs, y)
        np.testing.assert_allclose(lj.numpy(), le.numpy(), rtol=1e-5, err_msg=f"step {i}")
    for k in Pe:
        np.testing.assert_allclose(Pj[k].numpy(), Pe[k].numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(mj[k].numpy(), me[k].numpy(), rtol=1e-4, atol=1e-6)
    g = step.graph
    assert sampan.ir.parse(str(g), {c.name: c.const for c in g.consts}) == g


def test_functional_optimizer_update_inside_jit():
    from sampan.optim import functional as F
    x, y = _data(1)
    m1, m2 = _mlp(), _mlp()

    def step(model, x, y):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        with sampan.no_grad():
            for p in model.parameters():
                new, _ = F.sgd_update(p, p.grad, None, lr=0.1)
                p.copy_(new)
        for p in model.parameters():
            p.grad = None
        return loss
    js = sampan.jit(lambda x, y: step(m2, x, y))
    for _ in range(5):
        np.testing.assert_allclose(js(x, y).numpy(), step(m1, x, y).numpy(), rtol=1e-5)


def test_raw_numpy_update_inside_jit_gives_clear_error():
    x, y = _data(2)
    m = _mlp()

    def step(x, y):
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        for p in m.parameters():
            np.subtract(p._data, p.grad._data, out=p._data)
            p.grad = None
        return loss
    with pytest.raises(sampan.jit.TracingError, match="numpy was called on a traced value"):
        sampan.jit(step)(x, y)
    # the failed trace left the model intact: eager still works
    assert isinstance(m[0].weight._data, np.ndarray)
    step(x, y)


def test_layer_jit_and_interleaving_with_eager():
    m = _mlp()
    jm = sampan.jit(m)
    x, _ = _data(4)
    np.testing.assert_allclose(jm(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    with sampan.no_grad():
        m[0].weight.mul_(2.0)          # eager change is seen by the next jit call
    np.testing.assert_allclose(jm(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    assert "'0.weight'" in str(jm.graph)


def test_dropout_random_state_threads_through():
    x = sampan.ones(4, 5)

    def f(x):
        return sampan.dropout(x, 0.5) + sampan.rand(4, 5)
    sampan.manual_seed(7)
    e = [f(x).numpy() for _ in range(3)]
    c_e = sampan.default_generator.counter
    sampan.manual_seed(7)
    jf = sampan.jit(f)
    j = [jf(x).numpy() for _ in range(3)]
    for a, b in zip(e, j):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(j[0], j[1])
    assert sampan.default_generator.counter == c_e


def test_cache_and_retrace_warning_names_argument():
    f = sampan.jit(lambda x, scale: x * scale)
    x = sampan.ones(3)
    f(x, 1.0)
    f(x, 1.0)
    assert f.n_traces == 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for s in (2.0, 3.0, 4.0):
            f(x, s)
    msgs = [str(m.message) for m in w if issubclass(m.category, sampan.jit.RetraceWarning)]
    assert msgs and "'scale'" in msgs[-1] and "3.0" in msgs[-1] and "4.0" in msgs[-1]
    np.testing.assert_array_equal(f(x, 4.0).numpy(), [4, 4, 4])


def test_data_dependent_control_flow_error_names_line():
    def f(x):
        if x.sum() > 0:  # the offending line
            return x
        return -x
    with pytest.raises(sampan.jit.TracingError) as e:
        sampan.jit(f)(sampan.ones(3))
    msg = str(e.value)
    assert "if x.sum() > 0:" in msg and "test_jit.py" in msg
    assert "sampan.where" in msg and "static" in msg and "eager" in msg
    with pytest.raises(sampan.jit.TracingError, match="float"):
        sampan.jit(lambda x: float(x.sum()))(sampan.ones(3))


def test_shape_error_in_jit_names_user_line():
    with pytest.raises(sampan.ShapeError) as e:
        sampan.jit(lambda a, b: a @ b)(sampan.ones(2, 3), sampan.ones(2, 3))
    assert "matmul" in str(e.value) and "test_jit.py" in str(e.value)
