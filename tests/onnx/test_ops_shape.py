"""Import handlers for ONNX's shape, index and reduction ops (sampan/onnx/ops/shape.py,
index.py, reduce.py): the official node conformance cases of each op type, with the number
passing pinned, plus gradients through a few handlers and the data-vs-static rules.

The conformance cases feed shapes, axes, pads ... as graph inputs; sampan needs those
static (as models exported by PyTorch give them), so the harness turns those inputs into
initializers. The cases are generated only from the onnx test modules of these op types
(generating all 1884 takes ~9 s)."""
import collections
import importlib
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
from sampan.onnx import OnnxError  # noqa: E402
from sampan.onnx import importer  # noqa: E402

# op type -> the module of onnx.backend.test.case.node that holds its cases
MODULES = {
    "Reshape": "reshape", "Transpose": "transpose", "Flatten": "flatten",
    "Squeeze": "squeeze", "Unsqueeze": "unsqueeze", "Concat": "concat", "Split": "split",
    "Slice": "slice", "Gather": "gather", "GatherElements": "gatherelements",
    "GatherND": "gathernd", "ScatterElements": "scatterelements", "ScatterND": "scatternd",
    "Scatter": "scatter", "Expand": "expand", "Tile": "tile", "Pad": "pad",
    "ConstantOfShape": "constantofshape", "Range": "rangeop", "Trilu": "trilu",
    "OneHot": "onehot", "NonZero": "nonzero", "Unique": "unique", "TopK": "topk",
    "ArgMax": "argmax", "ArgMin": "argmin", "ReduceSum": "reducesum",
    "ReduceMean": "reducemean", "ReduceMax": "reducemax", "ReduceMin": "reducemin",
    "ReduceProd": "reduceprod", "ReduceL1": "reducel1", "ReduceL2": "reducel2",
    "ReduceLogSum": "reduce_log_sum", "ReduceLogSumExp": "reduce_log_sum_exp",
    "ReduceSumSquare": "reducesumsquare", "CumSum": "cumsum", "Compress": "compress",
    "DepthToSpace": "depthtospace", "SpaceToDepth": "spacetodepth", "EyeLike": "eyelike",
    "ReverseSequence": "reversesequence",
}
_AXES = {1}
# inputs that must be static (a shape, axes, pads, K ...): made initializers for the cases
STATIC = {"Reshape": {1}, "Expand": {1}, "Tile": {1}, "Split": {1}, "Slice": {1, 2, 3, 4},
          "Pad": {1, 2, 3}, "ConstantOfShape": {0}, "Range": {0, 1, 2}, "OneHot": {1},
          "TopK": {1}, "Squeeze": _AXES, "Unsqueeze": _AXES, "CumSum": _AXES, "Trilu": _AXES,
          **{op: _AXES for op in MODULES if op.startswith("Reduce")}}

# op type -> (passing, cases); every miss is listed in FAILS with the reason
PINNED = {
    "Reshape": (10, 10), "Transpose": (7, 7), "Flatten": (9, 9), "Squeeze": (2, 2),
    "Unsqueeze": (7, 7), "Concat": (12, 12), "Split": (16, 16), "Slice": (8, 8),
    "Gather": (4, 4), "GatherElements": (3, 3), "GatherND": (3, 3),
    "ScatterElements": (7, 7), "ScatterND": (7, 7), "Scatter": (2, 2), "Expand": (2, 2),
    "Tile": (2, 2), "Pad": (6, 6), "ConstantOfShape": (3, 3), "Range": (4, 4),
    "Trilu": (18, 18), "OneHot": (6, 6), "NonZero": (1, 1), "Unique": (7, 7),
    "TopK": (7, 7), "ArgMax": (16, 16), "ArgMin": (16, 16), "ReduceSum": (12, 12),
    "ReduceMean": (8, 8), "ReduceMax": (11, 11), "ReduceMin": (10, 10),
    "ReduceProd": (9, 9), "ReduceL1": (9, 9), "ReduceL2": (9, 9), "ReduceLogSum": (5, 5),
    "ReduceLogSumExp": (9, 9), "ReduceSumSquare": (9, 9), "CumSum": (9, 9),
    "Compress": (5, 5), "DepthToSpace": (2, 2), "SpaceToDepth": (4, 4), "EyeLike": (3, 3),
    "ReverseSequence": (3, 3),
}
FAILS = {   # dtypes sampan has no tensors of (refused when the input is given); none now:
}           # uint16/32/64 ... are emulated (sampan/onnx/emulate.py)


