"""Issue 31: int8 programs stay int8 on the numpy and onnxruntime runtimes.

- the numpy runtime's kernels of the four fused int8 ops (`ops/_qfast.py`: float BLAS,
  exact by the bound K * max|x - xz| * max|w - wz| < 2^24, else float64) give exactly the
  bytes of the int64 reference (`_qref`), at the bound's edges too, with weights prepared
  once when a node is bound;
- their ONNX lowerings (`onnx/lower/quant_fused.py`) run in onnxruntime with the same
  bytes (weights of at most 6 bits here, so no CPU's int16 pair sums can saturate);
- a quantised CNN and MLP served with `set_runtime("numpy")` / `("onnxruntime")` run their
  int8 layers there (an engine node holding them) and give the numba reference's output."""
from __future__ import annotations

import os

import numpy as np
import pytest

import sampan
from sampan.ir.graph import Graph
from sampan.ops import _qfast, _qref
from sampan.ops.quant_fused import bind, multiplier, row_qparams
from sampan.ops.registry import OPS

F32 = np.float32


def _ref_layer(op, x, xs, xz, w, ws, wz, bias, ys=None, yz=None, qmin=None, qmax=None,
               **conv):
    """The reference: `_qref`'s exact int64 sums and its requantisation."""
    if op == "qlinear_conv2d":
        acc = _qref.conv_sums(x, w, int(xz), wz, conv["stride"], conv["padding"],
                              conv["dilation"], conv["groups"])
        axis = 1
    else:
        acc = _qref.sums(x, w, int(xz), wz)
        axis = -1
    m = multiplier(xs, ws, ys, w.shape[0])
    if yz is None:
        return _qref.requant(acc, bias, m, 0, 0, 0, np.float32, axis=axis)
    lo, hi = (0, 255) if yz.dtype == np.uint8 else (-128, 127)
    lo, hi = max(lo, qmin if qmin is not None else lo), min(hi, hi if qmax is None else qmax)
    return _qref.requant(acc, bias, m, int(yz), lo, hi, yz.dtype, axis=axis)


def _ref_dynamic(x, w, ws, bias=None):
    q, s, z = row_qparams(x)
    acc = _qref.sums(q, w, 0, 0) - z[:, None].astype(np.int64) * w.astype(np.int64).sum(1)
    y = (acc.astype(np.float32) * s[:, None]) * ws[None, :]
    return y if bias is None else y + bias[None, :]


def _dense_case(r, m, k, n, unsigned, wmax=127, bias_max=3000, xz=None, y=True):
    x = (r.integers(0, 256, (m, k)).astype(np.uint8) if unsigned else
         r.integers(-128, 128, (m, k)).astype(np.int8))
    xz = np.array((131 if unsigned else -7) if xz is None else xz, x.dtype)
    w = r.integers(-wmax, wmax + 1, (n, k)).astype(np.int8)
    ws = r.uniform(0.002, 0.01, n).astype(F32)
    bias = r.integers(-bias_max, bias_max + 1, n).astype(np.int32)
    args = [x, np.asarray(0.05, F32), xz, w, ws, np.zeros(n, np.int8), bias]
    if y:
        args += [np.asarray(0.4, F32), np.array(120, np.uint8)]
    return args


def _cases():
    r = np.random.default_rng(31)
    out = []
    for op in ("qlinear_dense", "qdense", "qlinear_conv2d", "qdense_dynamic"):
        out += [(op, list(s.args), dict(s.attrs)) for s in OPS[op].samples()]
    # at the float32 bound's edges: K * 255 * 127 just below 2^24 (float32 sums), just
    # above (float64), and a bias that makes the float32 add inexact (float64 epilogue)
    out.append(("qlinear_dense", _dense_case(r, 3, 518, 9, True, xz=0), {}))
    out.append(("qlinear_dense", _dense_case(r, 3, 519, 9, True, xz=0), {"qmin": 125}))
    out.append(("qdense", _dense_case(r, 2, 500, 7, True, xz=0, bias_max=2_000_000_000,
                                      y=False), {}))
    out.append(("qdense_dynamic", [r.standard_normal((4, 600)).astype(F32),
                                   r.integers(-127, 128, (5, 600)).astype(np.int8),
                                   r.uniform(0.001, 0.01, 5).astype(F32)], {}))
    x = r.integers(0, 256, (1, 3, 9, 8)).astype(np.uint8)
    w = r.integers(-127, 128, (6, 1, 3, 3)).astype(np.int8)
    out.append(("qlinear_conv2d", [x, np.asarray(0.05, F32), np.array(7, np.uint8), w,
                                   r.uniform(0.002, 0.01, 6).astype(F32), np.zeros(6, np.int8),
                                   r.integers(-500, 500, 6).astype(np.int32),
                                   np.asarray(0.3, F32), np.array(-3, np.int8)],
                dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=3, qmax=60)))
    # weight zero points per channel (not what sampan.quant writes, but the ops take them)
    a = _dense_case(r, 4, 33, 6, True)
    a[5] = r.integers(-5, 6, 6).astype(np.int8)
    out.append(("qlinear_dense", a, {}))
    c = list(out[-2][1])
    c[5] = r.integers(-4, 5, 6).astype(np.int8)
    out.append(("qlinear_conv2d", c, dict(out[-2][2])))
    return out


CASES = _cases()


def _reference(op, args, kw):
    if op == "qdense_dynamic":
        return _ref_dynamic(*args)
    return _ref_layer(op, *args, **kw)


