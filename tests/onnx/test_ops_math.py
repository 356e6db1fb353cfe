"""Import handlers for ONNX's elementwise math, logic, activation and cast ops: the official
node conformance cases of each op type (pinned pass counts), gradients through imported
models against PyTorch, tracing with symbolic dims, and onnxruntime on a mixed graph.

Cases are built by importing only the onnx.backend.test.case.node modules of these op
types (the whole node suite takes ~10 s to generate). Cases whose model declares an opset
past the importer's newest (23) run with the opset set to 23 where the op's semantics are
unchanged for what they exercise (Cast, CastLike, Celu, Einsum, Mod, BitShift: later
versions add types, float Mod with fmod=0 and signed BitShift, which the handlers read).
Cases needing a dtype sampan lacks and does not emulate (strings; uint16/32/64, float8,
float4, int4/int2 are emulated: sampan/onnx/emulate.py) must fail with an OnnxError.
"""
import importlib
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
from sampan import dtypes as _dt  # noqa: E402
from sampan.onnx.emulate import BY_STORAGE  # noqa: E402

# case module -> (cases passing, cases out of scope: a dtype sampan lacks)
EXPECTED = {
    "abs": (1, 0), "acos": (2, 0), "acosh": (2, 0), "add": (8, 0), "and_": (8, 0),
    "asin": (2, 0), "asinh": (2, 0), "atan": (2, 0), "atanh": (2, 0), "bitshift": (28, 0),
    "bitwiseand": (4, 0), "bitwisenot": (3, 0), "bitwiseor": (4, 0), "bitwisexor": (4, 0),
    "cast": (60, 0), "castlike": (112, 0), "ceil": (2, 0), "celu": (6, 0), "clip": (24, 0),
    "cos": (2, 0), "cosh": (2, 0), "det": (2, 0), "div": (10, 0), "einsum": (9, 0),
    "elu": (6, 0), "equal": (8, 2), "erf": (1, 0), "exp": (2, 0), "floor": (2, 0),
    "gelu": (8, 0), "greater": (8, 0), "greater_or_equal": (16, 0), "hardsigmoid": (6, 0),
    "hardswish": (2, 0), "isinf": (4, 0), "isnan": (2, 0), "leakyrelu": (6, 0),
    "less": (8, 0), "less_or_equal": (16, 0), "log": (2, 0), "max": (14, 0), "mean": (3, 0),
    "min": (14, 0), "mish": (2, 0), "mod": (19, 0), "mul": (9, 0), "neg": (2, 0),
    "not_": (3, 0), "or_": (8, 0), "pow": (12, 0), "prelu": (4, 0), "reciprocal": (2, 0),
    "relu": (2, 0), "round": (1, 0), "selu": (6, 0), "shrink": (4, 0), "sigmoid": (2, 0),
    "sign": (1, 0), "sin": (2, 0), "sinh": (2, 0), "softplus": (4, 0), "softsign": (4, 0),
    "sqrt": (2, 0), "sub": (9, 0), "sum": (3, 0), "tan": (2, 0), "tanh": (2, 0),
    "thresholdedrelu": (6, 0), "where": (2, 0), "xor": (8, 0),
}
MAX_OPSET = 23     # (the cast module's float8 e8m0 cases need their own opset: 25)


_CASES = {}


def _cases(module):
    """The node cases one module of onnx's suite generates (regenerated if another test
    imported it first: onnx refuses a case name twice, so names go in a fresh dict)."""
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


def _arrays(xs):
    return [numpy_helper.to_array(x) if isinstance(x, TensorProto) else x for x in xs]


def _in_scope(case):
    # sampan's dtypes, and those the importer emulates (sampan/onnx/emulate.py)
    known = set(_dt.DTYPES.values()) | set(BY_STORAGE)
    return all(np.asarray(a).dtype in known
               for ins, outs in case.data_sets for a in _arrays(ins) + _arrays(outs))


def _model(case):
    m = case.model
    if m.opset_import[0].version > MAX_OPSET and "e8m0" not in case.name:
        m = onnx.ModelProto()
        m.CopyFrom(case.model)
        m.opset_import[0].version = MAX_OPSET
    return m


