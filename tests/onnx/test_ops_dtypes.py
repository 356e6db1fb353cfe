"""The ONNX dtypes sampan emulates at the import boundary (`sampan/onnx/emulate.py`) and the
quantisation handlers (`sampan/onnx/ops/quant.py`): the official node cases of the quant
op types (pinned pass counts, through `sampan.onnx.backend`), unsigned wrap-around and
float8 rounding/saturation against numpy, ml_dtypes and onnxruntime, the uint64 limits,
tracing, and a gradient through DequantizeLinear's scale.
"""
import importlib
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
import sampan.onnx.backend as be  # noqa: E402
from sampan.onnx import OnnxError  # noqa: E402
from sampan.onnx import emulate as em  # noqa: E402

# case module -> cases passing (all of each module's cases)
EXPECTED = {"quantizelinear": 13, "dequantizelinear": 14, "dynamicquantizelinear": 6,
            "qlinearmatmul": 8, "qlinearconv": 1, "convinteger": 2, "matmulinteger": 1,
            "bitcast": 9}
N_CASES = {"bitcast": 10}     # 2-D float BitCast: sampan has no bit-view op for data

_CASES = {}


def _cases(module):
    """The node cases of one module of onnx's suite (fresh names, as in test_ops_math)."""
    if module in _CASES:
        return _CASES[module]
    import onnx.backend.test.case.node as node_cases
    name = "onnx.backend.test.case.node." + module
    before = len(node_cases._NodeTestCases)
    saved, node_cases._existing_names = node_cases._existing_names, {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if name in sys.modules:
                importlib.reload(sys.modules[name])
            else:
                importlib.import_module(name)
    finally:
        for k, v in node_cases._existing_names.items():
            saved.setdefault(k, v)
        node_cases._existing_names = saved
    _CASES[module] = node_cases._NodeTestCases[before:]
    return _CASES[module]


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_node_conformance(module):
    cases = _cases(module)
    res = [(c.name, *be.run_case(be.SampanBackend, c)) for c in cases]
    failed = [f"{n}: {e}" for n, ok, e, _ in res if not ok]
    assert len(cases) == N_CASES.get(module, EXPECTED[module])
    assert sum(ok for _, ok, _, _ in res) == EXPECTED[module], "\n".join(failed)
    assert all("OnnxError" in f for f in failed)      # refused clearly, never wrong


# ---------------------------------------------------------------------- helpers
def _model(nodes, inputs, outputs, opset=21):
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ort(m, feeds, as_type=None):
    """onnxruntime's outputs; `as_type`: the one output cast to it first (onnxruntime
    returns no float8/int4 numpy arrays)."""
    ort = pytest.importorskip("onnxruntime")
    if as_type is not None:
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        out = m2.graph.output[0]
        m2.graph.node.append(helper.make_node("Cast", [out.name], ["as"], to=as_type))
        m2.graph.output[0].CopyFrom(helper.make_tensor_value_info("as", as_type, None))
        m = m2
    try:
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - a type onnxruntime has no kernel for
        pytest.skip(f"onnxruntime cannot run it: {str(e)[:80]}")
    return s.run(None, feeds)


# ---------------------------------------------------------------------- unsigned integers
U32 = TensorProto.UINT32


def _uint_chain(t=U32, opset=18):
    """(a - b) * c, ~(a - b), a << 5, (a - b) / c, (a - b) > b over one unsigned type."""
    nodes = [helper.make_node("Sub", ["a", "b"], ["d"]),
             helper.make_node("Mul", ["d", "c"], ["p"]),
             helper.make_node("BitwiseNot", ["d"], ["n"]),
             helper.make_node("BitShift", ["a", "five"], ["s"], direction="LEFT"),
             helper.make_node("Div", ["d", "c"], ["q"]),
             helper.make_node("Greater", ["d", "b"], ["g"])]
    five = numpy_helper.from_array(
        np.array([5], helper.tensor_dtype_to_np_dtype(t)), "five")
    m = _model(nodes, [(n, t, [4]) for n in "abc"],
               [("p", t, [4]), ("n", t, [4]), ("s", t, [4]), ("q", t, [4]),
                ("g", TensorProto.BOOL, [4])], opset)
    m.graph.initializer.append(five)
    return m


@pytest.mark.parametrize("t", [TensorProto.UINT16, TensorProto.UINT32])
def test_unsigned_wrap_around_matches_numpy(t):
    dt = helper.tensor_dtype_to_np_dtype(t)
    top = np.iinfo(dt).max
    a = np.array([1, 7, top, top - 3], dt)
    b = np.array([2, 3, 1, top], dt)
    c = np.array([top, 3, 2, 7], dt)
    with np.errstate(all="ignore"):
        d = a - b
        want = [d * c, ~d, a << dt.type(5), d // c, d > b]
    got = be.prepare(_uint_chain(t)).run([a, b, c])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_unsigned_wrap_around_matches_onnxruntime():
    a = np.array([1, 7, 2**32 - 1, 5], np.uint32)
    b = np.array([2, 3, 1, 2**32 - 1], np.uint32)
    c = np.array([2**32 - 1, 3, 2, 7], np.uint32)
    m = _uint_chain()
    want = _ort(m, {"a": a, "b": b, "c": c})
    for g, w in zip(be.prepare(m).run([a, b, c]), want):
        np.testing.assert_array_equal(g, w)


def test_uint64_carried_as_bits_and_refused_where_sign_matters():
    m = _model([helper.make_node("Sub", ["a", "b"], ["d"])],
               [("a", TensorProto.UINT64, [2]), ("b", TensorProto.UINT64, [2])],
               [("d", TensorProto.UINT64, [2])])
    (d,) = be.prepare(m).run([np.array([1, 5], np.uint64), np.array([2, 1], np.uint64)])
    assert d.dtype == np.uint64 and d.tolist() == [2**64 - 1, 4]       # wrapped, as numpy
    with pytest.raises(OnnxError, match="uint64 and holds 9223372036854775808"):
        be.prepare(m).run([np.array([2**63, 1], np.uint64), np.array([1, 1], np.uint64)])
    m2 = _model([helper.make_node("Sub", ["a", "b"], ["d"]),
                 helper.make_node("Div", ["d", "b"], ["q"])],
                [("a", TensorProto.UINT64, [2]), ("b", TensorProto.UINT64, [2])],
                [("q", TensorProto.UINT64, [2])])
    with pytest.raises(OnnxError, match=r"Div on it would be wrong"):
        be.prepare(m2).run([np.array([1, 5], np.uint64), np.array([2, 1], np.uint64)])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # Div by the zeros it traces with
def test_emulated_model_traces_with_sampan_jit():
    g = sampan.onnx.load(_uint_chain(TensorProto.UINT16))
    assert "mod" in str(g)              # the wrap-around is in the graph, not a side step


# ---------------------------------------------------------------------- float8
_F8 = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
       TensorProto.FLOAT8E5M2FNUZ]
_X = np.array([0.0, -0.0, 1e-9, -1e-9, 0.3, -1.7, 17.3, 240.0, 250.0, 448.0, 465.0,
               -1000.0, 57344.0, 70000.0, np.inf, -np.inf, np.nan], np.float32)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # inf / inf inside the rounding
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("t", _F8)
def test_float8_cast_rounds_and_saturates_as_onnx(t, saturate):
    dt = helper.tensor_dtype_to_np_dtype(t)
    m = _model([helper.make_node("Cast", ["x"], ["y"], to=t, saturate=saturate)],
               [("x", TensorProto.FLOAT, [len(_X)])], [("y", t, [len(_X)])], opset=19)
    (y,) = be.prepare(m).run([_X])
    assert y.dtype == dt
    want = numpy_helper.saturate_cast(_X, dt) if saturate else _X.astype(dt)
    # the same bits (NaN: any NaN)
    same = (y.view(np.uint8) == want.view(np.uint8)) | np.isnan(want.astype(np.float32))
    assert same.all()
    if t in (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2):
        (o,) = _ort(m, {"x": _X}, TensorProto.FLOAT)
        np.testing.assert_array_equal(o, y.astype(np.float32))


def test_round_to_grid_is_exact_against_ml_dtypes():
    """Every float8/float4 value, every midpoint between neighbours and one ulp either side:
    round_to (sampan ops) gives ml_dtypes' conversion bit for bit."""
    for f in em.FORMATS.values():
        if not f.is_float or f.name == "FLOAT8E8M0":
            continue
        n = 256 if f.name != "FLOAT4E2M1" else 16
        v = np.arange(n, dtype=np.uint8)
        vals = (v.view(f.storage) if n == 256 else v.astype(f.storage)).astype(np.float32)
        if n == 16:
            vals = np.unique(np.array([ml_dtypes.float4_e2m1fn(x) for x in
                                       np.linspace(-6, 6, 25)], np.float32))
        vals = np.sort(vals[np.isfinite(vals)])
        mid = (vals[1:] + vals[:-1]) / 2
        xs = np.concatenate([vals, mid, np.nextafter(mid, np.inf),
                             np.nextafter(mid, -np.inf)]).astype(np.float32)
        got = em.round_to(sampan.Tensor(xs), f, saturate=False).numpy()
        np.testing.assert_array_equal(got.astype(f.storage).view(np.uint8),
                                      xs.astype(f.storage).view(np.uint8), err_msg=f.name)


# ---------------------------------------------------------------------- quantisation
def test_quantize_linear_int4_blocked_matches_onnxruntime():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 12)
    scale = np.array([[0.25, 0.5, 1.0], [0.1, 0.2, 0.4]], np.float32)
    zp = numpy_helper.from_array(np.zeros((2, 3), ml_dtypes.int4), "zp")
    m = _model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], axis=1,
                                 block_size=4)],
               [("x", TensorProto.FLOAT, [2, 12]), ("s", TensorProto.FLOAT, [2, 3])],
               [("y", TensorProto.INT4, [2, 12])])
    m.graph.initializer.append(zp)
    (y,) = be.prepare(m).run([x, scale])
    assert y.dtype == ml_dtypes.int4
    s = np.repeat(scale, 4, axis=1)
    np.testing.assert_array_equal(y.astype(np.int8),
                                  np.clip(np.rint(x / s), -8, 7).astype(np.int8))
    (o,) = _ort(m, {"x": x, "s": scale}, TensorProto.INT8)
    np.testing.assert_array_equal(y.astype(np.int8), o)


