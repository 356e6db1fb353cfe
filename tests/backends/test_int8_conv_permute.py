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
    from sampan.backends.numba import qlayers, vnni
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
    p = (((shape[2] + 2 * pad - k) // stride + 1) * ((shape[3] + 2 * pad - k) // stride + 1))
    poff = conv._plan((x.shape, (stride,) * 2, (pad,) * 2, (1, 1), np.uint8))[5]
    fits = stride < 5
    has = vnni.packed_kernel(False, True, direct=2) is not None
    assert (qlayers._permute_index(poff, p) is not None) == (fits and has)


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
    key = (x.shape, (1, 1), (0, 0), (1, 1), np.float32)
    plan = list(conv._plans[key])
    assert plan[10] is not plan[5]                       # the permute read was chosen
    plan[8] = qlayers._direct_call(False, False, False)  # force the gather read
    plan[10] = plan[5]
    conv._plans[key] = tuple(plan)
    np.testing.assert_array_equal(conv.run(*args), got)
