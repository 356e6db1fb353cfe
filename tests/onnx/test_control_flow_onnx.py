"""ONNX control flow (issue 34): If / Loop / Scan and the sequence ops imported
(sampan/onnx/ops/control.py, sequence.py), checked against the node suite's own outputs
and numpy; under sampan.jit they become cond / while_loop / scan nodes."""
import importlib
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import sampan  # noqa: E402
from sampan.onnx import OnnxError  # noqa: E402

be = pytest.importorskip("sampan.onnx.backend")

_MODULES = ("if_", "loop", "scan", "sequence_map", "sequenceinsert", "splittosequence",
            "optionalgetelement", "optionalhaselement")
CONTROL = {"If": 3, "Loop": 3, "Scan": 4, "SequenceMap": 12, "SequenceInsert": 2,
           "SplitToSequence": 3, "OptionalGetElement": 4, "OptionalHasElement": 7}


def _suite():
    """The node-suite cases of these op types (their case modules only: under a second)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in _MODULES:
            importlib.import_module(f"onnx.backend.test.case.node.{m}")
    from onnx.backend.test.case.node import _NodeTestCases
    by_name = {c.name: c for c in _NodeTestCases}
    return [(be.case_op_type(c, by_name), c) for c in _NodeTestCases
            if be.case_op_type(c, by_name) in CONTROL]


def test_node_suite_control_flow_and_sequence_cases_pass():
    counts, failed = {}, {}
    for op, c in _suite():
        ok, err, _ = be.run_case(be.SampanBackend, c)
        counts[op] = counts.get(op, 0) + 1
        if not ok:
            failed[c.name] = err
    assert not failed, failed
    assert counts == CONTROL


# ---------------------------------------------------------------------- helpers
def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def _f(name, shape):
    return _vi(name, TensorProto.FLOAT, shape)


def _model(nodes, inputs, outputs, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, a):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(
        np.asarray(a), name + "_v"))


def _while_model():
    """x doubled while its sum is below `limit` (a data-dependent condition), at most M
    times; M and limit are graph inputs."""
    body = helper.make_graph(
        [_const("two", np.float32(2)), helper.make_node("Mul", ["x_in", "two"], ["x_out"]),
         helper.make_node("ReduceSum", ["x_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["c_out"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("c_in", TensorProto.BOOL, []),
                 _f("x_in", [3])],
        [_vi("c_out", TensorProto.BOOL, []), _f("x_out", [3])])
    loop = helper.make_node("Loop", ["M", "c0", "x"], ["y"], body=body)
    first = [helper.make_node("ReduceSum", ["x"], ["s0"], keepdims=0),
             helper.make_node("Less", ["s0", "limit"], ["c0"])]
    return _model(first + [loop], [_vi("M", TensorProto.INT64, []), _f("limit", []),
                                   _f("x", [3])], [_f("y", [3])])


def _numpy_while(m, limit, x):
    i = 0
    while i < m and x.sum() < limit:
        x = x * 2
        i += 1
    return x


def _scan_model(reverse=False, axis=0):
    """A running sum over axis `axis` of x (optionally backwards), the state a graph
    input, the body reading `scale` from the enclosing graph."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "scale"], ["y_t"])],
        "body", [_f("s_in", [2]), _f("x_t", [2])], [_f("s_out", [2]), _f("y_t", [2])])
    shape = [4, 2] if axis == 0 else [2, 4]
    node = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[int(reverse)],
                            scan_output_directions=[int(reverse)],
                            scan_input_axes=[axis], scan_output_axes=[axis])
    return _model([_const("scale", np.float32(0.5)), node], [_f("s0", [2]), _f("x", shape)],
                  [_f("s", [2]), _f("ys", shape)])


def _numpy_scan(s, x, reverse, axis):
    xs = np.moveaxis(x, axis, 0)
    order = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    ys = np.zeros_like(xs)
    for t in order:
        s = s + xs[t]
        ys[t] = s * 0.5
    return s, np.moveaxis(ys, 0, axis)


# ---------------------------------------------------------------------- eager import
def test_loop_with_a_data_condition_and_trip_count_runs_eagerly():
    layer = sampan.onnx.to_layer(_while_model())
    x = np.array([1, 2, 3], np.float32)
    for m, limit in ((10, 50.0), (2, 1000.0), (0, 50.0), (5, 1.0)):
        y = layer(np.array(m, np.int64), np.array(limit, np.float32), x)
        np.testing.assert_array_equal(y.numpy(), _numpy_while(m, limit, x))


@pytest.mark.parametrize("reverse,axis", [(False, 0), (True, 0), (True, 1)])
def test_scan_directions_and_axes_match_numpy(reverse, axis):
    rng = np.random.default_rng(0)
    s0 = rng.standard_normal(2).astype(np.float32)
    x = rng.standard_normal([4, 2] if axis == 0 else [2, 4]).astype(np.float32)
    s, ys = be.prepare(_scan_model(reverse, axis)).run([s0, x])
    want_s, want_ys = _numpy_scan(s0, x, reverse, axis)
    np.testing.assert_allclose(s, want_s, rtol=1e-6)
    np.testing.assert_allclose(ys, want_ys, rtol=1e-6)


def test_sequence_ops_with_constant_positions():
    """SplitToSequence -> SequenceErase / SequenceInsert at constant positions ->
    SequenceAt, SequenceLength and ConcatFromSequence (new axis)."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["sq"], axis=0, keepdims=0),
             _const("p0", np.int64(0)), _const("pm1", np.int64(-1)),
             helper.make_node("SequenceErase", ["sq", "p0"], ["sq1"]),
             helper.make_node("SequenceInsert", ["sq1", "z", "pm1"], ["sq2"]),
             helper.make_node("SequenceLength", ["sq2"], ["n"]),
             helper.make_node("SequenceAt", ["sq2", "p0"], ["first"]),
             helper.make_node("ConcatFromSequence", ["sq2"], ["st"], axis=0, new_axis=1)]
    m = _model(nodes, [_f("x", [3, 2]), _f("z", [2])],
               [_vi("n", TensorProto.INT64, []), _f("first", [2]), _f("st", [3, 2])])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    z = np.array([-1, -2], np.float32)
    n, first, st = be.prepare(m).run([x, z])
    assert int(n) == 3
    np.testing.assert_array_equal(first, x[1])
    np.testing.assert_array_equal(st, np.stack([x[1], z, x[2]]))


def test_sequence_position_from_data_is_refused_under_jit():
    """Eagerly a position computed from data is known; in a traced program a sequence
    has no place to be, so the node is named."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["sq"], axis=0),
             helper.make_node("ArgMax", ["v"], ["p"], keepdims=0),
             helper.make_node("SequenceAt", ["sq", "p"], ["y"], name="pick")]
    m = _model(nodes, [_f("x", [3, 2]), _f("v", [3])], [_f("y", [1, 2])])
    layer = sampan.onnx.to_layer(m)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    v = np.array([0, 5, 1], np.float32)
    np.testing.assert_array_equal(layer(x, v).numpy(), x[1:2])
    with pytest.raises(OnnxError, match=r"'pick' \(SequenceAt.*position must be known"):
        sampan.onnx.load(m)


def test_malformed_bodies_are_refused_when_read():
    body = helper.make_graph([], "b", [_f("only", [1])], [_f("only", [1])])
    m = _model([helper.make_node("Loop", ["", "", "x"], ["y"], name="lp", body=body)],
               [_f("x", [1])], [_f("y", [1])])
    with pytest.raises(OnnxError, match=r"'lp' \(Loop\): the body takes 1 inputs"):
        sampan.onnx.to_layer(m)
