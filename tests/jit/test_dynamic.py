"""Symbolic batch (and sequence) dims: one traced program, and one saved program, for every
size of the marked dims, checked against eager at sizes other than the traced ones."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.jit.dynamic import DynamicShapeError


def _mlp():
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    m.eval()
    return m


def test_layer_traces_once_for_every_batch_size():
    m = _mlp()
    f = sampan.jit(m, pipeline="inference", dynamic={"x": {0: "batch"}})
    with sampan.no_grad():
        for b in (5, 7, 1, 32, 5):
            x = sampan.randn(b, 4)
            np.testing.assert_allclose(f(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    assert f.n_traces == 1
    assert f.graph.inputs[0].shape == ("batch", 4)
    assert "f32[batch,3]" in str(f.graph)
    # each concrete size compiled once and cached
    assert sorted(n for ((_, n),) in f._last.compiled.cache) == [1, 5, 7, 32]


def test_flattened_batch_fills_and_sizes_as_values():
    def g(x, w):
        h = (x.reshape(x.shape[0] * x.shape[1], 4) @ w).relu()      # [5*batch, 2]
        z = sampan.zeros(x.shape[0], 3)                              # a folded fill
        return h.reshape(x.shape[0], -1).sum(1) + z.sum(1) + x.sum() / x.shape[0]
    jg = sampan.jit(g, dynamic={0: {0: "batch"}})
    w = sampan.randn(4, 2)
    for b in (3, 6, 2, 11):
        x = sampan.randn(b, 5, 4)
        np.testing.assert_allclose(jg(x, w).numpy(), g(x, w).numpy(), rtol=1e-5, atol=1e-5)
    text = str(jg.graph)
    assert "f32[5*batch,4]" in text and "'$batch'" in text and jg.n_traces == 1


def test_batch_and_sequence_through_a_transformer_layer():
    sampan.manual_seed(1)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    layer.eval()
    f = sampan.jit(layer, pipeline="inference", dynamic={0: {0: "batch", 1: "seq"}})
    with sampan.no_grad():
        for b, s in ((2, 5), (3, 7), (1, 1), (4, 5)):
            x = sampan.randn(b, s, 16)
            np.testing.assert_allclose(f(x).numpy(), layer(x).numpy(), rtol=1e-4, atol=1e-5)
    assert f.n_traces == 1 and "batch*seq" in str(f.graph)


def test_train_step_with_dynamic_batch_matches_eager():
    sampan.manual_seed(2)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    ref = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    ref.load_state_dict(net.state_dict())
    opt = sampan.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    ropt = sampan.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()      # its gradient reads 1/batch
        loss.backward()
        opt.step()
        return loss.detach()
    js = sampan.jit(step, dynamic="batch")
    for b in (4, 9, 2, 4, 13):
        x, y = sampan.randn(b, 3), sampan.randn(b, 1)
        got = js(x, y)
        ropt.zero_grad()
        want = ((ref(x) - y) ** 2).mean()
        want.backward()
        ropt.step()
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    for p, q in zip(net.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6)
    assert js.n_traces == 1


def test_saved_program_serves_any_batch(tmp_path):
    class M(nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 4)
            self.fc = nn.Linear(12, 1)

        def forward(self, ids):
            return self.fc(self.emb(ids).reshape(ids.shape[0], -1)).sigmoid()
    sampan.manual_seed(3)
    m = M()
    m.eval()
    path = str(tmp_path / "m.sampan")
    sampan.jit.save(m, path, (sampan.randint(0, 50, (6, 3)),), dynamic={"ids": {0: "batch"}})
    assert "i64[batch,3]" in open(f"{path}/graph.ir").read()
    loaded = sampan.jit.load(path)
    with sampan.no_grad():
        for b in (6, 1, 17):
            x = sampan.randint(0, 50, (b, 3))
            np.testing.assert_allclose(loaded(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(sampan.SampanError, match=r"input 0 is int64\[4, 5\]; expected "
                                                 r"i64\[batch,3\]"):
        loaded(sampan.randint(0, 50, (4, 5)))


def test_a_saved_jit_function_keeps_its_dynamic_dims(tmp_path):
    m = _mlp()
    f = sampan.jit(m, pipeline="inference", dynamic="batch")
    path = str(tmp_path / "mlp.sampan")
    sampan.jit.save(f, path, (sampan.randn(1, 4),))     # an example of size 1 works too
    loaded = sampan.jit.load(path)
    with sampan.no_grad():
        x = sampan.randn(9, 4)
        np.testing.assert_allclose(loaded(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)


def test_inputs_sharing_a_symbol_must_agree():
    f = sampan.jit(lambda x, y: x * y, dynamic={"x": {0: "batch"}, "y": {0: "batch"}})
    f(sampan.randn(3, 2), sampan.randn(3, 2))
    with pytest.raises(DynamicShapeError, match="must agree"):
        f(sampan.randn(3, 2), sampan.randn(4, 2))


def test_size_used_in_a_non_multiplicative_way_names_the_line():
    def h(x):     # numpy computes from the size: a constant no symbolic size reaches
        return x.sum(1) + sampan.from_numpy(np.arange(x.shape[0] + 1)[1:] ** 2)
    f = sampan.jit(h, dynamic="batch")
    with pytest.raises(DynamicShapeError, match=r"(holds other values|not a multiple).*|"
                                                r"test_dynamic.py:\d+"):
        f(sampan.randn(4, 3))


def test_bad_markings_are_clear_errors():
    with pytest.raises(sampan.SampanError, match="not arguments of this call"):
        sampan.jit(lambda x: x * 2, dynamic={"z": {0: "batch"}})(sampan.randn(2))
    with pytest.raises(sampan.SampanError, match="identifier"):
        sampan.jit(lambda x: x * 2, dynamic={"x": {0: "2b"}})(sampan.randn(2))
    with pytest.raises(sampan.SampanError, match="has 1 dims"):
        sampan.jit(lambda x: x * 2, dynamic={"x": {3: "batch"}})(sampan.randn(2))


def test_differentiated_from_outside_is_refused_clearly():
    w = sampan.randn(3, requires_grad=True)
    f = sampan.jit(lambda x: (x * w).sum(), dynamic="batch")
    with pytest.raises(sampan.SampanError, match="no_grad"):
        f(sampan.randn(4, 3))