def _node(op, args, kw):
    """A one-node Graph of `op` whose inputs but the first are constants."""
    g = Graph("one")
    x = g.add_input(args[0].shape, args[0].dtype, name="x")
    n = g.add_node(op, [x] + [g.add_const(np.asarray(a)) for a in args[1:]], dict(kw))
    g.outputs = [n.outputs[0]]
    return g, n


@pytest.mark.parametrize("i", range(len(CASES)))
def test_numpy_kernels_equal_the_reference(i):
    op, args, kw = CASES[i]
    want = _reference(op, args, kw)
    got = OPS[op].kernels["numpy"](*args, **kw)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    _, n = _node(op, args, kw)
    fn = bind(n)                        # the weights prepared once, at bind time
    for _ in range(2):
        np.testing.assert_array_equal(fn(*args), want)


def test_float32_bound_decides_the_gemm():
    # max|x - xz| = 255, max|w| = 127: K = 518 keeps float32 sums, 519 does not
    assert 518 * 255 * 127 < 2 ** 24 <= 519 * 255 * 127
    assert _qfast.act_bound(np.uint8, 0) == 255 and _qfast.act_bound(np.uint8, 128) == 128
    assert _qfast.act_bound(np.int8, -7) == 134
    wt = _qfast.Weight(np.array([[3, -120], [5, 0]], np.int8), np.array([0, 5], np.int8))
    assert wt.bmax == 120 and wt.w32.dtype == np.float32
    np.testing.assert_array_equal(wt.rowsum, [-117, -5])


def _ort_run(op, args, kw):
    pytest.importorskip("onnxruntime")
    from sampan.backends.onnxruntime import build_model, runner_for  # noqa: F401
    from sampan.backends.onnxruntime import OrtRunner
    ins = [(tuple(args[0].shape), args[0].dtype)] + [np.asarray(a) for a in args[1:]]
    body = ((op, tuple(range(len(args))), tuple(sorted(kw.items())), 1),)
    model = build_model(ins, body, (len(args),))
    return OrtRunner(model.SerializeToString(), 1, 1).run([args[0]])[0]


def _six_bits(args, op):
    """The case with weights in [-63, 63] (no int16 pair sum can saturate anywhere)."""
    args = list(args)
    wi = 1 if op == "qdense_dynamic" else 3
    args[wi] = (args[wi] // 2).astype(np.int8)
    return args


@pytest.mark.parametrize("i", range(len(CASES)))
def test_onnxruntime_runs_the_lowering_exactly(i):
    op, args, kw = CASES[i]
    args = _six_bits(args, op)
    got = _ort_run(op, args, kw)
    want = _reference(op, args, kw)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def _lenet_program(tmp_path):
    from sampan import nn
    sampan.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(4, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(72, 16), nn.ReLU(), nn.Linear(16, 10))
    net.eval()
    r = np.random.default_rng(5)
    ex = (sampan.tensor(r.standard_normal((2, 1, 16, 16)).astype(F32)),)
    path = sampan.jit.save(net, os.path.join(tmp_path, "cnn.sampan"), ex,
                           dynamic={"x": {0: "batch"}})
    cal = [r.standard_normal((16, 1, 16, 16)).astype(F32) for _ in range(2)]
    q8 = sampan.quant.quantize_program(path, cal, os.path.join(tmp_path, "cnn8.sampan"))
    return q8, r.standard_normal((3, 1, 16, 16)).astype(F32)


def _serve(path, runtime, x):
    import sampan.inference as inf
    cfg = inf.Config(path)
    cfg.set_runtime(runtime)
    p = inf.create_predictor(cfg)
    return p, p.run([x])[0]


LAYER_OPS = ("qlinear_dense", "qdense", "qlinear_conv2d", "qdense_dynamic")


def _served_by_reference(q8, x, monkeypatch):
    """The program run with `_qref`'s kernels in place of the four ops' kernels."""
    from sampan.backends.numpy import NumpyProvider
    with monkeypatch.context() as mp:
        mp.setattr(NumpyProvider, "bound_kernels", ())
        for op in LAYER_OPS:
            def ref(*args, _op=op, **kw):
                return _reference(_op, list(args), kw)
            mp.setattr(OPS[op], "kernel", ref)
            mp.setitem(OPS[op].kernels, "numpy", ref)
        return _serve(q8, "numpy", x)[1]


def test_int8_program_stays_int8_on_numpy_and_onnxruntime(tmp_path, monkeypatch):
    q8, x = _lenet_program(tmp_path)
    want = _served_by_reference(q8, x, monkeypatch)
    p, got = _serve(q8, "numpy", x)
    np.testing.assert_array_equal(got, want)
    assert {"qlinear_conv2d", "qlinear_dense", "qdense"} <= {n.op for n in p.graph.nodes}
    pytest.importorskip("onnxruntime")
    p, got = _serve(q8, "onnxruntime", x)
    body = [e[0] for n in p.graph.nodes if n.op == "engine" for e in n.attrs["body"]]
    assert body.count("qlinear_conv2d") == 2 and "qlinear_dense" in body and "qdense" in body
    assert not {"qlinear_conv2d", "qlinear_dense", "qdense"} & {n.op for n in p.graph.nodes}
    # onnxruntime's int8 GEMM: exact on VNNI, int16 pair sums elsewhere (its own limit)
    np.testing.assert_allclose(got, want, atol=0.05 * float(np.abs(want).max()))
    assert (got.argmax(1) == want.argmax(1)).all()


@pytest.mark.parametrize("op", LAYER_OPS)
def test_empty_batch(op):
    s = OPS[op].samples()[0]
    args = [s.args[0][:0]] + list(s.args[1:])
    want = _reference(op, args, dict(s.attrs))
    got = OPS[op].kernels["numpy"](*args, **s.attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
