"""Issue 31, LeNet int8 at batch 1: the direct VNNI conv reads each block of 16 windows
with one 64-byte load and a byte permute (`vnni.packed_kernel(..., direct=2)`) instead of
a hardware gather, where the block's windows span at most 64 bytes, and keeps the gather
elsewhere; both give the exact reference's bytes (LeNet's two layers, strides, batches,
an int8 input and float32 output)."""
from __future__ import annotations

import numpy as np
import pytest

from sampan.ops.registry import OPS

F32 = np.float32


def _layer(w):
    pytest.importorskip("numba")
    from sampan.backends.numba import qdirect as qlayers, vnni
    if vnni.packed_kernel(False, True, direct=True) is None:
        pytest.skip("no VNNI kernel on this CPU")
    return qlayers.DirectConv(w, 1), qlayers, vnni


def _args(r, o, c, k, signed, fp32_out=False):
    w = r.integers(-127, 128, (o, c, k, k)).astype(np.int8)
    xz = np.array(-5 if signed else 11, np.int8 if signed else np.uint8)
    rest = [np.asarray(0.05, F32), xz, w, r.uniform(0.002, 0.01, o).astype(F32),
            np.zeros(o, np.int8), r.integers(-500, 500, o).astype(np.int32),
            np.asarray(0.4, F32), np.array(2, np.uint8)]
    return rest


@pytest.mark.parametrize("shape,o,k,stride,pad,signed", [
    ((1, 1, 28, 28), 6, 5, 1, 2, False),      # LeNet conv1
    ((1, 6, 14, 14), 16, 5, 1, 0, False),     # LeNet conv2
    ((3, 6, 14, 14), 16, 5, 1, 0, True),      # a batch, int8 input
    ((2, 3, 17, 23), 8, 3, 2, 1, False),      # stride 2: still within 64 bytes
    ((1, 2, 9, 90), 4, 3, 5, 1, False),       # stride 5: 16 windows span > 64 bytes
])
def test_direct_conv_permute_exact(shape, o, k, stride, pad, signed):
    r = np.random.default_rng(31)
    rest = _args(r, o, shape[1], k, signed)
    x = (r.integers(-128, 128, shape).astype(np.int8) if signed
         else r.integers(0, 256, shape).astype(np.uint8))
    attrs = dict(stride=(stride, stride), padding=(pad, pad), dilation=(1, 1), groups=1)
    want = OPS["qlinear_conv2d"].kernels["numpy"](x, *rest, **attrs)
    from sampan.backends.numba.provider import PROVIDER
    from sampan.ir.graph import Graph
    g = Graph("one")
    xi = g.add_input(x.shape, x.dtype, name="x")
    n = g.add_node("qlinear_conv2d", [xi] + [g.add_const(np.asarray(a)) for a in rest],
                   dict(attrs))
    conv, qlayers, vnni = _layer(rest[2])
    fn = PROVIDER.bind(n)
    np.testing.assert_array_equal(fn(x, *rest), want)
    # which read the plan chose: permute where the blocks fit and the CPU has VBMI
    params = conv.params(rest[5], int(rest[1]) + (128 if signed else 0),
                         np.full(o, 0.01, F32))
    conv.run(x, 0, signed, params, 2, 0, 255, np.uint8, attrs["stride"], attrs["padding"],
             (1, 1))
    (plan,) = conv._plans.values()
    has = vnni.packed_kernel(False, True, direct=2) is not None
    permuted = plan[7][3] is not plan[7][1]      # its byte indices, not the offsets
    assert permuted == (stride < 5 and has)


def test_direct_conv_permute_float_out_matches_gather():
    """The float32-output kernel (qdense-style epilogue) through both reads: the same
    numbers, bit for bit."""
    r = np.random.default_rng(5)
    rest = _args(r, 16, 6, 5, False)
    conv, qlayers, vnni = _layer(rest[2])
    if vnni.packed_kernel(False, False, direct=2) is None:
        pytest.skip("no VBMI kernel on this CPU")
    x = r.integers(0, 256, (2, 6, 14, 14)).astype(np.uint8)
    params = conv.params(rest[5], 11, np.full(16, 0.01, F32))
    args = (x, 11, False, params, 0, 0, 255, np.float32, (1, 1), (0, 0), (1, 1))
    got = conv.run(*args)
    (plan,) = conv._plans.values()
    assert plan[7][3] is not plan[7][1]                          # the permute read
    twin, _, _ = _layer(rest[2])
    twin.permute = False                                         # the gather read
    np.testing.assert_array_equal(twin.run(x, 11, False, twin.params(
        rest[5], 11, np.full(16, 0.01, F32)), 0, 0, 255, np.float32, (1, 1), (0, 0),
        (1, 1)), got)


def test_direct_conv_compact_rows_groups_exact():
    """Rows written p apart (p = 7 * 11, not a multiple of 16) in one group, and padded
    rows in two groups, each over two images: the same bytes as the reference."""
    r = np.random.default_rng(9)
    rest = _args(r, 6, 2, 3, False)
    rest[2] = r.integers(-127, 128, (6, 2, 3, 3)).astype(np.int8)
    for groups in (1, 2):
        _compact_case(r, rest, groups)


def _compact_case(r, rest, groups):
    x = r.integers(0, 256, (2, 2 * groups, 9, 13)).astype(np.uint8)
    attrs = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=groups)
    want = OPS["qlinear_conv2d"].kernels["numpy"](x, *rest, **attrs)
    _layer(rest[2])
    from sampan.backends.numba.provider import PROVIDER
    from sampan.ir.graph import Graph
    g = Graph("one")
    xi = g.add_input(x.shape, x.dtype, name="x")
    n = g.add_node("qlinear_conv2d", [xi] + [g.add_const(np.asarray(a)) for a in rest],
                   dict(attrs))
    fn = PROVIDER.bind(n)
    got = fn(x, *rest)
    assert got.flags.c_contiguous == (groups == 1)      # no copy where rows are p apart
    np.testing.assert_array_equal(got, want)
