"""The int8 conv with its 2x2 max-pool in one kernel (`qlinear_conv2d_pool`, written by
`fuse_layers` where the numba provider serves the conv): the numba kernel gives the bytes
of the unfused chain (`qlinear_conv2d` then `max_pool2d`) and of an independent integer
reference (int64 sums, onnxruntime's float32 requantisation, numpy max over windows), on
the serial, chunked and split-over-threads paths; the Predictor's int8 CNN (two conv +
pool blocks) serves both pools fused and answers as the unfused program does."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.ops.registry import OPS

from . import planted as P

POOL = dict(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1))


def _numba(op):
    k = OPS[op].kernels.get("numba")
    if k is None:
        pytest.skip("no numba")
    return k


def _reference(x, xs, xz, w, ws, bias, ys, yz, lo, hi, stride, padding, groups):
    """int64 conv sums by explicit windows, float32 requantisation (round half to even,
    saturate to [lo, hi]), then the 2x2 stride-2 max-pool (floor) by slicing."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw) = stride, padding
    xp = np.full((n, c, h + 2 * ph, wd + 2 * pw), int(xz), np.int64)
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    ho, wo = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    acc = np.zeros((n, o, ho, wo), np.int64)
    og = o // groups
    for g in range(groups):
        xs_g = xp[:, g * cg:(g + 1) * cg] - int(xz)
        wg = w[g * og:(g + 1) * og].astype(np.int64)
        for i in range(kh):
            for j in range(kw):
                win = xs_g[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]
                acc[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", win, wg[:, :, i, j])
    acc += bias.astype(np.int64).reshape(1, -1, 1, 1)
    m = (np.float32(xs) * ws.astype(np.float32)) / np.float32(ys)
    q = np.rint(acc.astype(np.float32) * m.reshape(1, -1, 1, 1)).astype(np.int64) + int(yz)
    y = np.clip(q, lo, hi)
    h2, w2 = ho // 2, wo // 2
    t = y[:, :, :2 * h2, :2 * w2]
    return np.maximum(np.maximum(t[:, :, 0::2, 0::2], t[:, :, 0::2, 1::2]),
                      np.maximum(t[:, :, 1::2, 0::2], t[:, :, 1::2, 1::2]))


CASES = [((1, 1, 28, 28), (6, 1, 5, 5), (1, 1), (2, 2), 1),      # LeNet's first, batch 1
         ((64, 1, 28, 28), (6, 1, 5, 5), (1, 1), (2, 2), 1),     # batch 64: many chunks
         ((3, 6, 14, 14), (16, 6, 5, 5), (1, 1), (0, 0), 1),     # LeNet's second
         ((2, 4, 9, 11), (6, 4, 3, 3), (2, 1), (1, 0), 1),       # odd sizes: floor
         ((2, 4, 9, 9), (6, 2, 3, 3), (1, 1), (1, 1), 2)]        # groups: pooled after


@pytest.mark.parametrize("shape,wshape,stride,padding,groups", CASES)
def test_fused_pool_matches_the_chain_and_the_reference(shape, wshape, stride, padding,
                                                        groups):
    r = np.random.default_rng(sum(shape) + sum(wshape))
    x = r.integers(0, 256, shape).astype(np.uint8)
    w = r.integers(-127, 128, wshape).astype(np.int8)
    o = wshape[0]
    ws = r.uniform(0.001, 0.01, o).astype(np.float32)
    bias = r.integers(-5000, 5000, o).astype(np.int32)
    xs, xz, ys, yz = np.float32(0.02), np.uint8(128), np.float32(0.3), np.uint8(100)
    attrs = dict(stride=stride, padding=padding, dilation=(1, 1), groups=groups)
    for qmin in (None, 100):                # plain, and a folded ReLU
        args = (x, xs, xz, w, ws, np.zeros(o, np.int8), bias, ys, yz)
        want = _reference(x, xs, xz, w, ws, bias, ys, yz, qmin or 0, 255, stride, padding,
                          groups)
        chain = _numba("max_pool2d")(_numba("qlinear_conv2d")(
            *[np.asarray(a) for a in args], **attrs, qmin=qmin), **POOL)
        for kern in (OPS["qlinear_conv2d_pool"].kernels["numpy"],
                     _numba("qlinear_conv2d_pool")):
            got = kern(*[np.asarray(a) for a in args], **attrs, qmin=qmin)
            assert got.dtype == np.uint8 and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
            assert got.tobytes() == chain.tobytes()
    # int8 input carrying the same values (zero point 0): the same bytes
    xi = (x.astype(np.int16) - 128).astype(np.int8)
    got = _numba("qlinear_conv2d_pool")(xi, xs, np.asarray(np.int8(0)), w, ws,
                                        np.zeros(o, np.int8), bias, ys, np.asarray(yz),
                                        **attrs)
    np.testing.assert_array_equal(got, _reference(x, xs, xz, w, ws, bias, ys, yz, 0, 255,
                                                  stride, padding, groups))


def test_fused_pool_split_over_threads_and_chunked(monkeypatch):
    """The images split over numba's threads (each part pooling its own chunks) give the
    bytes of the serial call."""
    pytest.importorskip("numba")
    from sampan.backends.numba import qdirect
    r = np.random.default_rng(7)
    x = r.integers(0, 256, (37, 6, 14, 14)).astype(np.uint8)
    w = r.integers(-127, 128, (16, 6, 5, 5)).astype(np.int8)
    args = [np.asarray(a) for a in (x, np.float32(0.02), np.uint8(120), w,
                                    r.uniform(0.001, 0.01, 16).astype(np.float32),
                                    np.zeros(16, np.int8),
                                    r.integers(-900, 900, 16).astype(np.int32),
                                    np.float32(0.05), np.uint8(3))]
    attrs = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, qmin=3)
    serial = _numba("qlinear_conv2d_pool")(*args, **attrs)
    monkeypatch.setattr(qdirect, "conv_split_size", lambda: 1)       # split every call
    monkeypatch.setattr(qdirect, "_POOL_CHUNK", 700)                 # 1 image a chunk
    split = _numba("qlinear_conv2d_pool")(*args, **attrs)
    assert split.tobytes() == serial.tobytes()
    want = _reference(x, *args[1:3], w, args[4], args[6], args[7], args[8], 3, 255,
                      (1, 1), (0, 0), 1)
    np.testing.assert_array_equal(serial, want)


