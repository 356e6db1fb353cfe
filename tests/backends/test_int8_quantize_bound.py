"""Issue 31, LeNet int8 at batch 1: the numba provider's bound `quantize` (constant
per-tensor scale and zero point, `_quantize_flat`: a scalar scale of x's type, no
reshapes) gives the reference's bytes: ties, NaN, values past either bound, uint8 and
int8 zero points, float32 and float64 inputs of any rank."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from sampan.ir.graph import Graph
from sampan.ops.registry import OPS


@pytest.mark.parametrize("fdt", [np.float32, np.float64])
@pytest.mark.parametrize("zdt,zp", [(np.uint8, 3), (np.int8, -7)])
def test_bound_quantize_exact(fdt, zdt, zp):
    pytest.importorskip("numba")
    from sampan.backends.numba.provider import PROVIDER
    r = np.random.default_rng(3)
    scale = np.asarray(0.0173, fdt)
    for shape in ((1, 1, 28, 28), (2, 37), (7,)):
        x = (r.standard_normal(shape) * 3).astype(fdt)
        flat = x.reshape(-1)
        flat[:6] = [np.nan, 1e9, -1e9, 2.5 * scale, -0.5 * scale, 0.0]   # ties, NaN, clips
        g = Graph("one")
        xi = g.add_input(x.shape, x.dtype, name="x")
        n = g.add_node("quantize", [xi, g.add_const(scale), g.add_const(np.array(zp, zdt))],
                       {})
        fn = PROVIDER.bind(n)
        assert not isinstance(fn, functools.partial)          # the bound path, not plain
        want = OPS["quantize"].kernels["numpy"](x, scale, np.array(zp, zdt))
        got = fn(x, scale, np.array(zp, zdt))
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