def _arr(v):
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else np.asarray(v)


def conformance_cases(op_types=None):
    """(op type, case) for the single-node conformance cases of `op_types`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in op_types or MODULES:
            importlib.import_module("onnx.backend.test.case.node." + MODULES[op])
        from onnx.backend.test.case.node import _NodeTestCases
    want = set(op_types or MODULES)
    for c in _NodeTestCases:
        nodes = c.model.graph.node
        if len(nodes) == 1 and nodes[0].op_type in want and not c.name.endswith("_expanded"):
            yield nodes[0].op_type, c


def with_static_inputs(model, inputs):
    """The model with its static-position inputs moved into initializers, and the rest."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g, node = m.graph, m.graph.node[0]
    names = [i.name for i in g.input]
    static = {node.input[k] for k in STATIC.get(node.op_type, ()) if k < len(node.input)}
    rest = []
    for name, v in zip(names, inputs):
        if name in static:
            g.initializer.append(numpy_helper.from_array(_arr(v), name))
        else:
            rest.append(_arr(v))
    keep = [i for i in g.input if i.name not in static]
    del g.input[:]
    g.input.extend(keep)
    return m, rest


def run_case(case):
    """Run one conformance case through sampan; raise on any difference."""
    for ins, outs in case.data_sets:
        m, args = with_static_inputs(case.model, ins)
        layer = sampan.onnx.to_layer(m)
        got = layer.declared(layer(*args))     # emulated dtypes (onnx/emulate.py) as declared
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(outs)
        for g, e in zip(got, outs):
            e, g = _arr(e), np.asarray(g)
            assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype,
                                                                e.shape)
            np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)


def run_all(op_types=None):
    """op type -> (passing, total, [(case name, error)])."""
    res = collections.defaultdict(lambda: [0, 0, []])
    for op, c in conformance_cases(op_types):
        r = res[op]
        r[1] += 1
        try:
            run_case(c)
            r[0] += 1
        except Exception as e:  # noqa: BLE001 - a report of what failed
            r[2].append((c.name, f"{type(e).__name__}: {str(e)[:200]}"))
    return res


@pytest.fixture
def new_opsets(monkeypatch):
    # onnx 1.23's cases are written at the op's newest opset (up to 28); these op types
    # mean the same from 23 to 28 except where a handler registers a later version
    monkeypatch.setattr(importer, "MAX_OPSET", 28)


def test_conformance_cases_pinned(new_opsets):
    res = run_all()
    got = {op: (p, t) for op, (p, t, _) in res.items()}
    fails = {c: e for _, (_, _, fs) in res.items() for c, e in fs}
    assert got == PINNED, fails
    assert set(fails) == set(FAILS), fails


# ---------------------------------------------------------------------- older opsets
I64 = TensorProto.INT64


