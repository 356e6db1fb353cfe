"""ONNX import of the NN ops (sampan/onnx/ops/nn*.py, rnn.py): the official node
conformance cases of every claimed op type, run eagerly and pinned per op type; the
nodes of real PyTorch exports (MLP, LeNet, ResNet block with BatchNorm,
TransformerEncoderLayer, LSTM, GPT-style decoder) against onnxruntime; tracing with
`sampan.jit`; and gradients through imported nodes against finite differences."""
import functools
import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper

import sampan
from sampan.onnx import OnnxError

# cases passing per op type (of the cases made only of these op types)
EXPECTED = {"AffineGrid": 4, "Attention": 89, "AveragePool": 20, "BatchNormalization": 4,
            "Col2Im": 5, "Conv": 6, "ConvTranspose": 11, "Dropout": 8, "GRU": 6, "Gemm": 11,
            "GlobalAveragePool": 2, "GlobalMaxPool": 2, "GridSample": 18,
            "GroupNormalization": 2, "Hardmax": 7, "InstanceNormalization": 2, "LRN": 2,
            "LSTM": 6, "LayerNormalization": 19, "LogSoftmax": 7, "LpNormalization": 6,
            "LpPool": 8, "MatMul": 7, "MatMulInteger": 1, "MaxPool": 19, "MaxUnpool": 2,
            "MeanVarianceNormalization": 1, "RNN": 6, "Resize": 39, "Softmax": 7,
            "Upsample": 1}
OPS = tuple(EXPECTED)                 # the op types this table claims
# training-mode Dropout draws from sampan's generator, not numpy's: its values differ
RANDOM = {"test_training_dropout", "test_training_dropout_mask", "test_training_dropout_default",
          "test_training_dropout_default_mask"}
# bf16 results one rounding away from the reference's (rtol 1e-3 is below bf16's step)
BF16 = {"test_attention_4d_causal_bf16", "test_attention_3d_causal_bf16",
        "test_attention_4d_padded_kv_bf16", "test_attention_4d_causal_padded_kv_bf16"}


@functools.cache
def _cases():
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        allc = load_model_tests(kind="node")
    out = []
    for c in allc:
        ops = [n.op_type for n in c.model.graph.node]
        mine = [o for o in ops if o in OPS]
        if mine and all(o in OPS or o in ("Constant", "Identity") for o in ops):
            out.append((mine[0], c))
    return out


def _run_case(c):
    layer = sampan.onnx.to_layer(c.model)
    for ins, outs in c.data_sets:
        got = layer(*ins)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(outs)
        for g, e in zip(got, outs):
            g = g.numpy()
            assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype)
            assert np.allclose(g, e, rtol=c.rtol, atol=c.atol, equal_nan=True)


def test_conformance_cases_pass_per_op_type():
    passed, failed = {}, {}
    for op, c in _cases():
        try:
            with np.errstate(all="ignore"):
                _run_case(c)
            passed[op] = passed.get(op, 0) + 1
        except (AssertionError, OnnxError) as e:
            failed[c.name] = f"{type(e).__name__}: {str(e)[:120]}"
    # opset 24/25 Attention features (nonpad_kv_seqlen, window sizes) are handled now:
    # no Attention case is refused
    newer = {n for n, why in failed.items()
             if why.startswith("OnnxError") and "(Attention, opset 2" in why}
    assert set(failed) == RANDOM | BF16, failed
    # at least the pinned counts: run after the other onnx tests, MatMulInteger counts one
    # more case than alone (not explained yet)
    assert all(passed.get(k, 0) >= v for k, v in EXPECTED.items()), passed
    assert not newer


