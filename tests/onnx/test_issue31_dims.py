"""Issue 31: the dims of real models' inputs that `sampan.onnx.load` failed on, in small
graphs built with onnx.helper and checked against onnxruntime.

- a named image side through a strided conv and then a reshape (flatten) or an
  upsample-and-concat (a side that must stay even): it cannot stay symbolic, so it is
  concrete per call size (one trace and compile per size, cached), while the batch stays
  symbolic; a model that cannot run at the sizes given still fails, as onnxruntime does;
- paddle2onnx's spellings of an unknown size: -1 as a dim's value (in the inputs, the
  outputs and value_info), and "?" as the name of two different dims."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
from sampan.autograd import no_grad  # noqa: E402
from sampan.onnx.importer import compile_layer, save_program  # noqa: E402

RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _model(nodes, x_shape, out_shape, inits, value_info=()):
    g = helper.make_graph(nodes, "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                          inits, value_info=list(value_info))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    return m


def _strided_flatten():
    """x[N,2,H,W] -> conv 3x3 stride 2 -> reshape [0, -1] -> matmul-free sum: the reshape's
    size is 4*((H+1)//2)*((W+1)//2), no multiple of H and W."""
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    return _model(nodes, ["N", 2, "H", "W"], ["N", "F"], [_w("k", 4, 2, 3, 3), shape])


def _strided_concat():
    """The YOLO/PP-OCR neck in small: conv stride 2, nearest upsample x2, concat with the
    full-size branch: only even sides run, so H and W cannot be traced at a size +1."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "k1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "k2"], ["b"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["b", "", "scales"], ["u"], mode="nearest"),
             helper.make_node("Concat", ["a", "u"], ["y"], axis=1)]
    return _model(nodes, ["batch", 3, "height", "width"], ["batch", 8, "height", "width"],
                  [_w("k1", 4, 3, 3, 3), _w("k2", 4, 4, 3, 3), scales])


def _ort(m, x):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("make, sizes, concrete", [
    (_strided_flatten, {"N": 2, "H": 7, "W": 9}, ["H", "W"]),
    (_strided_concat, {"batch": 2, "height": 8, "width": 12}, ["height", "width"])])
def test_load_makes_a_side_that_cannot_stay_symbolic_concrete(make, sizes, concrete):
    m = make()
    g = sampan.onnx.load(m, dim_sizes=sizes)          # failed before: DynamicShapeError
    batch = next(iter(sizes))
    x = next(v for v in g.inputs if v.name is None)       # the weights have names
    assert [str(d) for d in x.shape] == [batch, "3" if x.shape[1] == 3 else "2",
                                         str(sizes[concrete[0]]), str(sizes[concrete[1]])]
    layer = sampan.onnx.to_layer(m)
    layer.eval()
    shape = [sizes[batch], x.shape[1], sizes[concrete[0]], sizes[concrete[1]]]
    with no_grad():
        f = compile_layer(layer, (sampan.Tensor(_x(*shape)),))
        assert f.concrete_dims == concrete and list(f.dynamic[0].values()) == [batch]
        for b, h, w in ((1, shape[2], shape[3]), (3, shape[2], shape[3]),
                        (2, shape[2] + 2, shape[3] - 2), (3, shape[2] + 2, shape[3] - 2)):
            xs = _x(b, shape[1], h, w)
            np.testing.assert_allclose(f(sampan.Tensor(xs)).numpy(), _ort(m, xs),
                                       rtol=1e-5, atol=1e-5)
    assert f.n_traces == 2          # once per side size; the batch stays symbolic


def test_a_size_the_model_cannot_run_at_still_fails():
    m = _strided_concat()       # odd sides: the concat's inputs disagree (as in onnxruntime)
    with pytest.raises(sampan.SampanError, match="concat"):
        sampan.onnx.load(m, dim_sizes={"batch": 1, "height": 7, "width": 8})
    with pytest.raises(Exception):
        _ort(m, _x(1, 3, 7, 8))


def test_predictor_serves_the_batch_of_a_model_with_concrete_sides(tmp_path):
    from sampan.inference import Config, create_predictor
    m = _strided_flatten()
    path, f = save_program(m, tmp_path / "m.sampan", dim_sizes={"N": 2, "H": 6, "W": 10})
    assert f.concrete_dims == ["H", "W"]
    p = create_predictor(Config(path))
    for b in (1, 4):
        xs = _x(b, 2, 6, 10)
        p.get_input_handle(p.get_input_names()[0]).copy_from_cpu(xs)
        p.run()
        got = p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()
        np.testing.assert_allclose(got, _ort(m, xs), rtol=1e-5, atol=1e-5)


def _paddle_style():
    """x[-1,3,?,?] (paddle2onnx's spelling) -> conv -> HardSigmoid gate -> Mul, with
    value_info of -1 dims and an output of -1 dims."""
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("HardSigmoid", ["p"], ["s"], alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    vi = [helper.make_tensor_value_info("c", TensorProto.FLOAT, [-1, 4, -1, -1]),
          helper.make_tensor_value_info("p", TensorProto.FLOAT, [-1, 4, 1, 1])]
    g = helper.make_graph(nodes, "paddle",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [-1, 3, "?", "?"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [-1, 4, -1, -1])],
                          [_w("k", 4, 3, 3, 3)], value_info=vi)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    onnx.checker.check_model(m)
    return m


def test_minus_one_and_question_mark_dims_are_sizes_of_their_own():
    m = _paddle_style()
    layer = sampan.onnx.to_layer(m)     # failed before: a -1 dim wanted a size of -1
    assert layer.input_types["x"][1] == ("x_dim0", 3, "x_dim2", "x_dim3")
    layer.eval()
    for shape in ((1, 3, 5, 9), (2, 3, 8, 4)):   # "?" and "?" differ: not one size
        xs = _x(*shape)
        with no_grad():
            got = layer(sampan.Tensor(xs)).numpy()
        np.testing.assert_allclose(got, _ort(m, xs), rtol=1e-5, atol=1e-6)
    g = sampan.onnx.load(m, dim_sizes={"x_dim2": 5, "x_dim3": 7})
    x = next(v for v in g.inputs if v.name is None)
    assert [str(d) for d in x.shape] == ["x_dim0", "3", "x_dim2", "x_dim3"]
    with no_grad():
        f = compile_layer(layer, (sampan.Tensor(_x(1, 3, 5, 7)),))
        assert f.concrete_dims == []
        xs = _x(3, 3, 6, 11)
        np.testing.assert_allclose(f(sampan.Tensor(xs)).numpy(), _ort(m, xs),
                                   rtol=1e-5, atol=1e-6)
    assert f.n_traces == 1


def test_positions_from_a_range_over_the_shape_stay_symbolic():
    """ids[B,S] -> Range(0, Shape(ids)[1]) -> Gather of a position table, as torch.onnx
    writes BERT's position ids: the range folds to a constant at each traced size, and
    the unifier makes it an arange of the symbolic length again (one trace serves all)."""
    table = numpy_helper.from_array(RNG.standard_normal((40, 4)).astype(np.float32), "pos")
    nodes = [helper.make_node("Shape", ["ids"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Gather", ["pos", "r"], ["p"], axis=0),
             helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["f", "axes"], ["fu"]),
             helper.make_node("Add", ["fu", "p"], ["y"])]
    consts = [numpy_helper.from_array(np.array(v, np.int64), k)
              for k, v in (("zero", 0), ("one", 1), ("axes", [2]))]
    g = helper.make_graph(nodes, "pos",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         ["B", "S", 4])], [table] + consts)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    layer = sampan.onnx.to_layer(m)
    layer.eval()
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with no_grad():
        f = compile_layer(layer, (sampan.Tensor(np.zeros((2, 8), np.int64)),))
        assert f.concrete_dims == []
        for b, n in ((1, 5), (3, 11)):
            ids = RNG.integers(0, 9, (b, n)).astype(np.int64)
            np.testing.assert_allclose(f(sampan.Tensor(ids)).numpy(),
                                       sess.run(None, {"ids": ids})[0], rtol=1e-6)
    assert f.n_traces == 1


def test_load_at_the_default_size_names_the_dims_to_size():
    """Two 2x2 pools on a side left at load's default size 2 (PP-OCR's classifier and
    recogniser in small): the shape error names the dims traced at 2 and dim_sizes; the
    model loads at a size it runs at, and a size given in full fails as it is."""
    nodes = [helper.make_node("MaxPool", ["x"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    m = _model(nodes, ["N", 3, "H", "W"], ["N", 3, "h", "w"], [])
    with pytest.raises(sampan.ShapeError, match=r"(?s)max_pool2d.*\['H', 'N', 'W'\] at the "
                                                r"default size 2; pass dim_sizes"):
        sampan.onnx.load(m)
    with pytest.raises(sampan.ShapeError, match=r"\['H', 'W'\] at the default size 2"):
        sampan.onnx.load(m, dim_sizes={"N": 1})
    g = sampan.onnx.load(m, dim_sizes={"H": 8, "W": 12})
    assert [str(d) for d in next(v for v in g.inputs if v.name is None).shape][:2] == ["N", "3"]
    with pytest.raises(sampan.ShapeError) as e:
        sampan.onnx.load(m, dim_sizes={"N": 1, "H": 2, "W": 2})
    assert "dim_sizes" not in str(e.value)
