"""The eager relu kernel (a numba select for float32/float64) against np.maximum(a, 0),
bit for bit: NaN with its sign kept, -0.0 -> +0.0, infinities, subnormals, layouts."""
import numpy as np
import pytest

import sampan  # noqa: F401  (installs the numba kernels)
from sampan.ops.registry import OPS

_relu = OPS["relu"].kernel   # the default: numba's select where installed

SPECIALS = [-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 1.5, -1.5, 1e-45, -1e-45]


@pytest.mark.parametrize("dt,bits", [(np.float32, np.uint32), (np.float64, np.uint64)])
def test_relu_bits_match_numpy_maximum(dt, bits):
    r = np.random.default_rng(0)
    a = np.concatenate([np.array(SPECIALS, dt), r.standard_normal(1001).astype(dt)])
    got, want = _relu(a), np.maximum(a, dt(0))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(bits), want.view(bits))
    x = r.standard_normal((4, 6, 5)).astype(dt).transpose(2, 0, 1)   # not contiguous
    np.testing.assert_array_equal(_relu(x), np.maximum(x, dt(0)))
    assert _relu(np.zeros((0, 3), dt)).shape == (0, 3)


def test_relu_other_dtypes_keep_numpy():
    np.testing.assert_array_equal(_relu(np.array([1, -2, 0], np.int64)), [1, 0, 0])