def _one_node(op, inputs, outputs, opset=17, inits=(), **attrs):
    node = helper.make_node(op, [i.name for i in inputs] + [t.name for t in inits],
                            [o.name for o in outputs], **attrs)
    g = helper.make_graph([node], "g", inputs, outputs, list(inits))
    return _typed(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def _typed(m):
    """Outputs written without a shape take the one onnx's shape inference gives."""
    inf = onnx.shape_inference.infer_shapes(m)
    known = {v.name: v for v in list(inf.graph.value_info) + list(inf.graph.output)}
    for o in m.graph.output:
        if not o.type.tensor_type.HasField("shape") and o.name in known:
            o.type.CopyFrom(known[o.name].type)
    return m


def _vi(name, shape, t=TensorProto.DOUBLE):
    return helper.make_tensor_value_info(name, t, shape)


def _grad(model, *shapes, seed=0):
    layer = sampan.onnx.to_layer(model)
    rng = np.random.default_rng(seed)
    xs = [sampan.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]
    assert sampan.autograd.gradcheck(lambda *a: layer(*a), xs, atol=1e-5, rtol=1e-4)


def test_grad_conv_asymmetric_pads_and_groups():
    m = _one_node("Conv", [_vi("x", [1, 4, 5, 6]), _vi("w", [2, 2, 3, 2])], [_vi("y", None)],
                  pads=[1, 0, 0, 1], strides=[2, 1], group=2)
    _grad(m, (1, 4, 5, 6), (2, 2, 3, 2))


def test_grad_conv_transpose_3d_output_padding():
    m = _one_node("ConvTranspose", [_vi("x", [1, 2, 2, 3, 2]), _vi("w", [2, 1, 2, 2, 2])],
                  [_vi("y", None)], strides=[2, 1, 2], output_padding=[1, 0, 0])
    _grad(m, (1, 2, 2, 3, 2), (2, 1, 2, 2, 2))


def test_grad_pools_and_layer_norm():
    _grad(_one_node("AveragePool", [_vi("x", [1, 2, 5, 5])], [_vi("y", None)],
                    kernel_shape=[3, 3], pads=[1, 1, 0, 0], strides=[2, 2], ceil_mode=1),
          (1, 2, 5, 5))
    _grad(_one_node("MaxPool", [_vi("x", [1, 2, 5, 5])], [_vi("y", None)],
                    kernel_shape=[2, 2], auto_pad="SAME_UPPER"), (1, 2, 5, 5))
    _grad(_one_node("LayerNormalization", [_vi("x", [2, 3, 4]), _vi("s", [3, 4]),
                                           _vi("b", [3, 4])], [_vi("y", None)], axis=1),
          (2, 3, 4), (3, 4), (3, 4))


def test_grad_resize_cubic_and_grid_sample():
    sc = numpy_helper.from_array(np.array([1, 1, 1.5, 0.6], np.float32), "scales")
    roi = numpy_helper.from_array(np.zeros(0), "roi")
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="cubic",
                            antialias=1)
    g = helper.make_graph([node], "g", [_vi("x", [1, 1, 4, 5])], [_vi("y", None)], [sc, roi])
    _grad(_typed(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])),
          (1, 1, 4, 5))
    m = _one_node("GridSample", [_vi("x", [1, 1, 3, 3, 3]), _vi("g", [1, 2, 2, 2, 3])],
                  [_vi("y", None)], opset=20, mode="linear", padding_mode="border")
    _grad(m, (1, 1, 3, 3, 3), (1, 2, 2, 2, 3))


def test_grad_recurrent_and_attention():
    x, w, r, b = _vi("x", [3, 2, 2]), _vi("w", [2, 12, 2]), _vi("r", [2, 12, 3]), \
        _vi("b", [2, 24])
    m = _one_node("LSTM", [x, w, r, b], [_vi("y", None)], hidden_size=3,
                  direction="bidirectional")
    _grad(m, (3, 2, 2), (2, 12, 2), (2, 12, 3), (2, 24))
    m = _one_node("GRU", [x, _vi("w", [1, 9, 2]), _vi("r", [1, 9, 3])], [_vi("y", None)],
                  hidden_size=3, linear_before_reset=1)
    _grad(m, (3, 2, 2), (1, 9, 2), (1, 9, 3))
    m = _one_node("Attention", [_vi("q", [1, 3, 4]), _vi("k", [1, 3, 2]), _vi("v", [1, 3, 2])],
                  [_vi("y", None)], opset=23, q_num_heads=2, kv_num_heads=1, is_causal=1)
    _grad(m, (1, 3, 4), (1, 3, 2), (1, 3, 2))


def test_traced_nodes_match_eager():
    """Handlers trace: conformance models whose shape inputs are made initializers run
    through sampan.jit with the same results."""
    picks = {"test_resize_downsample_scales_cubic_antialias", "test_lstm_with_peepholes",
             "test_maxpool_with_argmax_2d_precomputed_pads", "test_convtranspose_pads",
             "test_attention_4d_gqa_with_past_and_present", "test_gridsample_bicubic",
             "test_col2im_pads", "test_layer_normalization_4d_axis1"}
    seen = set()
    for _, c in _cases():
        if c.name not in picks:
            continue
        seen.add(c.name)
        ins, outs = c.data_sets[0]
        m = onnx.ModelProto()
        m.CopyFrom(c.model)
        keep, feed, consts = [], [], []
        for vi, a in zip(list(m.graph.input), ins):   # data stays input; shapes: Constants
            if vi.name in ("roi", "scales", "sizes", "image_shape", "block_shape"):
                consts.append(helper.make_node("Constant", [], [vi.name],
                                               value=numpy_helper.from_array(a, vi.name)))
            else:
                keep.append(vi)
                feed.append(a)
        del m.graph.input[:]
        m.graph.input.extend(keep)
        nodes = consts + list(m.graph.node)
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        layer = sampan.onnx.to_layer(m)
        f = sampan.jit(layer, pipeline="inference")
        with sampan.no_grad():
            got = f(*[sampan.tensor(a) for a in feed])
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, outs):
            np.testing.assert_allclose(g.numpy(), e, rtol=c.rtol, atol=max(c.atol, 1e-6))
    assert seen == picks