def _run(case):
    layer = sampan.onnx.to_layer(_model(case))
    for ins, outs in case.data_sets:
        got = layer.declared(layer(*_arrays(ins)))     # emulated dtypes as declared
        got = got if isinstance(got, tuple) else (got,)
        for g, want in zip(got, _arrays(outs)):
            assert (g.dtype, g.shape) == (want.dtype, want.shape), case.name
            f = BY_STORAGE.get(want.dtype)
            if want.dtype.kind == "f" or want.dtype == _dt.bfloat16 or (f and f.is_float):
                np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64),
                                           rtol=case.rtol, atol=case.atol, err_msg=case.name)
            else:
                np.testing.assert_array_equal(g, want, err_msg=case.name)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # inf and 0 in the Mod cases
@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_node_conformance(module):
    cases = _cases(module)
    passed, failed, out = 0, [], 0
    for case in cases:
        if not _in_scope(case):
            with pytest.raises(sampan.onnx.OnnxError):
                _run(case)
            out += 1
            continue
        try:
            _run(case)
            passed += 1
        except Exception as e:  # noqa: BLE001 - collected and shown below
            failed.append(f"{case.name}: {type(e).__name__}: {e}"[:300])
    assert not failed, "\n".join(failed)
    assert (passed, out) == EXPECTED[module]


