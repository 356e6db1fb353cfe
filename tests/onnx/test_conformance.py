"""The ONNX node conformance suite through `sampan.onnx.backend`, in `make test`.

Every case that `onnx.backend.test.loader.load_model_tests(kind="node")` generates (1,884
with onnx 1.23) runs through `SampanBackend` with the onnx runner's comparison (shapes,
dtypes, each case's rtol/atol). PASSED_AT_LEAST pins the count: the test fails when fewer
pass, and the pin may only go up. `pytest -s` prints the per-op table (op type, cases,
passed); `benchmarks/onnx_conformance.py` sets it beside onnxruntime's.
"""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from sampan.onnx import OnnxError  # noqa: E402

be = pytest.importorskip("sampan.onnx.backend")

PASSED_AT_LEAST = 1824       # raise it as handlers land; never lower it
N_CASES = 1884               # onnx 1.23's node suite


@pytest.fixture(scope="module")
def results():
    cases = be.node_cases()
    return cases, be.run_cases(cases)


def test_node_suite_pass_count(results):
    cases, res = results
    if onnx.__version__.startswith("1.23"):
        assert len(cases) == N_CASES
    table = be.per_op(res)
    passed = sum(r.passed for r in res)
    print(f"\n{'op type':<36}{'cases':>6}{'passed':>8}")
    for op, (n, p) in table.items():
        print(f"{op:<36}{n:>6}{p:>8}{'' if p == n else '  *'}")
    print(f"{'total':<36}{len(res):>6}{passed:>8}  ({len(table)} op types, "
          f"{sum(p == n for n, p in table.values())} fully passed; "
          f"{sum(r.passed and r.specialized for r in res)} with inputs bound as constants)")
    assert passed >= PASSED_AT_LEAST, (
        f"{passed} node cases pass; {PASSED_AT_LEAST} did before. Failing now: "
        + ", ".join(f"{r.name} ({r.error})" for r in res if not r.passed)[:3000])
    # every failure says why, as a sampan error or a comparison (never an empty message)
    assert all(r.error for r in res if not r.passed)


def _one(op, x, y, attrs=None, opset=17, t=TensorProto.FLOAT):
    node = helper.make_node(op, ["x"], ["y"], **(attrs or {}))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", t, x)],
                          [helper.make_tensor_value_info("y", t, y)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_backend_api():
    assert be.supports_device("CPU") and not be.supports_device("CUDA")
    m = _one("Identity", ["N", 3], ["N", 3])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    rep = be.prepare(m, "CPU")
    (y,) = rep.run([x])
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_array_equal(y, x)
    assert rep.run({"x": x}).y.tolist() == x.tolist()        # outputs by name
    np.testing.assert_array_equal(be.run_model(m.SerializeToString(), [x])[0], x)
    (s,) = be.run_node(helper.make_node("Shape", ["a"], ["b"]), [x])
    assert s.tolist() == [2, 3] and s.dtype == np.int64
    with pytest.raises(OnnxError, match="CUDA"):
        be.prepare(m, "CUDA")


def test_inputs_the_graph_needs_static_are_bound_at_run():
    """Unsqueeze's axes as a graph input: sampan needs them when the graph is built, so
    the backend binds the fed values as constants (one model per distinct value)."""
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    g = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    rep = be.prepare(m)
    x = np.ones((2, 3), np.float32)
    for ax, shape in ((0, (1, 2, 3)), (2, (2, 3, 1)), (0, (1, 2, 3))):
        (y,) = rep.run([x, np.array([ax], np.int64)])
        assert y.shape == shape and rep.specialized
    assert len(rep._special) == 2
    (y,) = rep.run({"x": x, "axes": np.array([1], np.int64)})
    assert y.shape == (2, 1, 3)


def test_inputs_sampan_cannot_hold_name_the_dtype():
    # (uint16/32/64, float8, int4 ... are emulated: sampan/onnx/emulate.py; complex is not)
    m = _one("Identity", [3], [3], t=TensorProto.COMPLEX64)
    with pytest.raises(OnnxError, match="complex64"):
        be.prepare(m).run([np.zeros(3, np.complex64)])


def test_case_op_type_counts_expanded_cases_under_their_op():
    def case(name, ops):
        nodes = [helper.make_node(o, ["x"], ["x"]) for o in ops]
        m = helper.make_model(helper.make_graph(nodes, name, [], []))
        return type("C", (), {"name": name, "model": m})()
    base = case("test_softmax_axis_0", ["Softmax"])
    exp = case("test_softmax_axis_0_expanded_ver18", ["ReduceMax", "Sub", "Exp"])
    by_name = {c.name: c for c in (base, exp)}
    assert be.case_op_type(base, by_name) == "Softmax"
    assert be.case_op_type(exp, by_name) == "Softmax"


@pytest.mark.slow
def test_official_runner_agrees(results):
    """The onnx package's own unittest runner passes the cases the direct loop passes
    (slow: it generates every kind of case first)."""
    import re
    import unittest
    from onnx.backend.test.runner import Runner
    passing = [r.name for r in results[1] if r.passed][:40]
    assert passing
    r = Runner(be.SampanBackend, __name__)
    r.include("^(" + "|".join(re.escape(n) for n in passing) + ")_cpu$")
    out = unittest.TextTestRunner(verbosity=0).run(r.test_suite)
    assert len(out.skipped) == out.testsRun - len(passing)
    assert out.wasSuccessful(), out.failures + out.errors
