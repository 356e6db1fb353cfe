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
FAILS = {}


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
        got = sampan.onnx.to_layer(m)(*args)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(outs)
        for g, e in zip(got, outs):
            e, g = _arr(e), g.numpy()
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
