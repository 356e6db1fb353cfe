"""sampan -> ONNX -> sampan gives the same graph up to renaming (value names, input order,
source lines), and sampan -> ONNX -> onnxruntime matches sampan eager."""
import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import sampan  # noqa: E402
from sampan import nn  # noqa: E402
from sampan.ir.graph import _attrs_key  # noqa: E402
from sampan.onnx.export import to_model  # noqa: E402


def _canon(g):
    """The graph with every value named by where it is first used or made: independent of
    names, of the order of the inputs (weights) and of source lines."""
    first = {}
    for k, n in enumerate(g.nodes):
        for j, v in enumerate(n.inputs):
            first.setdefault(v.id, ("use", k, j))
    ren = {}
    for v in list(g.inputs) + list(g.consts):
        ren[v.id] = first.get(v.id, ("unused",)) + (v.shape, str(v.dtype)) + (
            (v.const.tobytes(),) if v.const is not None else ())
    nodes = []
    for k, n in enumerate(g.nodes):
        for j, v in enumerate(n.outputs):
            ren[v.id] = ("made", k, j)
        nodes.append((n.op, tuple(ren[v.id] for v in n.inputs), _attrs_key(n.attrs),
                      tuple((v.shape, str(v.dtype)) for v in n.outputs)))
    return sorted(map(str, (ren[v.id] for v in g.inputs))), nodes, [ren[v.id] for v in g.outputs]


def _models():
    sampan.manual_seed(0)
    yield "mlp", nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), (2, 4)
    yield "cnn", nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Flatten(), nn.Linear(64, 5)), (2, 1, 8, 8)
    yield "norm", nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), nn.GELU(), nn.Softmax(-1)), \
        (3, 6)


@pytest.mark.parametrize("name,model,shape", list(_models()), ids=lambda p: p
                         if isinstance(p, str) else "")
def test_round_trip_is_the_same_graph(name, model, shape):
    model.eval()
    x = sampan.randn(*shape)
    f = sampan.jit(model, pipeline="inference")
    with sampan.no_grad():
        want = f(x).numpy()
    onnx_model = to_model(model, (x,), opset=20)
    got = sampan.onnx.load(onnx_model)
    assert _canon(got) == _canon(f.graph), f"\n{f.graph}\n{got}"
    sess = ort.InferenceSession(onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    out = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
