"""Issue 31, int8 end to end: the requantising int8 layers (`qlinear_dense`, `qdense`,
`qlinear_conv2d`) give exactly the integers of an int32-accumulate reference with
onnxruntime's rounding (float32 multiplier, round half to even, saturate), on the numba
provider's VNNI kernels as on the op table's numpy ones; `fuse_quant` keeps activations
int8 from layer to layer (max-pool, reshape and concat on int8), packs each constant
weight once, and the quantised MLP / CNN stay within one point of fp32."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.ops.registry import OPS
from sampan.passes import PassManager

from . import planted as P

LAYERS = ("qlinear_dense", "qdense", "qlinear_conv2d")


def _numba(op):
    k = OPS[op].kernels.get("numba")
    if k is None:
        pytest.skip("no numba")
    return k


def _ref_dense(x, xs, xz, w, ws, bias, ys=None, yz=0, lo=0, hi=255):
    """Independent reference: int64 sums, then onnxruntime's float32 requantisation."""
    acc = (x.astype(np.int64) - int(xz)) @ w.astype(np.int64).T + bias.astype(np.int64)
    m = np.float32(xs) * ws.astype(np.float32)
    if ys is None:
        return acc.astype(np.float32) * m
    m = m / np.float32(ys)
    q = np.rint(acc.astype(np.float32) * m).astype(np.int64) + int(yz)
    return np.clip(q, lo, hi)


@pytest.mark.parametrize("m,k,n,signed", [(1, 784, 512, False), (5, 37, 19, True),
                                          (64, 400, 120, False), (3, 120, 84, True)])
def test_dense_kernels_exact(m, k, n, signed):
    r = np.random.default_rng(m + k + n)
    x = (r.integers(-128, 128, (m, k)).astype(np.int8) if signed else
         r.integers(0, 256, (m, k)).astype(np.uint8))
    xz = np.array(-9 if signed else 133, x.dtype)
    w = r.integers(-127, 128, (n, k)).astype(np.int8)
    ws = r.uniform(0.001, 0.01, n).astype(np.float32)
    bias = r.integers(-20000, 20000, n).astype(np.int32)
    xs, ys = np.float32(0.03), np.float32(0.7)
    for yz, qmin, qmax, dt in [(np.uint8(120), None, None, np.uint8),
                               (np.uint8(120), 120, 250, np.uint8),
                               (np.int8(-5), -5, None, np.int8)]:
        args = (x, xs, xz, w, ws, np.zeros(n, np.int8), bias, ys, np.asarray(yz))
        lo, hi = {np.uint8: (0, 255), np.int8: (-128, 127)}[dt]
        lo, hi = max(lo, qmin if qmin is not None else lo), min(hi, qmax or hi)
        want = _ref_dense(x, xs, xz, w, ws, bias, ys, yz, lo, hi)
        for kern in (OPS["qlinear_dense"].kernels["numpy"], _numba("qlinear_dense")):
            got = kern(*args, qmin=qmin, qmax=qmax)
            assert got.dtype == dt and got.shape == (m, n)
            np.testing.assert_array_equal(got, want)
    want = _ref_dense(x, xs, xz, w, ws, bias)
    for kern in (OPS["qdense"].kernels["numpy"], _numba("qdense")):
        got = kern(x, xs, xz, w, ws, np.zeros(n, np.int8), bias)
        np.testing.assert_array_equal(got, want)