def test_dequantize_linear_scale_is_trainable():
    """DequantizeLinear's scale as an initializer is a Parameter; its gradient is
    sum((x - zp) * dy)."""
    x = np.array([[-3, 0, 5], [7, -8, 2]], np.int8)
    m = _model([helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"], axis=1)],
               [("x", TensorProto.INT8, [2, 3])], [("y", TensorProto.FLOAT, [2, 3])])
    m.graph.initializer.extend([
        numpy_helper.from_array(np.array([0.5, 0.25, 2.0], np.float32), "s"),
        numpy_helper.from_array(np.array([1, 0, -1], np.int8), "zp")])
    layer = sampan.onnx.to_layer(m)
    y = layer(x)
    sampan.sum(y).backward()
    (p,) = list(layer.parameters())
    want = (x.astype(np.float32) - np.array([1, 0, -1], np.float32)).sum(0)
    np.testing.assert_allclose(p.grad.numpy(), want)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_quant_and_float8_graph_traces_with_dynamic_batch_and_matches_onnxruntime():
    """Quantize/Dequantize (int4 zero point), a float8 round trip and DynamicQuantizeLinear
    under sampan.jit with a symbolic batch: the same numbers as eager and onnxruntime."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"]),
             helper.make_node("Cast", ["x"], ["f8"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Cast", ["f8"], ["z"], to=TensorProto.FLOAT),
             helper.make_node("DynamicQuantizeLinear", ["x"], ["dq", "ds", "dz"])]
    m = _model(nodes, [("x", TensorProto.FLOAT, ["N", 4])],
               [("y", TensorProto.FLOAT, ["N", 4]), ("z", TensorProto.FLOAT, ["N", 4]),
                ("dq", TensorProto.UINT8, ["N", 4])])
    m.graph.initializer.extend([numpy_helper.from_array(np.float32(0.1), "s"),
                                numpy_helper.from_array(np.array(3, ml_dtypes.int4), "zp")])
    layer = sampan.onnx.to_layer(m)
    f = sampan.jit(layer, dynamic={0: {0: "N"}})
    for n in (3, 5):
        x = np.random.default_rng(n).normal(size=(n, 4)).astype(np.float32) * 3
        with sampan.no_grad():
            traced, eager = f(sampan.tensor(x)), layer(x)
        for a, b in zip(traced, eager):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        for a, b in zip(layer.declared(eager), _ort(m, {"x": x})):
            np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=1e-6)


@pytest.mark.parametrize("src,dst,a", [
    (TensorProto.INT8, TensorProto.UINT8, np.array([-128, -1, 0, 127], np.int8)),
    (TensorProto.UINT16, TensorProto.INT16, np.array([0, 65535, 32768, 32767], np.uint16)),
    (TensorProto.INT32, TensorProto.UINT32, np.array([-1, -2**31, 5], np.int32)),
    (TensorProto.BOOL, TensorProto.UINT8, np.array([True, False]))])
def test_integer_bitcast_on_data_is_wrap_around(src, dst, a):
    m = _model([helper.make_node("BitCast", ["x"], ["y"], to=dst)], [("x", src, [len(a)])],
               [("y", dst, [len(a)])], opset=26)
    layer = sampan.onnx.to_layer(m)
    y = layer.declared(layer(a))          # data, not bound: sampan ops, no bit view
    want = a.view(helper.tensor_dtype_to_np_dtype(dst))
    assert y.dtype == want.dtype and y.tolist() == want.tolist()
