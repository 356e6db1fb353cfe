"""The where kernel's compiled path (contiguous operands, scalars, a condition broadcast
over leading dims) against numpy's np.where, and its fallback for other layouts."""
import numpy as np
import pytest

import sampan  # noqa: F401  (installs the numba kernels)
from sampan.ops.registry import OPS

_where_kernel = OPS["where"].kernel   # the default: numba's loop where installed

LAYOUTS = [((3, 4), (3, 4), (3, 4)), ((4,), (3, 4), ()), ((3, 4), (), (3, 4)),
           ((1, 4), (2, 3, 4), (1,)), ((3, 1), (3, 4), (3, 4)), ((3, 4), (), ()),
           ((0, 4), (0, 4), (0, 4)), ((2, 3, 4), (3, 4), (2, 3, 4)), ((5,), (2, 5), (2, 1))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cs,as_,bs", LAYOUTS)
def test_where_matches_numpy(cs, as_, bs, dtype):
    r = np.random.default_rng(0)
    c = r.random(cs) > 0.5
    a = r.standard_normal(as_).astype(dtype)
    b = r.standard_normal(bs).astype(dtype)
    out, ref = _where_kernel(c, a, b), np.where(c, a, b)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_array_equal(out, ref)


def test_where_keeps_nan_inf_and_handles_views():
    c = np.array([True, True, False, True])
    a = np.array([np.nan, -np.inf, 1.0, 2.0], np.float32)
    np.testing.assert_array_equal(_where_kernel(c, a, np.float32(7)), [np.nan, -np.inf, 7, 2])
    m = np.random.default_rng(1).random((6, 8)) > 0.5
    x = np.arange(96, dtype=np.float32).reshape(8, 12)[:, ::2].T  # non-contiguous
    np.testing.assert_array_equal(_where_kernel(m[:6, :8], x, np.float32(0)),
                                  np.where(m[:6, :8], x, 0))