def test_shape_from_data_under_jit_is_a_clear_error():
    m = _one_node("Resize", [_vi("x", [1, 1, 2, 2], TensorProto.FLOAT),
                             _vi("roi", [0], TensorProto.FLOAT),
                             _vi("scales", [4], TensorProto.FLOAT)],
                  [_vi("y", None, TensorProto.FLOAT)], opset=19)
    layer = sampan.onnx.to_layer(m)
    x, roi, sc = (sampan.ones(1, 1, 2, 2), sampan.zeros(0),
                  sampan.tensor(np.array([1, 1, 2, 2], np.float32)))
    assert layer(x, roi, sc).shape == (1, 1, 4, 4)          # eager reads the value
    with pytest.raises(OnnxError, match=r"Resize.*scales must be known"):
        sampan.jit(layer)(x, roi, sc)


def test_bad_attributes_name_the_node():
    m = _one_node("Conv", [_vi("x", [1, 1, 4, 4], TensorProto.FLOAT),
                           _vi("w", [1, 1, 2, 2], TensorProto.FLOAT)],
                  [_vi("y", None, TensorProto.FLOAT)])
    m.graph.node[0].name = "conv7"
    m.graph.node[0].attribute.append(helper.make_attribute("pads", [1, 1]))
    with pytest.raises(OnnxError, match=r"'conv7' \(Conv, opset 17\): pads has 2 values"):
        sampan.onnx.to_layer(m)(sampan.ones(1, 1, 4, 4), sampan.ones(1, 1, 2, 2))


# ---------------------------------------------------------------------- real exports
def _torch_models():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)

    class LeNet(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1, s.c2 = nn.Conv2d(1, 6, 5, padding=2), nn.Conv2d(6, 16, 5)
            s.f1, s.f2 = nn.Linear(400, 32), nn.Linear(32, 10)

        def forward(s, x):
            x = torch.max_pool2d(torch.relu(s.c1(x)), 2)
            x = nn.functional.avg_pool2d(torch.relu(s.c2(x)), 2)
            return s.f2(torch.relu(s.f1(x.flatten(1))))

    class Res(nn.Module):
        def __init__(s):
            super().__init__()
            s.c1, s.b1 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
            s.c2, s.b2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)

        def forward(s, x):
            y = s.b2(s.c2(torch.relu(s.b1(s.c1(x)))))
            return nn.functional.adaptive_avg_pool2d(torch.relu(x + y), 1).flatten(1)

    class Wrap(nn.Module):                  # TransformerEncoderLayer / LSTM, outputs flat
        def __init__(s, m):
            super().__init__()
            s.m = m

        def forward(s, x):
            y = s.m(x)
            return (y[0], *y[1]) if isinstance(y, tuple) else y

    class GPT(nn.Module):
        def __init__(s):
            super().__init__()
            s.emb, s.pos = nn.Embedding(50, 16), nn.Embedding(8, 16)
            s.ln, s.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)
            s.qkv, s.o, s.head = nn.Linear(16, 48), nn.Linear(16, 16), nn.Linear(16, 50)
            s.ff = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

        def forward(s, ids):
            b, t = ids.shape
            x = s.emb(ids) + s.pos(torch.arange(t))
            q, k, v = (z.view(b, t, 2, 8).transpose(1, 2) for z in s.qkv(s.ln(x)).split(16, -1))
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + s.o(a.transpose(1, 2).reshape(b, t, 16))
            return s.head(x + s.ff(s.ln2(x)))

    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    tel = Wrap(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True))
    return {"mlp": (mlp, torch.randn(3, 8)), "lenet": (LeNet(), torch.randn(2, 1, 28, 28)),
            "res": (Res(), torch.randn(2, 4, 8, 8)), "tel": (tel, torch.randn(2, 5, 16)),
            "lstm": (Wrap(nn.LSTM(4, 6, num_layers=2, batch_first=True)),
                     torch.randn(2, 5, 4)),
            "gpt": (GPT(), torch.randint(0, 50, (2, 8)))}


@pytest.fixture(scope="module")
def exported():
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    out = {}
    torch.backends.mha.set_fastpath_enabled(False)
    for name, (m, x) in _torch_models().items():
        m.eval()
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(m, (x,), buf, dynamo=False, opset_version=17,
                              do_constant_folding=name != "res")   # keep BatchNormalization
        out[name] = (onnx.load_from_string(buf.getvalue()), x.numpy())
    return out, ort


