"""ONNX import of the signal, detection and remaining ops (sampan/onnx/ops/signal.py,
misc.py, training.py): the official node conformance cases of each op type, run through
`sampan.onnx.backend` with the onnx runner's comparison and pinned per op type; the cases
that fail, each with its reason; DFT against numpy's FFT beyond the suite (dft_length,
odd lengths, complex one-sided); RoiAlign with per-roi sampling grids against onnx's
reference; gradients through imported DFT, STFT, RoiAlign, DeformConv, TensorScatter
and CumProd nodes against finite differences; tracing with `sampan.jit`."""
import functools
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import sampan  # noqa: E402
from sampan.onnx import OnnxError  # noqa: E402

be = pytest.importorskip("sampan.onnx.backend")

# cases passing per op type (expanded cases count under their op)
EXPECTED = {"Adagrad": 2, "Adam": 2, "Bernoulli": 0, "BlackmanWindow": 4, "CenterCropPad": 12,
            "CumProd": 9, "DFT": 8, "DeformConv": 4, "HammingWindow": 4, "HannWindow": 4,
            "MelWeightMatrix": 1, "Momentum": 3, "NonMaxSuppression": 10, "RoiAlign": 3,
            "STFT": 2, "Swish": 2, "TensorScatter": 3}
# why the others fail (onnxruntime 1.32 fails every one of them too)
FAILING = {
    # the expected values carry float32 FFT rounding (1.9e-7 where the exact value is 0),
    # above the cases' atol of 1e-7; sampan's DFT sums in float64
    "test_dft_inverse": "AssertionError", "test_dft_inverse_opset19": "AssertionError",
    # random draws: the expected values are numpy's global stream when the suite was made
    "test_bernoulli": "AssertionError", "test_bernoulli_double": "AssertionError",
    "test_bernoulli_seed": "AssertionError",
    # the expansions draw with RandomUniformLike, which sampan does not import
    "test_bernoulli_expanded": "RandomUniformLike",
    "test_bernoulli_double_expanded": "RandomUniformLike",
    "test_bernoulli_seed_expanded": "RandomUniformLike",
}


@functools.cache
def _results():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = be.node_cases()
    by_name = {c.name: c for c in cases}
    mine = [c for c in cases if be.case_op_type(c, by_name) in EXPECTED]
    return be.run_cases(mine)


def test_conformance_cases_pass_per_op_type():
    res = _results()
    table = be.per_op(res)
    assert {op: p for op, (n, p) in table.items()} == EXPECTED
    failed = {r.name: r.error for r in res if not r.passed}
    assert set(failed) == set(FAILING), failed
    for name, why in FAILING.items():
        assert why in failed[name], (name, failed[name])


def test_other_ops_of_this_task_pass_with_sequences_and_control_flow():
    """Identity's sequence/optional cases pass (sequences and optionals are imported as
    lists of tensors, sampan/onnx/subgraph.py); AffineGrid's and Range's expanded cases use
    If/Loop, imported since issue 34. (TopK's uint64 case passes since the importer
    emulates uint64.)"""
    names = {"test_identity_sequence", "test_identity_opt", "test_affine_grid_2d_expanded",
             "test_range_float_type_positive_delta_expanded"}
    cases = [c for c in be.node_cases() if c.name in names]
    assert len(cases) == len(names)
    for r in be.run_cases(cases):
        assert r.passed, r


# ---------------------------------------------------------------------- helpers
def _vi(name, shape, t=TensorProto.DOUBLE):
    return helper.make_tensor_value_info(name, t, shape)


def _model(op, inputs, outputs, opset=20, inits=(), domain="", **attrs):
    names = [i.name if i is not None else "" for i in inputs] + [t.name for t in inits]
    node = helper.make_node(op, names, [o.name for o in outputs], domain=domain, **attrs)
    g = helper.make_graph([node], "g", [i for i in inputs if i is not None], outputs,
                          list(inits))
    ops = [helper.make_opsetid("", opset)]
    return _typed(helper.make_model(g, opset_imports=ops))


def _typed(m):
    """Outputs written without a shape take the one onnx's shape inference gives (or a
    rank-free one)."""
    inf = onnx.shape_inference.infer_shapes(m)
    known = {v.name: v for v in list(inf.graph.value_info) + list(inf.graph.output)}
    for o in m.graph.output:
        if not o.type.tensor_type.HasField("shape"):
            if o.name in known and known[o.name].type.tensor_type.HasField("shape"):
                o.type.CopyFrom(known[o.name].type)
            else:
                o.type.tensor_type.shape.SetInParent()
                o.type.tensor_type.ClearField("shape")
    return m


