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
