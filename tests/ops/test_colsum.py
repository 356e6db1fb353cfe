"""sum over leading axes through the row-addition loop: bit-identical to numpy's
reduction (same order of additions), shapes and keepdims preserved, and the other axis
patterns left to numpy."""
import numpy as np
import pytest

from sampan.ops import reduce as R


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis", [((8, 128, 256), (0, 1)), ((64, 30), (0,)),
                                        ((2, 3, 4, 5), (0, 1, 2)), ((5, 1), (0,)),
                                        ((1, 7), (0,))])
@pytest.mark.parametrize("keepdims", [False, True])
def test_leading_axis_sum_is_bit_identical_to_numpy(shape, axis, dtype, keepdims):
    a = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    a.flat[3] = np.inf
    got = R._sum_kernel(a, axis, keepdims)
    ref = np.sum(a, axis=axis, keepdims=keepdims)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)


def test_other_patterns_fall_back():
    a = np.random.default_rng(1).standard_normal((4, 5, 6)).astype(np.float32)
    for axis in [(1,), (0, 2), (0, 1, 2), None]:
        np.testing.assert_array_equal(R._sum_kernel(a, axis), np.sum(a, axis=axis))
    t = a.transpose(1, 0, 2)      # not contiguous: numpy's path
    np.testing.assert_array_equal(R._sum_kernel(t, (0,)), np.sum(t, axis=(0,)))