def _sym(rank):
    return [f"d{i}" for i in range(rank)]


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, np.int64), name)


def _grad(model, *arrays):
    layer = sampan.onnx.to_layer(model)
    xs = [sampan.tensor(a, requires_grad=True) for a in arrays]
    assert sampan.autograd.gradcheck(lambda *a: layer(*a), xs, atol=1e-5, rtol=1e-4)


def _dft(x, n=None, axis=1, inverse=0, onesided=0):
    inits = [_i64("axis", axis)] + ([_i64("n", n)] if n is not None else [])
    node = helper.make_node("DFT", ["x", "n" if n is not None else "", "axis"], ["y"],
                            inverse=inverse, onesided=onesided)
    g = helper.make_graph([node], "g", [_vi("x", list(x.shape))],
                          [_vi("y", [f"d{i}" for i in range(x.ndim)])], inits)
    m = _typed(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]))
    return sampan.onnx.to_layer(m)(x).numpy()


# ---------------------------------------------------------------------- DFT beyond the suite
def test_dft_matches_numpy_fft():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 3, 2))
    c = x[..., 0] + 1j * x[..., 1]

    def cplx(y):
        return y[..., 0] + 1j * y[..., 1]
    np.testing.assert_allclose(cplx(_dft(x)), np.fft.fft(c, axis=1), atol=1e-12)
    np.testing.assert_allclose(cplx(_dft(x, n=10)), np.fft.fft(c, 10, axis=1), atol=1e-12)
    np.testing.assert_allclose(cplx(_dft(x, n=4, axis=-2)), np.fft.fft(c, 4, axis=2),
                               atol=1e-12)
    np.testing.assert_allclose(cplx(_dft(x, inverse=1)), np.fft.ifft(c, axis=1), atol=1e-12)
    np.testing.assert_allclose(cplx(_dft(x, onesided=1)), np.fft.fft(c, axis=1)[:, :4],
                               atol=1e-12)
    half = np.fft.rfft(x[..., 0], axis=1)                 # 4 bins of a length-7 signal
    spec = np.stack([half.real, half.imag], -1)
    y = _dft(spec, n=7, inverse=1, onesided=1)
    assert y.shape == (2, 7, 3, 1)
    np.testing.assert_allclose(y[..., 0], x[..., 0], atol=1e-12)
    with pytest.raises(OnnxError, match="real/imaginary"):
        _dft(rng.standard_normal((2, 7, 3)), axis=2)


def test_grad_dft_stft_and_cumprod():
    rng = np.random.default_rng(1)
    node = helper.make_node("DFT", ["x"], ["y"], axis=1, onesided=1)
    g = helper.make_graph([node], "g", [_vi("x", [1, 6, 2, 2])], [_vi("y", _sym(4))])
    _grad(_typed(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])),
          rng.standard_normal((1, 6, 2, 2)))
    m = _model("STFT", [_vi("s", [1, 12, 1]), _vi("w", [4])], [_vi("y", _sym(4))], opset=17,
               inits=[_i64("step", 3)])
    m.graph.node[0].input[:] = ["s", "step", "w"]
    _grad(m, rng.standard_normal((1, 12, 1)), rng.standard_normal(4))
    m = _model("CumProd", [_vi("x", [2, 4])], [_vi("y", _sym(2))], opset=26,
               inits=[_i64("axis", 1)], exclusive=1, reverse=1)
    _grad(m, rng.standard_normal((2, 4)))


