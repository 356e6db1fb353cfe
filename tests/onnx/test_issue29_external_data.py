"""Issue 29, item 2: every external tensor of an ONNX model (initializers, Constant
attributes, sparse tensors, subgraphs) is read from the model's folder, with `..`, absolute
paths and symbolic links refused; a model given as bytes or a ModelProto needs `base_dir=`.
Nothing is ever resolved against the working directory."""
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
from sampan.onnx import OnnxError  # noqa: E402

SECRET = np.array([11.0, 22.0, 33.0, 44.0], np.float32)     # what must never come back


def _external(name, location, shape=(4,)):
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(shape)
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", location
    return t


def _model(nodes, outputs, inits=(), inputs=(), opset=17):
    g = helper.make_graph(nodes, "g", list(inputs), outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _out(name="y", shape=(4,)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _constant_model(location):
    return _model([helper.make_node("Constant", [], ["y"], value=_external("c", location))],
                  [_out()])


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """(model folder, working directory holding the secret file), cwd set to the latter."""
    model_dir, cwd = tmp_path / "model", tmp_path / "cwd"
    model_dir.mkdir()
    cwd.mkdir()
    SECRET.tofile(cwd / "secret.bin")
    monkeypatch.chdir(cwd)
    return model_dir, cwd


def _run(layer):
    with sampan.no_grad():
        return layer().numpy()


def test_constant_external_data_in_the_cwd_is_not_read(dirs):
    model_dir, cwd = dirs
    path = model_dir / "m.onnx"
    onnx.save(_constant_model("secret.bin"), str(path))
    with pytest.raises(OnnxError, match="does not exist.*model's folder"):
        sampan.onnx.to_layer(str(path))
    # the same name beside the model: read from there, as onnxruntime reads it
    mine = np.array([1.5, -2.0, 3.25, 0.0], np.float32)
    mine.tofile(model_dir / "secret.bin")
    got = _run(sampan.onnx.to_layer(str(path)))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {})[0]
    np.testing.assert_array_equal(got, mine)
    np.testing.assert_array_equal(got, want)


def _weights_model():
    """y = x * w + c: an external initializer `w` and an external Constant `c`."""
    nodes = [helper.make_node("Constant", [], ["c"], value=_external("cval", "c.bin")),
             helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "c"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    return _model(nodes, [_out()], [_external("w", "w.bin")], [x])


@pytest.mark.parametrize("kind", ["bytes", "proto"])
def test_bytes_and_proto_with_external_data_need_base_dir(dirs, kind):
    model_dir, cwd = dirs
    w = np.array([2.0, 3.0, -1.0, 0.5], np.float32)
    c = np.array([0.25, 0.5, 0.75, 1.0], np.float32)
    m = _weights_model()
    src = m.SerializeToString() if kind == "bytes" else m
    # the data files sit in the cwd too: still never read from there
    w.tofile(cwd / "w.bin")
    c.tofile(cwd / "c.bin")
    for fn in (sampan.onnx.to_layer, sampan.onnx.load):
        with pytest.raises(OnnxError, match="base_dir="):
            fn(src)
    w.tofile(model_dir / "w.bin")
    c.tofile(model_dir / "c.bin")
    x = np.array([1.0, -2.0, 4.0, 8.0], np.float32)
    layer = sampan.onnx.to_layer(src, base_dir=str(model_dir))
    with sampan.no_grad():
        got = layer(sampan.tensor(x)).numpy()
    np.testing.assert_allclose(got, x * w + c, rtol=0, atol=0)
    onnx.save(m, str(model_dir / "m.onnx"))
    ref = ort.InferenceSession(str(model_dir / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, ref.run(None, {"x": x})[0])
    g = sampan.onnx.load(src, base_dir=str(model_dir))
    assert g.inputs[0].shape == (4,)
    if kind == "proto":      # the caller's proto is left as it was
        assert m.graph.initializer[0].data_location == TensorProto.EXTERNAL
        assert not m.graph.initializer[0].raw_data


def _link(model_dir, cwd):
    os.symlink(cwd / "secret.bin", model_dir / "link.bin")
    return "link.bin"


LOCATIONS = {
    "dotdot": (lambda d, c: "../cwd/secret.bin", "leaves the folder"),
    "dotdot_inside": (lambda d, c: "sub/../../cwd/secret.bin", "leaves the folder"),
    "absolute": (lambda d, c: str(c / "secret.bin"), "absolute path"),
    "symlink": (_link, "symbolic link"),
}


def _sparse_constant(location):
    sp = onnx.SparseTensorProto()
    sp.dims.extend([4])
    sp.values.CopyFrom(_external("v", location, (2,)))
    sp.indices.CopyFrom(numpy_helper.from_array(np.array([0, 2], np.int64), "i"))
    return _model([helper.make_node("Constant", [], ["y"], sparse_value=sp)], [_out()])


def _subgraph_model(location):
    """An If whose branches read an external initializer of their own."""
    def branch(name):
        return helper.make_graph([helper.make_node("Identity", [name], ["o"])], name, [],
                                 [_out("o")], [_external(name, location)])
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch("t"),
                            else_branch=branch("e"))
    return _model([node], [_out()], [cond])


def _initializer_model(location):
    return _model([helper.make_node("Identity", ["w"], ["y"])], [_out()],
                  [_external("w", location)])


MODELS = {"constant": _constant_model, "sparse_constant": _sparse_constant,
          "subgraph_initializer": _subgraph_model, "initializer": _initializer_model}


@pytest.mark.parametrize("where", sorted(MODELS))
@pytest.mark.parametrize("how", sorted(LOCATIONS))
def test_escaping_locations_are_refused_everywhere(dirs, where, how):
    model_dir, cwd = dirs
    loc_of, message = LOCATIONS[how]
    loc = loc_of(model_dir, cwd)
    m = MODELS[where](loc)
    path = model_dir / "m.onnx"
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    with pytest.raises(OnnxError, match=message):
        sampan.onnx.to_layer(str(path))
    with pytest.raises(OnnxError, match=message):      # the same check with base_dir
        sampan.onnx.load(m.SerializeToString(), base_dir=str(model_dir))


def test_backend_prepare_takes_base_dir(dirs):
    model_dir, _ = dirs
    w = np.array([4.0, 3.0, 2.0, 1.0], np.float32)
    w.tofile(model_dir / "w.bin")
    m = _initializer_model("w.bin")
    from sampan.onnx.backend import SampanBackend
    with pytest.raises(OnnxError, match="base_dir="):
        SampanBackend.prepare(m)
    (y,) = SampanBackend.prepare(m, base_dir=str(model_dir)).run([])
    np.testing.assert_array_equal(y, w)
