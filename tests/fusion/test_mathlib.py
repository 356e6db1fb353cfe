"""mathlib's vectorisable float32 functions against float64 references rounded to float32:
the ulp bounds of `ACCURACY` over each function's useful range, and IEEE special values."""
import math

import numpy as np
import pytest

pytest.importorskip("numba")
from numba import njit

from sampan.backends.numba import mathlib as ml
from sampan.backends.numba.kernelgen import ELEMENTWISE_FASTMATH

_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _loop(f):
    @njit(fastmath=ELEMENTWISE_FASTMATH, error_model="numpy")
    def run(a, out):
        for i in range(a.size):
            out[i] = f(a[i])
    return run


CASES = {  # name -> (float32 function, float64 reference, grid)
    "exp": (ml.exp32, np.exp, np.linspace(-104, 88.72, 400_001)),
    "log": (ml.log32, np.log, np.concatenate([10.0 ** np.linspace(-37, 38, 200_001),
                                              np.linspace(0.25, 4, 200_001)])),
    "tanh": (ml.tanh32, np.tanh, np.linspace(-10, 10, 400_001)),
    "erf": (ml.erf32, _erf64, np.concatenate([np.linspace(-5, 5, 400_001),
                                              10.0 ** np.linspace(-38, 0.6, 100_001)])),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ulps_within_accuracy(name):
    f, ref, grid = CASES[name]
    x = grid.astype(np.float32)
    got = np.empty_like(x)
    _loop(f)(x, got)
    want = ref(x.astype(np.float64)).astype(np.float32)
    ok = np.isfinite(want) & (want != 0)
    ulps = (np.abs(got[ok].astype(np.float64) - want[ok])
            / np.spacing(np.abs(want[ok])).astype(np.float64))
    assert ulps.max() <= ml.ACCURACY[name], (name, ulps.max(), x[ok][np.argmax(ulps)])
    assert ulps.max() > 0   # a real comparison, not a copy of the reference


@pytest.mark.parametrize("name", sorted(CASES))
def test_special_values(name):
    f, ref, _ = CASES[name]
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 3e38, -3e38],
                 np.float32)
    got = np.empty_like(x)
    _loop(f)(x, got)
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-6, atol=0)


def test_erf_is_odd_and_bounded():
    x = np.linspace(0, 6, 100_001).astype(np.float32)
    pos, neg = np.empty_like(x), np.empty_like(x)
    run = _loop(ml.erf32)
    run(x, pos)
    run(-x, neg)
    np.testing.assert_array_equal(pos, -neg)
    assert np.all(np.abs(pos) <= 1)
    assert np.all(pos[x >= 3.925] == 1)   # where float32 erf rounds to 1
    # not exactly monotone near 1 (rounding of P/Q), but within the accuracy bound
    drop = np.maximum(-np.diff(pos), 0) / np.spacing(pos[1:])
    assert drop.max() <= 2 * ml.ACCURACY["erf"]


def _dgelu64(x):
    return (0.5 * (1 + _erf64(x / math.sqrt(2)))
            + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))


def test_dgelu_absolute_error_and_special_values():
    x = np.concatenate([np.linspace(-9, 9, 400_001), 10.0 ** np.linspace(-38, 0.9, 50_001),
                        -(10.0 ** np.linspace(-38, 0.9, 50_001))]).astype(np.float32)
    got = np.empty_like(x)
    _loop(ml.dgelu32)(x, got)
    err = np.abs(got.astype(np.float64) - _dgelu64(x.astype(np.float64)))
    assert err.max() <= ml.ACCURACY_ABS["dgelu"], (err.max(), x[np.argmax(err)])
    assert err.max() > 1e-8
    # the maximum of GELU' (1.1289 at x = 2.1229) and the saturation beyond |x| = 6
    assert abs(got[np.argmax(got)] - 1.1289) < 1e-4
    assert np.unique(got[x >= 6]).size == 1 and abs(got[x >= 6][0] - 1) <= 3e-7
    s = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    out = np.empty_like(s)
    _loop(ml.dgelu32)(s, out)
    assert np.isnan(out[0])
    np.testing.assert_allclose(out[1:], [1.0, 0.0, 0.5, 0.5], atol=3e-7)


def test_dgelu64_matches_reference():
    @njit
    def run(a, out):
        for i in range(a.size):
            out[i] = ml.dgelu64(a[i])
    x = np.linspace(-10, 10, 10_001)
    out = np.empty_like(x)
    run(x, out)
    np.testing.assert_allclose(out, _dgelu64(x), rtol=1e-13, atol=1e-15)
