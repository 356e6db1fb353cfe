"""Real layers exported to ONNX and run in onnxruntime against sampan eager."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
import sampan.onnx
from sampan import nn

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _check(model, xs, path, sizes=None, tol=1e-5, **kw):
    """Export `model` at `xs`, run onnxruntime at those inputs (and at each of `sizes`,
    new inputs made by `sizes`), compare with sampan eager."""
    model.eval()
    mp = sampan.onnx.export(model, xs, path, **kw)
    onnx.checker.check_model(mp, full_check=True)
    onnx.shape_inference.infer_shapes(mp, strict_mode=True)
    s = _session(path)
    for ins in [xs] + [make() for make in (sizes or [])]:
        feed = {i.name: x.numpy() for i, x in zip(s.get_inputs(), ins)}
        got = s.run(None, feed)
        want = model(*ins)
        want = want if isinstance(want, (tuple, list)) else [want]
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            np.testing.assert_allclose(g, w.numpy(), rtol=0, atol=tol)
    return mp


def test_mlp_dynamic_batch(tmp_path):
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                      nn.Linear(16, 3))
    mp = _check(m, (sampan.randn(5, 4),), tmp_path / "mlp.onnx",
                sizes=[lambda: (sampan.randn(2, 4),), lambda: (sampan.randn(9, 4),)],
                dynamic_axes={"x": {0: "batch"}}, input_names=["x"])
    dim = mp.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param == "batch"
    assert len(mp.graph.initializer) >= 6     # the weights are initializers
    assert "0.weight" in {t.name for t in mp.graph.initializer}
    assert all("test_export_layers.py:" in n.doc_string for n in mp.graph.node)  # user lines


class LeNet(nn.Layer):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 5, padding=2)
        self.b1 = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 8, 5)
        self.f1 = nn.Linear(8 * 5 * 5, 32)
        self.f2 = nn.Linear(32, 10)

    def forward(self, x):
        x = nn.F.max_pool2d(nn.F.relu(self.b1(self.c1(x))), 2)
        x = nn.F.avg_pool2d(nn.F.relu(self.c2(x)), 2)
        x = x.reshape(x.shape[0], -1)
        return self.f2(nn.F.relu(self.f1(x)))


def test_lenet_dynamic_batch(tmp_path):
    sampan.manual_seed(1)
    m = LeNet()
    _check(m, (sampan.randn(3, 1, 28, 28),), tmp_path / "lenet.onnx",
           sizes=[lambda: (sampan.randn(1, 1, 28, 28),), lambda: (sampan.randn(6, 1, 28, 28),)],
           dynamic_axes={"x": {0: "batch"}})


def test_transformer_encoder_layer_dynamic_batch(tmp_path):
    sampan.manual_seed(2)
    m = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    mp = _check(m, (sampan.randn(2, 5, 16),), tmp_path / "enc.onnx",
                sizes=[lambda: (sampan.randn(4, 5, 16),)],
                dynamic_axes={"src": {0: "batch"}})
    ops = {n.op_type for n in mp.graph.node}
    assert "LayerNormalization" in ops and "Softmax" in ops


def test_transformer_encoder_layer_dynamic_batch_and_sequence(tmp_path):
    # two symbols: reshapes need shapes computed from the input (Shape/Concat)
    sampan.manual_seed(5)
    m = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    mp = _check(m, (sampan.randn(2, 5, 16),), tmp_path / "enc2.onnx",
                sizes=[lambda: (sampan.randn(3, 7, 16),), lambda: (sampan.randn(1, 2, 16),)],
                dynamic_axes={"src": {0: "batch", 1: "seq"}})
    dims = mp.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims[:2]] == ["batch", "seq"]
    assert "Shape" in {n.op_type for n in mp.graph.node}


def test_lstm_dynamic_batch(tmp_path):
    sampan.manual_seed(3)
    m = nn.LSTM(6, 8, batch_first=True)

    class Last(nn.Layer):
        def __init__(self):
            super().__init__()
            self.lstm = m

        def forward(self, x):
            y, (h, c) = self.lstm(x)
            return y, h, c
    _check(Last(), (sampan.randn(3, 4, 6),), tmp_path / "lstm.onnx",
           sizes=[lambda: (sampan.randn(5, 4, 6),)], dynamic_axes={"x": {0: "batch"}})


@pytest.mark.parametrize("opset", [17, None])
def test_gpt_block_dynamic_batch(tmp_path, opset):
    sampan.manual_seed(4)
    m = nn.TransformerDecoderBlock(16, 2)
    mp = _check(m, (sampan.randn(2, 6, 16),), tmp_path / "gpt.onnx",
                sizes=[lambda: (sampan.randn(3, 6, 16),)], dynamic_axes={"x": {0: "batch"}},
                opset=opset)
    ops = {n.op_type for n in mp.graph.node}
    assert ("Gelu" in ops) == (mp.opset_import[0].version >= 20)


def test_standardize_scale_shift_is_one_layer_normalization(tmp_path):
    sampan.manual_seed(6)
    w, b = sampan.randn(8), sampan.randn(8)

    def f(x):
        return sampan.layer_norm(x, (8,)) * w + b   # standardize, then a fused mul/add
    x = sampan.randn(3, 8)
    mp = sampan.onnx.export(f, (x,), tmp_path / "ln.onnx")
    assert [n.op_type for n in mp.graph.node] == ["LayerNormalization"]
    s = _session(tmp_path / "ln.onnx")
    np.testing.assert_allclose(s.run(None, {s.get_inputs()[0].name: x.numpy()})[0],
                               f(x).numpy(), atol=1e-5)


def test_symbolic_sizes_in_attributes_are_computed(tmp_path):
    """Sizes read from the input (x.shape[0]) become Shape-based tensors: a reshape to
    7*n, zeros of (n, 3), a division by n*m."""
    def f(x):
        z = sampan.zeros(x.shape[0], 3)
        flat = sampan.concat([x[:, :4], z], 1).reshape(x.shape[0] * 7)
        return flat, x.mean(0) * x.shape[0] + x.sum(1, keepdim=True) / (x.shape[0] * x.shape[1])
    x = sampan.randn(4, 5)
    path = tmp_path / "sym.onnx"
    mp = sampan.onnx.export(f, (x,), path, dynamic_axes={"x": {0: "n", 1: "m"}})
    assert mp.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "7*n"
    s = _session(path)
    for n, m in ((4, 5), (2, 4), (9, 6)):
        x = sampan.randn(n, m)
        for got, want in zip(s.run(None, {"x": x.numpy()}), f(x)):
            np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


def test_embedding_bag_of_words_with_int_input(tmp_path):
    sampan.manual_seed(7)

    class Bag(nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 6)
            self.out = nn.Linear(6, 2)

        def forward(self, ids):
            return self.out(self.emb(ids).mean(1))
    ids = sampan.from_numpy(np.array([[1, 4, 19], [0, 0, 7]], np.int64))
    _check(Bag(), (ids,), tmp_path / "bag.onnx", dynamic_axes={"ids": {0: "batch"}},
           sizes=[lambda: (sampan.from_numpy(np.array([[3, 3, 2]], np.int64)),)])


def test_jitted_function_and_an_input_returned_as_is(tmp_path):
    w = sampan.randn(3, 3)

    @sampan.jit(dynamic="batch")
    def f(x):
        return x, sampan.tanh(x @ w)
    x = sampan.randn(4, 3)
    mp = sampan.onnx.export(f, (x,), tmp_path / "f.onnx")
    assert mp.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    s = _session(tmp_path / "f.onnx")
    for n in (4, 1):
        xn = sampan.randn(n, 3)
        a, b = s.run(None, {"x": xn.numpy()})
        np.testing.assert_array_equal(a, xn.numpy())
        np.testing.assert_allclose(b, f(xn)[1].numpy(), atol=1e-6)


def test_export_uses_eval_mode_and_restores_each_layers_mode(tmp_path):
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4))
    m.train()
    m[2].eval()
    x = sampan.randn(6, 4)
    mp = sampan.onnx.export(m, (x,), tmp_path / "d.onnx")
    assert not {"RandomUniform", "RandomUniformLike", "Dropout"} & {
        n.op_type for n in mp.graph.node}
    assert m.training and m[1].training and not m[2].training