def _all_values(ort, m, feeds):
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    have = {o.name for o in m2.graph.output}
    for n in m2.graph.node:
        m2.graph.output.extend(helper.ValueInfoProto(name=o) for o in n.output
                               if o and o not in have)
    s = ort.InferenceSession(m2.SerializeToString(), providers=["CPUExecutionProvider"])
    vals = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    vals.update(feeds)
    return vals


@pytest.mark.parametrize("name", ["mlp", "lenet", "res", "tel", "lstm", "gpt"])
def test_real_export_nodes_match_onnxruntime(exported, name):
    """Every node of this category in the export, cut out with its onnxruntime inputs,
    gives onnxruntime's outputs; the LSTM's weights get gradients."""
    models, ort = exported
    m, x = models[name]
    vals = _all_values(ort, m, {m.graph.input[0].name: x})
    inits = {t.name: t for t in m.graph.initializer}
    checked = set()
    for n in m.graph.node:
        if n.op_type not in OPS:
            continue
        gin, ginit, feed = [], [], []
        for i in (i for i in n.input if i):
            if i in inits:
                ginit.append(inits[i])
            else:
                a = vals[i]
                gin.append(helper.make_tensor_value_info(
                    i, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
                feed.append(a)
        outs = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(
            vals[o].dtype), vals[o].shape) for o in n.output if o]
        one = helper.make_model(helper.make_graph([n], "one", gin, outs, ginit),
                                opset_imports=m.opset_import)
        one.ir_version = m.ir_version
        layer = sampan.onnx.to_layer(one)
        got = layer(*feed)
        got = got if isinstance(got, tuple) else (got,)
        for o, g in zip([o for o in n.output if o], got):
            np.testing.assert_allclose(g.numpy(), vals[o], rtol=1e-4, atol=1e-5)
        if n.op_type == "LSTM":
            sum(sampan.sum(g) for g in got).backward()
            assert all(p.grad is not None for p in layer.parameters())
        checked.add(n.op_type)
    assert checked, name


@pytest.mark.parametrize("name", ["mlp", "lenet", "res", "tel", "lstm", "gpt"])
def test_real_export_whole_model(exported, name):
    """The whole export against onnxruntime, once every op it uses has a handler (the
    other categories' handlers come from the other import tables)."""
    models, ort = exported
    m, x = models[name]
    ops = {n.op_type for n in m.graph.node}
    if not ops <= set(sampan.onnx.ops.supported()):
        pytest.skip(f"whole-model run needs {sorted(ops - set(sampan.onnx.ops.supported()))}")
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = s.run(None, {m.graph.input[0].name: x})
    got = sampan.onnx.to_layer(m)(x)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-5)


def _f32(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def test_dynamic_batch_stays_symbolic_and_matches_onnxruntime():
    """A symbolic batch dim stays symbolic through the handlers (no example size baked
    into a constant): MaxPool's Indices, Dropout's mask, an LSTM, and a Resize whose
    scales are a float initializer (a Parameter read as a static value while tracing)."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 8, 3)).astype(np.float32), "w")
    r = numpy_helper.from_array(rng.standard_normal((1, 8, 2)).astype(np.float32), "r")
    sc = numpy_helper.from_array(np.array([1, 1, 1.5, 0.5], np.float32), "scales")
    roi = numpy_helper.from_array(np.zeros(0, np.float32), "roi")
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2]),
             helper.make_node("Dropout", ["x"], ["d", "m"]),
             helper.make_node("Resize", ["x", "roi", "scales"], ["z"], mode="linear"),
             helper.make_node("LSTM", ["s", "w", "r"], ["y", "h"], hidden_size=2)]
    outs = [_f32("p", ["N", 2, 2, 2]), _f32("i", ["N", 2, 2, 2], TensorProto.INT64),
            _f32("m", ["N", 2, 4, 4], TensorProto.BOOL), _f32("z", ["N", 2, 6, 2]),
            _f32("y", [4, 1, "N", 2]), _f32("h", [1, "N", 2])]
    g = helper.make_graph(nodes, "g", [_f32("x", ["N", 2, 4, 4]), _f32("s", [4, "N", 3])],
                          outs, [w, r, sc, roi])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    layer = sampan.onnx.to_layer(m)
    layer.eval()
    f = sampan.jit(layer, pipeline="inference", dynamic={0: {0: "N"}, 1: {1: "N"}})
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (2, 5):
        x = rng.standard_normal((n, 2, 4, 4)).astype(np.float32)
        s = rng.standard_normal((4, n, 3)).astype(np.float32)
        with sampan.no_grad():
            got = f(sampan.tensor(x), sampan.tensor(s))
        for g_, w_ in zip(got, sess.run(None, {"x": x, "s": s})):
            np.testing.assert_allclose(g_.numpy(), w_, rtol=1e-5, atol=1e-6)
