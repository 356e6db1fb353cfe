"""The float32 softmax / log-softmax rows in blocks that sampan's threads claim (inputs of
at least `PAR_MIN` elements, the W8 attention's 6.3M) give the serial loop's bytes,
masked (-inf / float32 min) entries included, and numpy's float64 numbers."""
import numpy as np
import pytest

import sampan

R = pytest.importorskip("sampan.backends.numba.loops.rowwise")


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("width", [96, 37])
def test_parallel_rows_equal_the_serial_loop(log, width):
    """Also the rows' maxima by the AVX-512 kernel (`_maxima`, where the CPU has it)
    against the kernel's own loop, rows of a width that is no multiple of 16."""
    r = np.random.default_rng(7)
    x = (r.standard_normal((R.PAR_MIN // width + 3, width)) * 4).astype(np.float32)
    x[::5, 30:] = np.finfo(np.float32).min
    x[1, :] = -np.inf if log else x[1, :]
    x[2, :10] = 80.0
    want = np.empty_like(x)
    R._K[np.dtype(np.float32)][0](x, log, want, want, np.empty(x.shape[0], np.float32))
    before = sampan.get_num_threads()
    try:
        sampan.set_num_threads(2)
        got = R._softmax_rows(x, log)
    finally:
        sampan.set_num_threads(before)
    np.testing.assert_array_equal(got, want)
    ok = np.isfinite(x).all(1)
    x64 = x[ok].astype(np.float64)
    z = x64 - x64.max(1, keepdims=True)
    ref = z - np.log(np.exp(z).sum(1, keepdims=True)) if log else (
        np.exp(z) / np.exp(z).sum(1, keepdims=True))
    assert np.abs(got[ok] - ref)[np.isfinite(ref)].max() < 1e-5
    assert x.size >= R.PAR_MIN