def _model(op, opset, inputs, attrs=None, n_out=1, static=()):
    """A one-node model; inputs named in `static` are initializers."""
    names = list(inputs)
    node = helper.make_node(op, [n if inputs[n] is not None else "" for n in names],
                            [f"y{i}" for i in range(n_out)], name="n0", **(attrs or {}))
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                        list(a.shape))
          for n, a in inputs.items() if a is not None and n not in static]
    inits = [numpy_helper.from_array(inputs[n], n) for n in static]
    outs = [helper.make_empty_tensor_value_info(f"y{i}")
            for i in range(n_out)]
    g = helper.make_graph([node], "g", vi, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    args = [a for n, a in inputs.items() if a is not None and n not in static]
    return m, args


# cases the onnx reference cannot run (no Scatter, float OneHot indices, negative pads) or
# runs against the spec (Slice):
# onnxruntime is their reference
ORT = {("Scatter", 9), ("OneHot", 9), ("Pad", 11), ("Slice", 11)}


def _reference(m, inputs, static):
    feeds = {n: a for n, a in inputs.items() if a is not None and n not in static}
    node = m.graph.node[0]
    if (node.op_type, m.opset_import[0].version) in ORT:
        import onnxruntime as ort
        from onnx import shape_inference
        m2 = shape_inference.infer_shapes(m)
        sess = ort.InferenceSession(m2.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(m).run(None, feeds)


R = np.random.default_rng(0)
X = R.standard_normal((2, 3, 4)).astype(np.float32)
X4 = R.standard_normal((1, 8, 2, 3)).astype(np.float32)
XT = np.array([[1, 3, 3, 2], [5, 5, 1, 5]], np.float32)   # ties
NEG = np.array([[0, -1], [-3, 2]], np.int64)
BIG = 2 ** 62

OLD = [   # (op, opset, inputs, attrs, outputs, static inputs)
    ("Reshape", 5, {"x": X, "s": np.array([0, -1], np.int64)}, {}, 1, {"s"}),
    ("Reshape", 14, {"x": np.zeros((0, 3), np.float32), "s": np.array([3, 0], np.int64)},
     {"allowzero": 1}, 1, {"s"}),
    ("Squeeze", 1, {"x": X[:1]}, {"axes": [0]}, 1, ()),
    ("Squeeze", 11, {"x": X[:, :1]}, {"axes": [-2]}, 1, ()),
    ("Squeeze", 13, {"x": X[:1, :1]}, {}, 1, ()),
    ("Unsqueeze", 1, {"x": X}, {"axes": [0, 4]}, 1, ()),
    ("Unsqueeze", 11, {"x": X}, {"axes": [-1, 1]}, 1, ()),
    ("Split", 2, {"x": X}, {"axis": 2, "split": [1, 3]}, 2, ()),
    ("Split", 11, {"x": X}, {"axis": -1}, 2, ()),
    ("Split", 13, {"x": X}, {"axis": 1}, 3, ()),
    ("Split", 18, {"x": np.arange(7, dtype=np.float32)}, {"num_outputs": 3}, 3, ()),
    ("Slice", 1, {"x": X}, {"starts": [1, -3], "ends": [BIG, -1], "axes": [0, 2]}, 1, ()),
    ("Slice", 13, {"x": X, "s": np.array([-1, BIG], np.int64),
                   "e": np.array([-BIG, 0], np.int64), "a": np.array([2, 1], np.int64),
                   "t": np.array([-2, -1], np.int64)}, {}, 1, {"s", "e", "a", "t"}),
    ("Slice", 13, {"x": X, "s": np.array([5], np.int64), "e": np.array([1], np.int64),
                   "a": np.array([-1], np.int64), "t": np.array([-1], np.int64)},
     {}, 1, {"s", "e", "a", "t"}),
    # a negative step from before the start: the spec (and onnxruntime) clamp the start to
    # 0, so the result holds element 0; the onnx reference (Python slicing) gives nothing
    ("Slice", 11, {"x": X, "s": np.array([-100], np.int64), "e": np.array([-BIG], np.int64),
                   "a": np.array([1], np.int64), "t": np.array([-1], np.int64)},
     {}, 1, {"s", "e", "a", "t"}),
    ("Pad", 2, {"x": X}, {"pads": [0, 1, 2, 0, 1, 1], "mode": "reflect"}, 1, ()),
    ("Pad", 11, {"x": X, "p": np.array([0, 1, 0, 1, -1, 2], np.int64),
                 "v": np.array(1.5, np.float32)}, {}, 1, {"p", "v"}),
    ("Pad", 11, {"x": X, "p": np.array([1, 0, 2, 0, 2, 1], np.int64)}, {"mode": "edge"},
     1, {"p"}),
    ("Pad", 18, {"x": X, "p": np.array([1, 2, 3, 0], np.int64), "v": np.array(7.0, np.float32),
                 "a": np.array([-1, 1], np.int64)}, {}, 1, {"p", "v", "a"}),
    ("TopK", 1, {"x": XT}, {"k": 2}, 2, ()),
    ("TopK", 10, {"x": XT, "k": np.array([3], np.int64)}, {"axis": 1}, 2, {"k"}),
    ("TopK", 11, {"x": XT, "k": np.array([2], np.int64)}, {"largest": 0, "axis": -1}, 2, {"k"}),
    ("TopK", 11, {"x": XT, "k": np.array([1], np.int64)}, {"axis": 0}, 2, {"k"}),
    ("ReduceMean", 11, {"x": X}, {"axes": [-1, 0], "keepdims": 0}, 1, ()),
    ("ReduceMean", 1, {"x": X}, {}, 1, ()),
    ("ReduceMean", 18, {"x": X, "a": np.array([], np.int64)}, {"noop_with_empty_axes": 1},
     1, {"a"}),
    ("ReduceSum", 13, {"x": X, "a": np.array([1], np.int64)}, {"keepdims": 0}, 1, {"a"}),
    ("ReduceSum", 13, {"x": X, "a": None}, {"noop_with_empty_axes": 0}, 1, ()),
    ("ReduceSum", 11, {"x": np.array([[1, 2], [3, 4]], np.int32)}, {"axes": [0]}, 1, ()),
    ("ReduceMax", 13, {"x": np.array([[1, 9], [3, 4]], np.int32)}, {"axes": [1]}, 1, ()),
    ("ReduceL2", 18, {"x": X, "a": np.array([], np.int64)}, {"noop_with_empty_axes": 1},
     1, {"a"}),
    ("ReduceLogSumExp", 13, {"x": X}, {"axes": [2]}, 1, ()),
    ("ReduceProd", 13, {"x": X}, {"axes": [0, 1], "keepdims": 0}, 1, ()),
    ("ArgMax", 12, {"x": XT}, {"axis": 1, "select_last_index": 1}, 1, ()),
    ("ArgMin", 12, {"x": XT}, {"axis": -1, "keepdims": 0, "select_last_index": 1}, 1, ()),
    ("ArgMax", 1, {"x": XT}, {}, 1, ()),
    ("Gather", 13, {"x": X, "i": NEG}, {"axis": 1}, 1, ()),
    ("Gather", 13, {"x": X, "i": np.array(-1, np.int64)}, {"axis": 2}, 1, ()),
    ("GatherND", 12, {"x": X, "i": np.array([[[1], [0]], [[2], [-1]]], np.int64)},
     {"batch_dims": 1}, 1, ()),
    ("GatherND", 11, {"x": X, "i": np.array([[1, -2], [0, 0]], np.int64)}, {}, 1, ()),
    ("GatherElements", 13, {"x": X[0], "i": np.array([[0, -1, 1, 2]], np.int64)},
     {"axis": 0}, 1, ()),
    ("ScatterElements", 18, {"x": X[0], "i": np.array([[0, -1], [1, 1]], np.int64),
                             "u": np.ones((2, 2), np.float32) * 9}, {"axis": 1,
                                                                    "reduction": "max"},
     1, ()),
    ("ScatterElements", 16, {"x": X[0], "i": np.array([[0, 0], [1, 1]], np.int64),
                             "u": np.full((2, 2), 2, np.float32)}, {"reduction": "mul"},
     1, ()),
    ("Scatter", 9, {"x": X[0], "i": np.array([[1, 0, 2, 0]], np.int64),
                    "u": np.ones((1, 4), np.float32)}, {"axis": 0}, 1, ()),
    ("ScatterND", 16, {"x": X, "i": np.array([[0, 1], [0, 1], [-1, 0]], np.int64),
                       "u": np.full((3, 4), 3, np.float32)}, {"reduction": "mul"}, 1, ()),
    ("ScatterND", 18, {"x": X, "i": np.array([[1], [0]], np.int64),
                       "u": np.zeros((2, 3, 4), np.float32)}, {"reduction": "min"}, 1, ()),
    ("CumSum", 14, {"x": X, "a": np.array(-1, np.int64)}, {"exclusive": 1, "reverse": 1},
     1, {"a"}),
    ("CumSum", 11, {"x": np.arange(6, dtype=np.int32).reshape(2, 3),
                    "a": np.array(0, np.int32)}, {"exclusive": 1}, 1, {"a"}),
    ("Compress", 11, {"x": X, "c": np.array([True, False, True])}, {"axis": -2}, 1, ()),
    ("Compress", 9, {"x": X, "c": np.array([False, True, False, True])}, {}, 1, ()),
    ("Unique", 11, {"x": np.array([[1, 0], [2, 3], [1, 0], [0, 5]], np.int64)},
     {"axis": 0, "sorted": 0}, 4, ()),
    ("Unique", 11, {"x": np.array([3, 1, 3, 2, 1, 7], np.float32)}, {"sorted": 0}, 4, ()),
    ("OneHot", 11, {"i": np.array([[0, -1], [2, 5]], np.int64), "d": np.array(4, np.int64),
                    "v": np.array([-1, 3], np.float32)}, {"axis": 0}, 1, {"d"}),
    ("OneHot", 9, {"i": np.array([1.7, 0.0], np.float32), "d": np.array([3.0], np.float32),
                   "v": np.array([0, 1], np.float32)}, {}, 1, {"d"}),
    ("DepthToSpace", 1, {"x": X4}, {"blocksize": 2}, 1, ()),
    ("DepthToSpace", 13, {"x": X4}, {"blocksize": 2, "mode": "CRD"}, 1, ()),
    ("SpaceToDepth", 13, {"x": X4[:, :, :2, :2]}, {"blocksize": 2}, 1, ()),
    ("Flatten", 11, {"x": X}, {"axis": -1}, 1, ()),
    ("Flatten", 1, {"x": X}, {"axis": 0}, 1, ()),
    ("Concat", 11, {"a": X, "b": X[:, :1]}, {"axis": -2}, 1, ()),
    ("Transpose", 13, {"x": X}, {"perm": [1, 2, 0]}, 1, ()),
    ("Expand", 13, {"x": X[:, :1], "s": np.array([3, 1, 1, 1], np.int64)}, {}, 1, {"s"}),
    ("Tile", 13, {"x": X, "r": np.array([1, 2, 3], np.int64)}, {}, 1, {"r"}),
    ("Range", 11, {"s": np.array(10, np.int32), "l": np.array(2, np.int32),
                   "d": np.array(-3, np.int32)}, {}, 1, {"s", "l", "d"}),
    ("Trilu", 14, {"x": X, "k": np.array(-1, np.int64)}, {"upper": 0}, 1, {"k"}),
    ("EyeLike", 9, {"x": np.zeros((3, 4), np.int32)}, {"k": 1, "dtype": TensorProto.DOUBLE},
     1, ()),
    ("ConstantOfShape", 9, {"s": np.array([2, 0, 3], np.int64)}, {}, 1, {"s"}),
    ("ReverseSequence", 10, {"x": X[0], "l": np.array([3, 1, 2, 3], np.int64)},
     {"time_axis": 0, "batch_axis": 1}, 1, ()),
]


@pytest.mark.parametrize("op,opset,inputs,attrs,n_out,static", OLD,
                         ids=[f"{c[0]}-{c[1]}-{k}" for k, c in enumerate(OLD)])
def test_opsets_match_the_reference(op, opset, inputs, attrs, n_out, static):
    m, args = _model(op, opset, inputs, attrs, n_out, static)
    want = _reference(m, inputs, static)
    del m.graph.output[:]     # typed from the reference's results, for onnx's checker
    m.graph.output.extend(helper.make_tensor_value_info(
        f"y{i}", helper.np_dtype_to_tensor_dtype(w.dtype), list(w.shape))
        for i, w in enumerate(want))
    got = sampan.onnx.to_layer(m)(*args)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- gradients
D = R.standard_normal((2, 3, 4))
GRAD = [   # (op, opset, float64 inputs (the first is differentiated), attrs, static)
    ("Gather", 13, {"x": D, "i": NEG}, {"axis": 1}, ()),
    ("Slice", 13, {"x": D, "s": np.array([-1], np.int64), "e": np.array([-BIG], np.int64),
                   "a": np.array([2], np.int64), "t": np.array([-2], np.int64)},
     {}, {"s", "e", "a", "t"}),
    ("Pad", 18, {"x": D, "p": np.array([2, 1, 1, 2], np.int64),
                 "v": None, "a": np.array([1, -1], np.int64)}, {"mode": "reflect"},
     {"p", "a"}),
    ("Pad", 19, {"x": D, "p": np.array([0, 1, 2, 0, 2, 3], np.int64)}, {"mode": "wrap"},
     {"p"}),
    ("ReduceL2", 18, {"x": D, "a": np.array([0, 2], np.int64)}, {}, {"a"}),
    ("ReduceLogSumExp", 18, {"x": D, "a": np.array([1], np.int64)}, {"keepdims": 0}, {"a"}),
    ("ReduceMax", 18, {"x": D, "a": np.array([-1], np.int64)}, {}, {"a"}),
    ("ScatterND", 16, {"x": D, "i": np.array([[0, 1], [1, 2]], np.int64),
                       "u": R.standard_normal((2, 4))}, {"reduction": "add"}, ()),
    ("ScatterElements", 18, {"u": R.standard_normal((1, 4)), "x": D[0],
                             "i": np.array([[2, 0, 1, 2]], np.int64)}, {}, ()),
    ("GatherND", 12, {"x": D, "i": np.array([[[1], [0]], [[2], [-1]]], np.int64)},
     {"batch_dims": 1}, ()),
    ("TopK", 11, {"x": D, "k": np.array([2], np.int64)}, {"axis": 1}, {"k"}),
    ("CumSum", 14, {"x": D, "a": np.array(1, np.int64)}, {"exclusive": 1, "reverse": 1},
     {"a"}),
    ("DepthToSpace", 13, {"x": R.standard_normal((1, 4, 2, 3))}, {"blocksize": 2,
                                                                  "mode": "CRD"}, ()),
    ("ReverseSequence", 10, {"x": D[0], "l": np.array([3, 1, 2, 3], np.int64)}, {}, ()),
    ("OneHot", 11, {"v": np.array([0.5, -2.0]), "i": np.array([1, -1, 7], np.int64),
                    "d": np.array(4, np.int64)}, {}, {"d"}),
]


@pytest.mark.parametrize("op,opset,inputs,attrs,static", GRAD,
                         ids=[f"{c[0]}-{c[1]}" for c in GRAD])
def test_gradients_match_finite_differences(op, opset, inputs, attrs, static):
    names = list(inputs)
    if op in ("ScatterElements", "OneHot"):     # the differentiated input is not the first
        order = {"ScatterElements": ["x", "i", "u"], "OneHot": ["i", "d", "v"]}[op]
        inputs = {n: inputs[n] for n in order}
    m, _ = _model(op, opset, inputs, attrs, 1 if op != "TopK" else 2, static)
    want = _reference(m, inputs, static)
    del m.graph.output[:]
    m.graph.output.extend(helper.make_tensor_value_info(
        f"y{i}", helper.np_dtype_to_tensor_dtype(w.dtype), list(w.shape))
        for i, w in enumerate(want))
    layer = sampan.onnx.to_layer(m)
    wrt = names[0]
    w = R.standard_normal(want[0].shape)

    def loss(**over):
        args = [sampan.tensor(over.get(n, a), requires_grad=(n == wrt))
                for n, a in inputs.items() if a is not None and n not in static]
        out = layer(*args)
        out = out[0] if isinstance(out, tuple) else out
        return (out * sampan.tensor(w)).sum(), args

    val, args = loss()
    val.backward()
    g = [a for n, a in zip([n for n in inputs if n not in static], args) if n == wrt][0].grad
    x0, eps, fd = inputs[wrt], 1e-6, np.zeros_like(inputs[wrt])
    for k in range(x0.size):
        for sgn in (1, -1):
            x = x0.copy()
            x.reshape(-1)[k] += sgn * eps
            with sampan.no_grad():
                fd.reshape(-1)[k] += sgn * loss(**{wrt: x})[0].item() / (2 * eps)
    np.testing.assert_allclose(g.numpy(), fd, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- whole models
def _typed(op, opset, inputs, attrs=None, n_out=1, static=()):
    m, args = _model(op, opset, inputs, attrs, n_out, static)
    want = _reference(m, inputs, static)
    del m.graph.output[:]
    m.graph.output.extend(helper.make_tensor_value_info(
        f"y{i}", helper.np_dtype_to_tensor_dtype(w.dtype), list(w.shape))
        for i, w in enumerate(want))
    return m, args, want


def test_torch_exported_model_eager_jit_and_backward():
    torch = pytest.importorskip("torch")
    import io

    class M(torch.nn.Module):
        def forward(self, x, idx):
            y = x.reshape(x.shape[0], -1, 4).transpose(1, 2)       # shape arithmetic
            z = torch.cat([y[:, 1:3], y.flip(-1)[:, :2]], 1)       # Slice (step -1)
            v, i = torch.topk(z, 2, dim=-1)
            s = z.cumsum(1).amax(-1)
            t = x[:, idx].flatten(1).repeat(1, 2)                   # Gather, Tile
            return v, torch.gather(z, 2, i), s, t, z.argmax(1), z.sum((1, 2), keepdim=True)

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(M(), (torch.randn(2, 3, 4), torch.tensor([2, 0])), f, dynamo=False,
                          input_names=["x", "idx"], dynamic_axes={"x": {0: "N"}},
                          opset_version=17)
    layer = sampan.onnx.to_layer(f.getvalue())
    idx = np.array([2, 0])
    traced = sampan.jit(layer, pipeline="inference", dynamic={0: {0: "N"}})
    for n in (2, 5):
        x = torch.randn(n, 3, 4)
        want = [w.numpy() for w in M()(x, torch.tensor(idx))]
        for got in (layer(x.numpy(), idx), traced(sampan.tensor(x.numpy()), sampan.tensor(idx))):
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)
    g = sampan.onnx.load(f.getvalue())
    assert g.inputs[0].shape[0] == "N"
    xt = torch.randn(3, 3, 4, requires_grad=True)
    sum(o.float().sum() for o in M()(xt, torch.tensor(idx))).backward()
    xs = sampan.tensor(xt.detach().numpy(), requires_grad=True)
    sum(sampan.cast(o, sampan.float32).sum() for o in layer(xs, idx)).backward()
    np.testing.assert_allclose(xs.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_data_dependent_ops_run_eagerly_and_refuse_tracing_clearly():
    ins = {"x": np.array([[1, 0], [0, 2]], np.float32)}
    m, args, want = _typed("NonZero", 13, ins)
    layer = sampan.onnx.to_layer(m)
    np.testing.assert_array_equal(layer(*args).numpy(), want[0])
    with pytest.raises(sampan.SampanError, match="depends on the data"):
        sampan.jit(layer)(sampan.tensor(args[0]))


def test_static_inputs_computed_from_data_are_clear_errors():
    ins = {"x": X, "s": np.array([6, 4], np.int64)}
    m, args, _ = _typed("Reshape", 14, ins)
    with pytest.raises(OnnxError, match=r"node 'n0' \(Reshape, opset 14\): the target shape "
                                        "must be known"):
        sampan.onnx.to_layer(m)(*args)
    m, args = _model("Squeeze", 13, {"x": X, "a": np.array([1], np.int64)}, static={"a"})
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2, 3, 4]))
    with pytest.raises(OnnxError, match="cannot squeeze axis 1 of size 3"):
        sampan.onnx.to_layer(m)(*args)