# ---------------------------------------------------------------------- helpers
def _one_node(op, inputs, attrs=None, opset=18, inits=(), out_type=None, out_shape=None):
    """A model of one node; `inputs` and `inits` are (name, array); the output's shape is
    the inputs' broadcast unless given."""
    vis = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)) for n, a in inputs]
    node = helper.make_node(op, [n for n, _ in inputs] + [n for n, _ in inits], ["y"],
                            **(attrs or {}))
    if out_shape is None:
        out_shape = np.broadcast_shapes(*(a.shape for _, a in inputs))
    y = helper.make_tensor_value_info("y", out_type or vis[0].type.tensor_type.elem_type,
                                      list(out_shape))
    g = helper.make_graph([node], "g", vis, [y],
                          [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _grads(op, arrays, attrs, opset, out_shape):
    inputs = [(f"x{i}", a) for i, a in enumerate(arrays)]
    layer = sampan.onnx.to_layer(_one_node(op, inputs, attrs, opset, out_shape=out_shape))
    ts = [sampan.tensor(a, requires_grad=True) for a in arrays]
    y = layer(*ts)
    (y * sampan.tensor(np.linspace(-1, 1, y.numel()).reshape(y.shape).astype(y.dtype))).sum() \
        .backward()
    return y.numpy(), [t.grad.numpy() for t in ts]


def _torch_grads(fn, arrays):
    torch = pytest.importorskip("torch")
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = fn(*ts)
    w = torch.tensor(np.linspace(-1, 1, y.numel()).reshape(tuple(y.shape)).astype(
        np.asarray(arrays[0]).dtype))
    (y * w).sum().backward()
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


R = np.random.default_rng(0)


@pytest.mark.parametrize("op, attrs, opset, fn, arrays", [
    ("Selu", {}, 18, lambda t: __import__("torch").nn.functional.selu(t),
     [R.standard_normal((3, 4)).astype(np.float32)]),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 18,
     lambda t: (t * 0.3 + 0.4).clamp(0, 1), [R.standard_normal((3, 4)).astype(np.float32)]),
    ("Gelu", {"approximate": "tanh"}, 20,
     lambda t: __import__("torch").nn.functional.gelu(t, approximate="tanh"),
     [R.standard_normal((2, 5)).astype(np.float32)]),
    ("Pow", {}, 15, lambda a, b: a ** b,
     [R.uniform(0.5, 2, (3, 4)).astype(np.float32), R.uniform(-1, 2, (4,)).astype(np.float32)]),
    ("Div", {}, 14, lambda a, b: a / b,
     [R.standard_normal((3, 4)).astype(np.float32), R.uniform(1, 2, (3, 1)).astype(np.float32)]),
    ("PRelu", {}, 16, lambda x, s: __import__("torch").where(x < 0, x * s, x),
     [R.standard_normal((2, 3, 4)).astype(np.float32), R.uniform(0, 1, (3, 1)).astype(
         np.float32)]),
    ("Einsum", {"equation": "bij,bjk->bik"}, 12,
     lambda a, b: __import__("torch").einsum("bij,bjk->bik", a, b),
     [R.standard_normal((2, 3, 4)).astype(np.float32),
      R.standard_normal((2, 4, 2)).astype(np.float32)]),
    ("Det", {}, 22, lambda a: __import__("torch").linalg.det(a),
     [R.standard_normal((2, 3, 3)).astype(np.float32)]),
    ("Mean", {}, 13, lambda a, b, c: (a + b + c) / 3,
     [R.standard_normal((3, 4)).astype(np.float32), R.standard_normal((4,)).astype(np.float32),
      R.standard_normal((3, 1)).astype(np.float32)]),
])
def test_gradients_match_torch(op, attrs, opset, fn, arrays):
    ty, tgs = _torch_grads(fn, arrays)
    y, gs = _grads(op, arrays, attrs, opset, ty.shape)
    np.testing.assert_allclose(y, ty, rtol=1e-5, atol=1e-5)
    for g, tg in zip(gs, tgs):
        np.testing.assert_allclose(g, tg, rtol=1e-4, atol=1e-5)


def test_clip_bounds_from_initializers_are_trainable():
    x = np.array([-3.0, -0.5, 0.5, 3.0], np.float32)
    m = _one_node("Clip", [("x", x)], opset=13,
                  inits=[("lo", np.array(-1.0, np.float32)), ("hi", np.array(1.0, np.float32))])
    layer = sampan.onnx.to_layer(m)
    y = layer(sampan.tensor(x))
    assert y.numpy().tolist() == [-1.0, -0.5, 0.5, 1.0]
    y.sum().backward()
    grads = {layer.onnx_names[n]: p.grad.numpy() for n, p in layer.named_parameters()}
    assert grads["lo"] == 1.0 and grads["hi"] == 1.0


# ---------------------------------------------------------------------- integer rules
def _ints(op, a, b, **attrs):
    m = _one_node(op, [("a", a), ("b", b)], attrs, opset=14 if op == "Div" else 13)
    return sampan.onnx.to_layer(m)(a, b).numpy()


def test_integer_division_truncates_and_mod_signs():
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    assert _ints("Div", a, b).tolist() == [3, -3, -3, 3, 0]
    assert _ints("Mod", a, b).tolist() == [1, 1, -1, -1, 0]            # divisor's sign
    assert _ints("Mod", a, b, fmod=1).tolist() == [1, -1, 1, -1, 0]    # dividend's sign
    big = np.array([2 ** 62 + 1], np.int64)
    assert _ints("Div", big, np.array([3], np.int64)).tolist() == [(2 ** 62 + 1) // 3]


def test_pow_keeps_the_base_type():
    m = _one_node("Pow", [("a", np.array([2, 3], np.int64)), ("b", np.array([0.5, 2.0],
                                                                            np.float32))],
                  opset=15)
    out = sampan.onnx.to_layer(m)(np.array([2, 3], np.int64), np.array([0.5, 2.0], np.float32))
    assert out.dtype == np.int64 and out.numpy().tolist() == [1, 9]


def test_bit_ops_are_twos_complement():
    a = np.array([-128, -1, 5, 127, -6], np.int8)
    b = np.array([3, -1, 12, -128, 7], np.int8)
    for op, want in [("BitwiseAnd", a & b), ("BitwiseOr", a | b), ("BitwiseXor", a ^ b)]:
        m = _one_node(op, [("a", a), ("b", b)])
        np.testing.assert_array_equal(sampan.onnx.to_layer(m)(a, b).numpy(), want)
    m = _one_node("BitwiseNot", [("a", a)])
    np.testing.assert_array_equal(sampan.onnx.to_layer(m)(a).numpy(), ~a)


def test_legacy_broadcast_attribute():
    a = np.ones((2, 3, 4), np.float32)
    b = np.arange(3, dtype=np.float32)
    m = _one_node("Add", [("a", a), ("b", b)], {"broadcast": 1, "axis": 1}, opset=6,
                  out_shape=a.shape)
    out = sampan.onnx.to_layer(m)(a, b).numpy()
    np.testing.assert_array_equal(out, a + b.reshape(3, 1))


@pytest.mark.parametrize("case", ["cast_to", "mod_types", "where_cond", "bitshift_dir",
                                  "uint16_input"])
def test_bad_nodes_are_onnx_errors(case):
    x = np.ones(3, np.float32)
    if case == "cast_to":
        m = _one_node("Cast", [("x", x)], {"to": TensorProto.STRING}, opset=19,
                      out_type=TensorProto.STRING)
        args, match = (x,), "STRING: sampan has no such dtype"
    elif case == "mod_types":
        m = _one_node("Mod", [("a", x), ("b", x.astype(np.float64))], {"fmod": 1}, opset=13)
        args, match = (x, x.astype(np.float64)), "float32 and float64"
    elif case == "where_cond":
        m = _one_node("Where", [("c", x), ("a", x), ("b", x)], opset=16)
        args, match = (x, x, x), "condition is float32; expected bool"
    elif case == "bitshift_dir":
        i = np.ones(3, np.uint8)
        m = _one_node("BitShift", [("a", i), ("b", i)], {"direction": "UP"}, opset=11)
        args, match = (i, i), "direction='UP'"
    else:
        u = np.ones(3, np.complex64)     # (uint16 is emulated: sampan/onnx/emulate.py)
        m = _one_node("Add", [("a", u), ("b", u)], opset=14)
        args, match = (u, u), "input 'a' is complex64, which sampan has no dtype for"
    with pytest.raises(sampan.onnx.OnnxError, match=match):
        sampan.onnx.to_layer(m)(*args)


# ---------------------------------------------------------------------- tracing, runtime
def _mixed_model():
    """Clip(Selu(x) * w + b, -1, 1) ... a chain over several handlers, batch dim N."""
    w = numpy_helper.from_array(R.standard_normal(4).astype(np.float32), "w")
    lo = numpy_helper.from_array(np.array(-1.5, np.float32), "lo")
    nodes = [helper.make_node("Selu", ["x"], ["s"]),
             helper.make_node("Mul", ["s", "w"], ["m"]),
             helper.make_node("HardSwish", ["m"], ["h"]),
             helper.make_node("Clip", ["h", "lo", ""], ["c"]),
             helper.make_node("Greater", ["c", "lo"], ["g"]),
             helper.make_node("Cast", ["g"], ["gf"], to=TensorProto.FLOAT),
             helper.make_node("Mean", ["c", "gf", "x"], ["y0"]),
             helper.make_node("Gelu", ["y0"], ["y1"]),
             helper.make_node("Pow", ["y1", "two"], ["y"])]
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    g = helper.make_graph(nodes, "mixed",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                          [w, lo, two])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m


def test_mixed_graph_matches_onnxruntime_and_traces():
    ort = pytest.importorskip("onnxruntime")
    m = _mixed_model()
    onnx.checker.check_model(m, full_check=True)
    x = R.standard_normal((5, 4)).astype(np.float32) * 3
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    layer = sampan.onnx.to_layer(m)
    np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-5, atol=1e-6)
    g = sampan.onnx.load(m)
    assert g.inputs[0].shape == ("N", 4)
    f = sampan.jit(layer, pipeline="inference", dynamic={0: {0: "N"}})
    with sampan.no_grad():
        for n in (2, 7):
            xn = R.standard_normal((n, 4)).astype(np.float32)
            np.testing.assert_allclose(f(sampan.tensor(xn)).numpy(),
                                       sess.run(None, {"x": xn})[0], rtol=1e-5, atol=1e-6)


# each handler family once through sampan.jit (the rest run eagerly above)
JIT_CASES = ["test_bitshift_right_int8_negative_input", "test_bitwise_xor_i16_3d",
             "test_bitwise_not_2d", "test_clip_default_int8_min", "test_mod_mixed_sign_int32",
             "test_div_int8", "test_pow_types_int32_float32", "test_cast_FLOAT_to_FLOAT16",
             "test_castlike_FLOAT_to_DOUBLE_expanded", "test_where_long_example",
             "test_max_example", "test_mean_example", "test_einsum_batch_diagonal",
             "test_det_nd", "test_isinf_negative", "test_shrink_soft", "test_prelu_broadcast",
             "test_gelu_tanh_2", "test_hardsigmoid_expanded_ver18", "test_selu_default"]


def test_traced_matches_eager():
    wanted = set(JIT_CASES)
    cases = {c.name: c for m in EXPECTED for c in _cases(m) if c.name in wanted}
    assert set(cases) == wanted
    for name in JIT_CASES:
        case = cases[name]
        layer = sampan.onnx.to_layer(_model(case))
        ins = [sampan.as_tensor(np.asarray(a)) for a in _arrays(case.data_sets[0][0])]
        with sampan.no_grad():
            want = layer(*ins)
            got = sampan.jit(layer, pipeline="inference")(*ins)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_allclose(got.numpy().astype(np.float64),
                                   want.numpy().astype(np.float64), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


# ---------------------------------------------------------------------- every opset version
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "LessOrEqual",
           "GreaterOrEqual", "And", "Or", "Xor", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr",
           "BitwiseXor", "PRelu", "CastLike", "Einsum"}
_N_IN = {"Where": 3, "Sum": 3, "Mean": 3, "Max": 3, "Min": 3}
_ATTRS = {"Cast": {"to": TensorProto.DOUBLE}, "BitShift": {"direction": "RIGHT"},
          "Einsum": {"equation": "ij,kj->ik"}, "Clip": {"min": -0.5, "max": 0.7}}


def _input(op, i, r):
    shape = (3, 4)
    if op in ("And", "Or", "Xor", "Not") or (op == "Where" and i == 0):
        return r.random(shape) > 0.5
    if op == "BitShift":
        return r.integers(0, 6, shape).astype(np.uint8)
    if op.startswith("Bitwise"):
        return r.integers(-50, 50, shape).astype(np.int32)
    if op == "Mod":
        return (r.integers(-9, 9, shape) if i == 0 else
                r.integers(1, 5, shape) * r.choice([-1, 1], shape)).astype(np.int32)
    if op == "CastLike" and i == 1:
        return np.zeros(shape, np.float64)
    lo, hi = {"Log": (0.5, 2), "Sqrt": (0.5, 2), "Reciprocal": (0.5, 2), "Asin": (-.9, .9),
              "Acos": (-.9, .9), "Atanh": (-.9, .9), "Acosh": (1.1, 3)}.get(op, (-2, 2))
    if op in ("Pow", "Div"):
        lo, hi = (0.5, 2) if (op == "Pow") == (i == 0) else (lo, hi)
    if op == "Det":
        shape = (2, 3, 3)
    return r.uniform(lo, hi, shape).astype(np.float32)


def _versions():
    """(op type, since_version) for every schema version <= 23 of each handled op type."""
    from sampan.onnx.ops import HANDLERS, load_all
    load_all()
    mine = ("sampan.onnx.ops.elementwise", "sampan.onnx.ops.activation", "sampan.onnx.ops.cast")
    out = []
    for op in sorted(t for (d, t), fns in HANDLERS.items()
                     if d == "" and fns[0][1].__module__ in mine):
        seen = set()
        for v in range(1, MAX_OPSET + 1):
            try:
                seen.add(onnx.defs.get_schema(op, v).since_version)
            except onnx.defs.SchemaError:
                pass
        out += [(op, v) for v in sorted(seen)]
    return out


def test_every_opset_version_matches_the_reference():
    """Each handled op type at each of its versions (legacy attributes and all) against
    onnx's reference evaluator; Cast-1 and Clip-1, which it lacks, against numpy."""
    from onnx.reference import ReferenceEvaluator
    r = np.random.default_rng(1)
    checked, failed = 0, []
    for op, v in _versions():
        n = _N_IN.get(op, 2 if op in _BINARY else 1)
        ins = [_input(op, i, r) for i in range(n)]
        attrs = dict(_ATTRS.get(op, {}))
        if op == "Clip" and v >= 11:
            attrs, ins = {}, [ins[0], np.array(-0.5, np.float32), np.array(0.7, np.float32)]
        if op == "Cast" and v == 1:
            attrs = {"to": "DOUBLE"}
        names = [f"i{k}" for k in range(len(ins))]
        m = _one_node(op, list(zip(names, ins)), attrs, v, out_shape=(), out_type=1)
        m.ir_version = 7
        if (op, v) in (("Cast", 1), ("Clip", 1)):
            want = (ins[0].astype(np.float64) if op == "Cast" else np.clip(ins[0], -0.5, 0.7))
        else:
            del m.graph.output[:]
            m.graph.output.append(helper.make_value_info("y", onnx.TypeProto()))
            want = ReferenceEvaluator(m).run(None, dict(zip(names, ins)))[0]
        del m.graph.output[:]
        m.graph.output.append(helper.make_tensor_value_info(
            "y", helper.np_dtype_to_tensor_dtype(want.dtype), list(want.shape)))
        try:
            got = sampan.onnx.to_layer(m)(*ins).numpy()
            assert got.dtype == want.dtype, (got.dtype, want.dtype)
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                       rtol=1e-4, atol=1e-5)
            checked += 1
        except Exception as e:  # noqa: BLE001 - collected and shown below
            failed.append(f"{op}-{v}: {type(e).__name__}: {e}"[:300])
    assert not failed, "\n".join(failed)
    assert checked == 192
