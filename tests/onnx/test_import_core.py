"""The ONNX importer's core: the interpreter, parameters, static folding, symbolic dims, and
the checks that turn a damaged or unsupported model into an OnnxError."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
from sampan.onnx import OnnxError  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _x(name="x", shape=("N", 4), t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, list(shape))


def _shape_model():
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "layer.0/w")
    return _model([helper.make_node("Shape", ["x"], ["s"]),
                   helper.make_node("Identity", ["x"], ["y"]),
                   helper.make_node("Identity", ["layer.0/w"], ["w_out"])],
                  [_x()], [_x("y"), _x("s", [2], TensorProto.INT64),
                           _x("w_out", [4, 3])], [w])


def test_interpreter_parameters_and_symbolic_shapes():
    m = _shape_model()
    layer = sampan.onnx.to_layer(m)
    y, s, w = layer(sampan.randn(5, 4))
    assert s.numpy().tolist() == [5, 4] and s.dtype == np.int64
    assert list(dict(layer.named_parameters())) == ["layer_0_w"]
    assert layer.onnx_names == {"layer_0_w": "layer.0/w"}
    g = sampan.onnx.load(m)
    assert g.inputs[0].shape == ("N", 4)
    f = sampan.jit(layer, pipeline="inference", dynamic={0: {0: "N"}})
    with sampan.no_grad():
        for n in (3, 7):
            assert f(sampan.randn(n, 4))[1].numpy().tolist() == [n, 4]


def test_bad_inputs_name_the_input():
    layer = sampan.onnx.to_layer(_shape_model())
    with pytest.raises(OnnxError, match="input 'x' has shape \\[5, 3\\]"):
        layer(sampan.randn(5, 3))
    with pytest.raises(OnnxError, match="float64"):
        layer(sampan.randn(5, 4, dtype=sampan.float64))
    with pytest.raises(OnnxError, match="takes 1 inputs"):
        layer()


@pytest.mark.parametrize("case", ["cycle", "dangling", "dims", "future", "unknown", "loop"])
def test_malformed_models_are_clear_errors(case):
    x = _x()
    if case == "cycle":
        m = _model([helper.make_node("Identity", ["b"], ["a"]),
                    helper.make_node("Identity", ["a"], ["b"])], [x], [_x("b")])
    elif case == "dangling":
        m = _model([helper.make_node("Identity", ["nope"], ["y"])], [x], [_x("y")])
    elif case == "dims":
        t = numpy_helper.from_array(np.ones(6, np.float32), "w")
        del t.dims[:]
        t.dims.extend([2, 4])
        m = _model([helper.make_node("Identity", ["w"], ["y"])], [x], [_x("y")], [t])
    elif case == "future":
        m = _model([helper.make_node("Identity", ["x"], ["y"])], [x], [_x("y")], opset=99)
    elif case == "unknown":
        m = _model([helper.make_node("NoSuchOp", ["x"], ["y"], name="n1")], [x], [_x("y")])
    else:
        m = _model([helper.make_node("Loop", ["", ""], ["y"], name="loop",
                                     body=helper.make_graph([], "b", [], []))], [x], [_x("y")])
    with pytest.raises(OnnxError) as e:
        sampan.onnx.to_layer(m)
    msg = str(e.value)
    assert msg.startswith("sampan.onnx:")
    if case == "unknown":
        assert "NoSuchOp" in msg and "'n1'" in msg and "opset 17" in msg and "Identity" in msg


def test_damaged_bytes_never_crash(tmp_path):
    data = _shape_model().SerializeToString()
    rng = np.random.default_rng(0)
    kinds = set()
    for k in range(300):
        b = bytearray(data)
        if k % 3 == 0:
            b = b[:rng.integers(0, len(b))]
        else:
            for _ in range(rng.integers(1, 4)):
                b[rng.integers(0, len(b))] ^= 1 << int(rng.integers(0, 8))
        p = tmp_path / "m.onnx"
        p.write_bytes(bytes(b))
        try:
            layer = sampan.onnx.to_layer(str(p))
            layer(sampan.randn(2, 4))
            kinds.add("ok")
        except sampan.SampanError:
            kinds.add("error")
    assert "error" in kinds