def test_pad_value_computed_from_data_is_differentiable():
    ins = {"x": D, "p": np.array([1, 0, 0, 2], np.int64), "v": np.array(2.5)}
    m, _, want = _typed("Pad", 18, {**ins, "a": np.array([0, 2], np.int64)},
                        static={"p", "a"})
    x, v = sampan.tensor(D, requires_grad=True), sampan.tensor(ins["v"], requires_grad=True)
    y = sampan.onnx.to_layer(m)(x, v)
    np.testing.assert_allclose(y.numpy(), want[0])
    y.sum().backward()
    assert v.grad.item() == want[0].size - D.size and np.all(x.grad.numpy() == 1)


def test_compress_with_a_known_condition_traces():
    ins = {"x": X, "c": np.array([True, False, True])}
    m, args, want = _typed("Compress", 11, ins, {"axis": 1}, static={"c"})
    f = sampan.jit(sampan.onnx.to_layer(m))
    with sampan.no_grad():
        np.testing.assert_array_equal(f(sampan.tensor(args[0])).numpy(), want[0])


def test_dtypes_sampan_lacks_are_onnx_errors_naming_them(new_opsets):
    # uint64 and uint32 are emulated (sampan/onnx/emulate.py): they run
    case = [c for _, c in conformance_cases(["TopK"]) if c.name == "test_top_k_uint64"][0]
    run_case(case)
    m, _ = _model("ConstantOfShape", 9, {"s": np.array([2], np.int64)},
                  {"value": numpy_helper.from_array(np.array([1], np.uint32))}, static={"s"})
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y0", TensorProto.UINT32, [2]))
    layer = sampan.onnx.to_layer(m)
    y = layer.declared(layer())
    assert y.dtype == np.uint32 and y.tolist() == [1, 1]
    m, _ = _model("ConstantOfShape", 9, {"s": np.array([2], np.int64)},
                  {"value": numpy_helper.from_array(np.array([1], np.complex64))},
                  static={"s"})
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y0", TensorProto.COMPLEX64,
                                                             [2]))
    with pytest.raises(OnnxError, match=r"ConstantOfShape.*value is complex64, a dtype"):
        sampan.onnx.to_layer(m)()