def test_rule_rejects_an_output_too_small_to_pool():
    from sampan.errors import SampanError
    r = np.random.default_rng(1)
    args = [np.asarray(a) for a in (r.integers(0, 256, (1, 1, 5, 5)).astype(np.uint8),
                                    np.float32(0.02), np.uint8(0),
                                    r.integers(-9, 9, (2, 1, 5, 5)).astype(np.int8),
                                    np.float32(0.01), np.int8(0), np.zeros(2, np.int32),
                                    np.float32(0.1), np.uint8(0))]
    from sampan.ops.registry import Spec
    specs = [Spec(a.shape, a.dtype) for a in args]
    with pytest.raises(SampanError, match="qlinear_conv2d_pool"):
        OPS["qlinear_conv2d_pool"].shape_rule(*specs, stride=(1, 1), padding=(0, 0),
                                              dilation=(1, 1), groups=1)


def test_predictor_serves_the_int8_cnn_with_both_pools_fused(tmp_path):
    pytest.importorskip("numba")
    import sampan.inference as inf
    (x, _), (xt, _) = P.task(300, 0), P.task(100, 1)
    d = sampan.jit.save(P.cnn(), str(tmp_path / "cnn.sampan"), (sampan.Tensor(xt[:4]),),
                        dynamic="batch")
    q8 = sampan.quant.quantize_program(d, [x[:200]], str(tmp_path / "q.sampan"))
    cfg = inf.Config(q8)
    cfg.set_runtime("numba")
    p = inf.create_predictor(cfg)
    ops = [n.op for n in p.graph.nodes]
    if "qlinear_conv2d" not in ops and "qlinear_conv2d_pool" not in ops:
        pytest.skip("the numba provider does not serve the int8 conv here")
    assert ops.count("qlinear_conv2d_pool") == 2
    assert "max_pool2d" not in ops and "qlinear_conv2d" not in ops
    with sampan.backends.set_providers(["numpy"]):
        unfused = sampan.jit.load(q8)
    h = p.get_input_handle(p.get_input_names()[0])
    o = p.get_output_handle(p.get_output_names()[0])
    for b in (1, 64, 7):
        xb = np.ascontiguousarray(xt[:b])
        h.copy_from_cpu(xb)
        p.run()
        got = o.copy_to_cpu()
        with sampan.backends.set_providers(["numpy"]):
            want = unfused(sampan.Tensor(xb)).numpy()
        np.testing.assert_array_equal(got, want)
