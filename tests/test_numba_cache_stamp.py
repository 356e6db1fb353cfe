"""sampan's cached numba kernels are stamped with mathlib's source too (they inline its
functions), so a mathlib change invalidates them; other code keeps numba's locators."""
import hashlib
import os

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import sampan
from sampan.backends.numba.loops.unary import _gelu32_loop


def _cached_here(x):
    return x + 1


def test_sampan_kernels_stamp_mathlib_source():
    loc = _gelu32_loop._cache._impl._locator
    mathlib = os.path.join(os.path.dirname(sampan.__file__), "backends", "numba",
                           "mathlib.py")
    with open(mathlib, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    own, extra = loc.get_source_stamp()
    assert extra == want and own      # own: numba's stamp of the loop's own file
    out = np.empty(3, np.float32)
    _gelu32_loop(np.array([-1, 0, 1], np.float32), out)
    np.testing.assert_allclose(out, [-0.15865526, 0.0, 0.8413447], rtol=1e-6)


def test_other_code_keeps_numbas_locators():
    f = numba.njit(cache=True)(_cached_here)
    assert not getattr(type(f._cache._impl._locator), "_sampan", False)
    assert f(1) == 2
