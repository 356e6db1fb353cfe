"""max_pool2d's gradient: the 2x2/stride-2 select kernel against the general loop, with
NaN, inf and odd spatial sizes (rows and columns no window covers get zeros)."""
import numpy as np
import pytest

from sampan.ops import pool


@pytest.mark.skipif(not pool.HAVE_NUMBA, reason="needs numba")
@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (2, 3, 7, 9), (1, 1, 5, 4), (1, 2, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_2x2_gradient_matches_general_loop(shape, dtype):
    r = np.random.default_rng(0)
    x = r.standard_normal(shape).astype(dtype)
    x.flat[::7] = np.nan
    x.flat[3] = np.inf
    g = r.standard_normal(shape[:2] + (shape[2] // 2, shape[3] // 2)).astype(dtype)
    g.flat[0] = np.inf
    fast = pool._max_grad_kernel(x, g, (2, 2), (2, 2), (0, 0), (1, 1))
    ref = np.zeros(shape, dtype)
    pool._max_grad_loop(np.ascontiguousarray(x), g, 2, 2, 2, 2, 1, 1, ref)
    np.testing.assert_array_equal(fast, ref)