@pytest.mark.parametrize("what", ["last", "last3", "flip"])
def test_negative_positions_serve_every_size_under_jit(what):
    # x[:, -1], x[:, -3:] and x.flip(1) on a dynamic axis (a sequence's last token, its
    # tail, reversed): one Gather or Slice whose negative positions stay relative to the end
    if what == "last":
        node, init, want = helper.make_node("Gather", ["x", "i"], ["y"], axis=1), \
            {"i": np.array(-1)}, lambda x: x[:, -1]
    else:
        s, e, t = (-3, BIG, 1) if what == "last3" else (-1, -BIG, -1)
        node, init = helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"]), \
            {"s": np.array([s]), "e": np.array([e]), "a": np.array([1]), "t": np.array([t])}
        want = (lambda x: x[:, -3:]) if what == "last3" else (lambda x: x[:, ::-1])
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "T"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [2] if what == "last" else [2, "U"])],
                          [numpy_helper.from_array(v, k) for k, v in init.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    f = sampan.jit(sampan.onnx.to_layer(m), pipeline="inference", dynamic={0: {1: "T"}})
    for t in (4, 6, 5):
        x = R.standard_normal((2, t)).astype(np.float32)
        with sampan.no_grad():
            np.testing.assert_array_equal(f(sampan.tensor(x)).numpy(), want(x))