def _ort_qlinear_conv(x, xs, xz, w, ws, bias, ys, yz, stride, padding, dilation, groups):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    names = ["xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]
    vals = [np.float32(xs), np.uint8(xz), w, ws, np.zeros(w.shape[0], np.int8),
            np.float32(ys), np.uint8(yz), bias]
    inits = [numpy_helper.from_array(np.asarray(a), nm) for a, nm in zip(vals, names)]
    node = helper.make_node("QLinearConv", ["x"] + names, ["y"], strides=list(stride),
                            pads=[padding[0], padding[1]] * 2, dilations=list(dilation),
                            group=groups)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


@pytest.mark.parametrize("shape,wshape,stride,padding,dilation,groups", [
    ((1, 1, 28, 28), (6, 1, 5, 5), (1, 1), (2, 2), (1, 1), 1),     # LeNet's first
    ((3, 6, 14, 14), (16, 6, 5, 5), (1, 1), (0, 0), (1, 1), 1),    # its second
    ((2, 4, 9, 11), (6, 2, 3, 3), (2, 1), (1, 0), (1, 2), 2),
    ((40, 6, 12, 12), (16, 6, 3, 3), (1, 1), (1, 1), (1, 1), 1)])  # split over threads
def test_conv_kernel_exact_against_onnxruntime(shape, wshape, stride, padding, dilation,
                                               groups):
    r = np.random.default_rng(sum(shape))
    x = r.integers(0, 256, shape).astype(np.uint8)
    w = r.integers(-127, 128, wshape).astype(np.int8)
    o = wshape[0]
    ws = r.uniform(0.001, 0.01, o).astype(np.float32)
    bias = r.integers(-5000, 5000, o).astype(np.int32)
    xs, xz, ys, yz = 0.02, 128, 0.3, 100
    want = _ort_qlinear_conv(x, xs, xz, w, ws, bias, ys, yz, stride, padding, dilation,
                             groups)
    args = (x, np.float32(xs), np.uint8(xz), w, ws, np.zeros(o, np.int8), bias,
            np.float32(ys), np.uint8(yz))
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    for kern in (OPS["qlinear_conv2d"].kernels["numpy"], _numba("qlinear_conv2d")):
        got = kern(*[np.asarray(a) for a in args], **attrs)
        np.testing.assert_array_equal(got, want)
    # int8 input with the same values shifted: the same result; and a folded ReLU
    xi = (x.astype(np.int16) - 128).astype(np.int8)
    args8 = (xi, np.float32(xs), np.int8(0)) + args[3:]
    got = _numba("qlinear_conv2d")(*[np.asarray(a) for a in args8], **attrs, qmin=yz)
    np.testing.assert_array_equal(got, np.maximum(want, yz))


@pytest.fixture(scope="module")
def data():
    return P.task(1500, 0), P.task(600, 1)


def _saved(model, x, folder, name):
    return sampan.jit.save(model, str(folder / name), (sampan.Tensor(x[:4]),),
                           dynamic="batch")


def _ops(path):
    g, _, _ = sampan.jit.serialize.read(path)
    return [n.op for n in g.nodes]


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_int8_chain_stays_int8_and_within_one_point(kind, data, tmp_path):
    (x, y), (xt, yt) = data
    m = P.train(P.mlp() if kind == "mlp" else P.cnn(), x, y, steps=150)
    d = _saved(m, xt, tmp_path, f"{kind}.sampan")
    cal = [x[i * 100:(i + 1) * 100] for i in range(4)]
    q8 = sampan.quant.quantize_program(d, cal, str(tmp_path / f"{kind}-int8.sampan"))
    ops = _ops(q8)
    # one quantize at the input, int8 layers after it, float only at the output
    assert ops.count("quantize") == 1 and "dequantize" not in ops
    assert not {"matmul", "conv2d", "qmatmul", "qconv2d", "relu", "add", "fused"} & set(ops)
    assert ops[-1] == "qdense"
    if kind == "cnn":
        assert ops.count("qlinear_conv2d") == 2 and ops.count("max_pool2d") == 2
    g, _, _ = sampan.jit.serialize.read(q8)
    first = next(i for i, n in enumerate(g.nodes) if n.op == "quantize")
    inner = [n.outputs[0].dtype for n in g.nodes[first:-1]]
    assert all(dt == np.uint8 for dt in inner)              # activations travel as uint8
    fp32 = P.accuracy(sampan.jit.load(d), xt, yt)
    int8 = P.accuracy(sampan.jit.load(q8), xt, yt)
    assert fp32 > 0.5 and int8 >= fp32 - 0.01, (fp32, int8)


def test_int8_chain_matches_the_reference_kernels_exactly(data, tmp_path):
    """The compiled program (numba provider, weights packed at compile time) gives the
    bytes of the same graph run with the op table's numpy reference kernels."""
    (x, y), (xt, _) = data
    m = P.train(P.cnn(), x, y, steps=30)
    d = _saved(m, xt, tmp_path, "cnn.sampan")
    q8 = sampan.quant.quantize_program(d, [x[:200]], str(tmp_path / "q.sampan"))
    fast = sampan.jit.load(q8)(sampan.Tensor(xt[:37])).numpy()
    with sampan.backends.set_providers(["numpy"]):
        ref = sampan.jit.load(q8)(sampan.Tensor(xt[:37])).numpy()
    np.testing.assert_array_equal(fast, ref)


def test_weights_packed_once_per_compiled_node(data, tmp_path, monkeypatch):
    pytest.importorskip("numba")
    from sampan.backends.numba import qlayers
    (x, y), (xt, _) = data
    d = _saved(P.train(P.mlp(), x, y, steps=20), xt, tmp_path, "mlp.sampan")
    q8 = sampan.quant.quantize_program(d, [x[:200]], str(tmp_path / "q.sampan"))
    calls = []
    real = qlayers.pack_dense
    monkeypatch.setattr(qlayers, "pack_dense", lambda w: calls.append(1) or real(w))
    f = sampan.jit.load(q8)
    for b in (3, 1, 7, 64, 3, 1):       # a compile per new batch size; packed once
        f(sampan.Tensor(xt[:b]))
    assert len(calls) == 2              # the two int8 layers with an int8 weight


def test_concat_and_clamp_stay_int8():
    """quantize(concat(relu(l1), clamp(l2))) -> concat of two requantising layers, the
    clamp's bounds folded into qmin / qmax; the rewrite equals the QDQ graph closely."""
    from sampan.ir.graph import Graph
    r = np.random.default_rng(0)
    g = Graph()
    xin = g.add_input((4, 16), np.dtype(np.float32))

    def lin(v, n, seed):
        w = g.add_const(np.random.default_rng(seed).standard_normal((v.shape[1], n))
                        .astype(np.float32) * 0.3)
        b = g.add_const(np.random.default_rng(seed + 1).standard_normal(n)
                        .astype(np.float32) * 0.1)
        mm = g.add_node("matmul", [v, w], {}).outputs[0]
        return g.add_node("add", [mm, b], {}).outputs[0]
    a = g.add_node("relu", [lin(xin, 8, 1)], {}).outputs[0]
    lo, hi = g.add_const(np.float32(-0.5)), g.add_const(np.float32(0.6))
    c = g.add_node("minimum", [g.add_node("maximum", [lin(xin, 8, 3), lo], {}).outputs[0],
                               hi], {}).outputs[0]
    cat = g.add_node("concat", [a, c], {"axis": 1}).outputs[0]
    g.outputs = [lin(cat, 5, 5)]
    feeds = r.standard_normal((4, 16)).astype(np.float32)
    from sampan.quant.calibrate import calibrate_graph, run_values
    cal = calibrate_graph(g, [(feeds,)])
    opts = {"quantize": {"acts": cal.acts}}
    qdq = PassManager(["quantize"], options=opts).run(g.copy())
    fused = PassManager(["quantize", "fuse_quant", "dce"], options=opts).run(g.copy())
    ops = [n.op for n in fused.nodes]
    assert ops.count("qlinear_dense") == 2 and "concat" in ops and ops[-1] == "qdense"
    clamp = [n for n in fused.nodes if n.op == "qlinear_dense" and "qmax" in n.attrs]
    assert len(clamp) == 1      # (the lower bound is the calibrated minimum: no qmin)
    want = run_values(qdq, [feeds], qdq.outputs)[0]
    got = run_values(fused, [feeds], fused.outputs)[0]
    np.testing.assert_allclose(got, want, atol=0.05 * float(np.abs(want).max()))
