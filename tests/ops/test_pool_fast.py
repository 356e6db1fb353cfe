"""max_pool2d's 2x2/stride-2 loops against the general ones: ties (relu zeros), infinities,
NaN (the gradient loop hands those to the general loop), odd spatial sizes (rows and
columns no window covers get zeros) and both float types."""
import numpy as np
import pytest

import sampan  # noqa: F401  (installs the numba kernels)
from sampan.backends.numba import available
from sampan.ops import pool

if available():
    from sampan.backends.numba.loops import pool as nbpool   # the loops' kernels

SHAPES = [(2, 3, 8, 8), (2, 3, 7, 9), (1, 1, 5, 4), (1, 2, 2, 2), (4, 6, 28, 28)]


def _input(shape, dtype, special):
    r = np.random.default_rng(0)
    x = r.standard_normal(shape).astype(dtype)
    x[x < 0.3] = 0           # ties, as after a relu
    if special == "nan":
        x.flat[::7] = np.nan
    if special in ("nan", "inf"):
        x.flat[3] = np.inf
        x.flat[-1] = -np.inf
    g = r.standard_normal(shape[:2] + (shape[2] // 2, shape[3] // 2)).astype(dtype)
    return x, g


@pytest.mark.skipif(not available(), reason="needs numba")
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("special", ["none", "inf", "nan"])
def test_2x2_gradient_matches_general_loop(shape, dtype, special):
    x, g = _input(shape, dtype, special)
    g.flat[0] = np.inf
    fast = nbpool.max_pool2d_grad(x, g, (2, 2), (2, 2), (0, 0), (1, 1))
    ref = np.zeros(shape, dtype)
    nbpool._max_grad_loop(np.ascontiguousarray(x), g, 2, 2, 2, 2, 1, 1, ref)
    np.testing.assert_array_equal(fast, ref)


@pytest.mark.skipif(not available(), reason="needs numba")
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("special", ["none", "inf", "nan"])
def test_2x2_forward_matches_window_maximum(shape, special):
    x, _ = _input(shape, np.float32, special)
    fast = nbpool.max_pool2d(x, (2, 2), (2, 2), (0, 0), (1, 1))
    ho, wo = shape[2] // 2, shape[3] // 2
    w = x[:, :, :2 * ho, :2 * wo].reshape(shape[0], shape[1], ho, 2, wo, 2)
    np.testing.assert_array_equal(fast, w.max(axis=(3, 5)))   # np.max propagates NaN
