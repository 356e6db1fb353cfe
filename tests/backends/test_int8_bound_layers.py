"""Issue 31, LeNet int8 at batch 1: the numba provider's bound int8 layers take their
short paths (a dense layer's batch-1 rows straight to the VNNI kernel; a conv's geometry
made once per input shape) and still give the exact reference's bytes, for a batch-1
row, a view of a padded row, a second batch size and an int8 input."""
from __future__ import annotations

import numpy as np
import pytest

from sampan.ir.graph import Graph
from sampan.ops.registry import OPS

F32 = np.float32


def _bound(op, args, attrs):
    pytest.importorskip("numba")
    from sampan.backends.numba import vnni
    from sampan.backends.numba.provider import PROVIDER
    if vnni.packed_kernel(True, True) is None:
        pytest.skip("no VNNI kernel on this CPU")
    g = Graph("one")
    x = g.add_input(args[0].shape, args[0].dtype, name="x")
    n = g.add_node(op, [x] + [g.add_const(np.asarray(a)) for a in args[1:]], dict(attrs))
    return PROVIDER.bind(n)


def _dense_args(r, k, n, signed):
    dt = np.int8 if signed else np.uint8
    xz = np.array(-3 if signed else 9, dt)
    return [np.asarray(0.04, F32), xz, r.integers(-127, 128, (n, k)).astype(np.int8),
            r.uniform(0.002, 0.01, n).astype(F32), np.zeros(n, np.int8),
            r.integers(-4000, 4000, n).astype(np.int32), np.asarray(0.3, F32),
            np.array(5, np.uint8)]


@pytest.mark.parametrize("signed", [False, True])
def test_dense_batch1_paths_exact(signed):
    r = np.random.default_rng(7)
    k, n = 120, 84
    rest = _dense_args(r, k, n, signed)
    lo, hi = (-128, 128) if signed else (0, 256)
    dt = np.int8 if signed else np.uint8
    padded = r.integers(lo, hi, (1, 128)).astype(dt)
    xs = [padded[:, :k], np.ascontiguousarray(padded[:, :k]),
          r.integers(lo, hi, (5, k)).astype(dt), r.integers(lo, hi, (64, k)).astype(dt)]
    for op, args_rest in (("qlinear_dense", rest), ("qdense", rest[:6])):
        attrs = {"qmin": 7} if op == "qlinear_dense" else {}
        fn = _bound(op, [xs[0]] + args_rest, attrs)
        for x in xs + xs[:1]:
            want = OPS[op].kernels["numpy"](x, *args_rest, **attrs)
            got = fn(x, *args_rest)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_conv_plans_per_shape_exact():
    r = np.random.default_rng(8)
    w = r.integers(-127, 128, (6, 3, 5, 5)).astype(np.int8)
    rest = [np.asarray(0.05, F32), np.array(11, np.uint8), w,
            r.uniform(0.002, 0.01, 6).astype(F32), np.zeros(6, np.int8),
            r.integers(-500, 500, 6).astype(np.int32), np.asarray(0.4, F32),
            np.array(2, np.uint8)]
    attrs = dict(stride=(1, 1), padding=(2, 2), dilation=(1, 1), groups=1)
    xs = [r.integers(0, 256, s).astype(np.uint8)
          for s in ((1, 3, 12, 12), (2, 3, 12, 12), (1, 3, 9, 7), (1, 3, 12, 12))]
    fn = _bound("qlinear_conv2d", [xs[0]] + rest, attrs)
    for x in xs:
        want = OPS["qlinear_conv2d"].kernels["numpy"](x, *rest, **attrs)
        np.testing.assert_array_equal(fn(x, *rest), want)


@pytest.mark.parametrize("split", [1, 1 << 40])
def test_conv_images_split_or_not_exact(monkeypatch, split):
    """An int8 convolution gives the exact reference's bytes whether its images are split
    over threads (every size split) or not (none split): `conv_split_size` only moves
    where a split starts (2^24 multiply-adds under the passive OpenMP policy, 2^20 where
    workers spin)."""
    pytest.importorskip("numba")
    from sampan import _threads
    from sampan.backends.numba import qdirect, qlayers
    monkeypatch.setattr(_threads, "openmp_wait_policy", lambda: "OMP_WAIT_POLICY=PASSIVE")
    assert qlayers.conv_split_size() == 1 << 24
    monkeypatch.setattr(_threads, "openmp_wait_policy", lambda: "OMP_WAIT_POLICY=ACTIVE")
    assert qlayers.conv_split_size() == qlayers._BIG
    monkeypatch.setattr(qlayers, "conv_split_size", lambda: split)
    monkeypatch.setattr(qdirect, "conv_split_size", lambda: split)
    r = np.random.default_rng(9)
    for cin, o, k in ((1, 6, 5), (6, 16, 5)):
        w = r.integers(-127, 128, (o, cin, k, k)).astype(np.int8)
        rest = [np.asarray(0.05, F32), np.array(11, np.uint8), w,
                r.uniform(0.002, 0.01, o).astype(F32), np.zeros(o, np.int8),
                r.integers(-500, 500, o).astype(np.int32), np.asarray(0.4, F32),
                np.array(2, np.uint8)]
        attrs = dict(stride=(1, 1), padding=(2, 2), dilation=(1, 1), groups=1)
        x = r.integers(0, 256, (8, cin, 14, 14)).astype(np.uint8)
        fn = _bound("qlinear_conv2d", [x] + rest, attrs)
        want = OPS["qlinear_conv2d"].kernels["numpy"](x, *rest, **attrs)
        np.testing.assert_array_equal(fn(x, *rest), want)