# ---------------------------------------------------------------------- RoiAlign, DeformConv
def test_roi_align_per_roi_grids_match_the_reference():
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    rois = np.array([[0.5, 1.0, 7.5, 6.0], [2.0, 0.0, 10.5, 8.5], [1.0, 1.0, 3.0, 2.5]],
                    np.float32)
    bi = np.array([1, 0, 1], np.int64)
    for mode, ctm in (("avg", "half_pixel"), ("max", "output_half_pixel")):
        m = _model("RoiAlign", [_vi("x", [2, 3, 9, 11], TensorProto.FLOAT)],
                   [_vi("y", _sym(4), TensorProto.FLOAT)], opset=16,
                   inits=[numpy_helper.from_array(rois, "rois"), _i64("bi", bi)],
                   output_height=3, output_width=2, sampling_ratio=0, spatial_scale=0.9,
                   mode=mode, coordinate_transformation_mode=ctm)
        want = ReferenceEvaluator(m).run(None, {"x": x})[0]
        got = sampan.onnx.to_layer(m)(x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grad_roi_align_deform_conv_tensor_scatter():
    rng = np.random.default_rng(3)
    rois = numpy_helper.from_array(np.array([[0.3, 0.7, 3.1, 4.2]]), "rois")
    m = _model("RoiAlign", [_vi("x", [1, 2, 5, 6])], [_vi("y", _sym(4))], opset=16,
               inits=[rois, _i64("bi", [0])], output_height=2, output_width=2,
               sampling_ratio=2)
    _grad(m, rng.standard_normal((1, 2, 5, 6)))
    m = _model("DeformConv", [_vi("x", [1, 2, 4, 4]), _vi("w", [2, 2, 2, 2]),
                              _vi("off", [1, 16, 3, 3]), _vi("b", [2]), _vi("mask", [1, 8, 3, 3])],
               [_vi("y", _sym(4))], opset=19, offset_group=2)
    # offsets away from integers: bilinear sampling is smooth there
    off = rng.uniform(0.1, 0.4, (1, 16, 3, 3)) * rng.choice([-1, 1], (1, 16, 3, 3))
    _grad(m, rng.standard_normal((1, 2, 4, 4)), rng.standard_normal((2, 2, 2, 2)), off,
          rng.standard_normal(2), rng.uniform(0.5, 1, (1, 8, 3, 3)))
    m = _model("TensorScatter", [_vi("past", [2, 3, 4, 2]), _vi("u", [2, 3, 2, 2])],
               [_vi("y", _sym(4))], opset=24, inits=[_i64("wi", [3, 1])], mode="circular")
    _grad(m, rng.standard_normal((2, 3, 4, 2)), rng.standard_normal((2, 3, 2, 2)))


# ---------------------------------------------------------------------- tracing, eager only
def test_traced_signal_graph_and_nms_eager_only():
    m = _model("DFT", [_vi("x", ["B", 8, 1], TensorProto.FLOAT)],
               [_vi("y", _sym(3), TensorProto.FLOAT)], opset=17, axis=1, onesided=1)
    g = sampan.onnx.load(m)
    assert "matmul" in str(g)
    nms = _model("NonMaxSuppression", [_vi("b", [1, 3, 4], TensorProto.FLOAT),
                                       _vi("s", [1, 1, 3], TensorProto.FLOAT)],
                 [_vi("y", _sym(2), TensorProto.INT64)], opset=11,
                 inits=[_i64("k", [2])])
    layer = sampan.onnx.to_layer(nms)
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    assert layer(boxes, scores).numpy().tolist() == [[0, 0, 0], [0, 0, 2]]
    with pytest.raises(OnnxError, match="eagerly"):
        sampan.onnx.load(nms)


def test_bernoulli_and_training_ops():
    m = _model("Bernoulli", [_vi("p", [2000])], [_vi("y", _sym(1), TensorProto.FLOAT)],
               opset=15, dtype=TensorProto.FLOAT, seed=3.0)
    p = np.linspace(0, 1, 2000)
    y = sampan.onnx.to_layer(m)(p).numpy()
    assert y.dtype == np.float32 and set(np.unique(y)) <= {0.0, 1.0}
    assert y[p == 0].sum() == 0 and y[p == 1].all() and abs(y.mean() - 0.5) < 0.05
    # an Adam step refuses a node whose inputs do not come in equal groups
    node = helper.make_node("Adam", ["r", "t", "x", "g", "v"], ["x2"],
                            domain="ai.onnx.preview.training")
    g = helper.make_graph([node], "g", [_vi("r", []), _vi("t", [], TensorProto.INT64)] +
                          [_vi(n, [2]) for n in "xgv"], [_vi("x2", [2])])
    bad = helper.make_model(g, opset_imports=[helper.make_opsetid(
        "ai.onnx.preview.training", 1)])
    with pytest.raises(OnnxError, match="equal groups"):
        sampan.onnx.to_layer(bad)(np.array(0.1), np.array(1), *[np.ones(2)] * 3)
