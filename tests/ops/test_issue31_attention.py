"""The `attention` op (issue 31, W8): its numba kernel against a float64 numpy reference,
with and without a key mask, over head counts, sequence lengths and batch 1; q, k and v
read in place from column slices of one projection output; both numba variants (numpy's
OpenBLAS from the kernel, and the loops); bad shapes and dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from sampan.errors import DTypeError, ShapeError
from sampan.ops.registry import OPS

OP = OPS["attention"]


@pytest.fixture(params=["loops", "blas"])
def variant(request, monkeypatch):
    """Each numba variant of the kernel in turn (SAMPAN_ATTENTION_KERNEL)."""
    from sampan.backends.numba import attention, cblas
    if request.param == "blas" and cblas.find() is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS the kernel can call")
    monkeypatch.setenv("SAMPAN_ATTENTION_KERNEL", request.param)
    assert attention.kernel_name() == request.param
    return request.param


def _ref64(q, k, v, bias, heads, scale):
    """float64, written independently of the op's kernels: one (batch, head) at a time."""
    b, s, h = q.shape
    d = h // heads
    out = np.zeros((b, s, h))
    for i in range(b):
        for j in range(heads):
            cs = slice(j * d, (j + 1) * d)
            sc = q[i, :, cs].astype(np.float64) * scale @ k[i, :, cs].astype(np.float64).T
            if bias is not None:
                sc = sc + bias[i, 0, 0].astype(np.float64)
            e = np.exp(sc - sc.max(1, keepdims=True))
            out[i, :, cs] = (e / e.sum(1, keepdims=True)) @ v[i, :, cs].astype(np.float64)
    return out


def _inputs(b, s, h, rng, sliced=False):
    if sliced:     # the int8 path: q, k, v are column slices of one (B*S, 3H) output
        qkv = rng.standard_normal((b * s, 3 * h)).astype(np.float32)
        return [qkv[:, i * h:(i + 1) * h].reshape(b, s, h) for i in range(3)]
    return [rng.standard_normal((b, s, h)).astype(np.float32) for _ in range(3)]


def _mask(b, s, rng):
    m = np.ones((b, s), np.float32)
    for i in range(b):
        m[i, rng.integers(1, s + 1):] = 0        # each row keeps at least one key
    return ((1 - m) * np.finfo(np.float32).min).reshape(b, 1, 1, s)


@pytest.mark.parametrize("b,s,h,heads", [(1, 1, 4, 1), (1, 9, 12, 3), (2, 16, 32, 4),
                                         (3, 13, 24, 6), (2, 33, 16, 2)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("sliced", [False, True])
def test_kernel_matches_float64(b, s, h, heads, masked, sliced, variant):
    rng = np.random.default_rng(b * 100 + s + heads)
    q, k, v = _inputs(b, s, h, rng, sliced)
    bias = _mask(b, s, rng) if masked else None
    scale = 1 / np.sqrt(h // heads)
    want = _ref64(q, k, v, bias, heads, scale)
    got = OP.kernel(q, k, v, bias, heads=heads, scale=scale)
    assert got.dtype == np.float32 and got.shape == (b, s, h)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    ref = OP.kernels["numpy"](q, k, v, bias, heads=heads, scale=scale)
    np.testing.assert_allclose(ref, want, rtol=0, atol=2e-6)


def test_masked_keys_get_no_weight(variant):
    rng = np.random.default_rng(3)
    q, k, v = _inputs(2, 8, 8, rng)
    bias = _mask(2, 8, rng)
    got = OP.kernel(q, k, v, bias, heads=2, scale=0.5)
    # what sits in a masked key's value row changes nothing
    keep = bias[:, 0, 0, :] == 0
    v2 = v.copy()
    v2[~keep] = 1e3
    np.testing.assert_array_equal(OP.kernel(q, k, v2, bias, heads=2, scale=0.5), got)


def test_float64_runs_the_numpy_kernel():
    rng = np.random.default_rng(4)
    q, k, v = (x.astype(np.float64) for x in _inputs(2, 5, 6, rng))
    got = OP.kernel(q, k, v, heads=3, scale=0.3)
    np.testing.assert_allclose(got, _ref64(q, k, v, None, 3, 0.3), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("args,attrs,err,text", [
    ((np.zeros((2, 4, 6), np.float32),) * 3, {"heads": 4}, ShapeError, "divides"),
    ((np.zeros((2, 4, 6), np.float32), np.zeros((2, 5, 6), np.float32),
      np.zeros((2, 4, 6), np.float32)), {"heads": 2}, ShapeError, "one shape"),
    ((np.zeros((8, 6), np.float32),) * 3, {"heads": 2}, ShapeError, "one shape"),
    ((np.zeros((2, 4, 6), np.float32),) * 3 + (np.zeros((2, 1, 4, 4), np.float32),),
     {"heads": 2}, ShapeError, "bias of shape"),
    ((np.zeros((2, 4, 6), np.float32),) * 3 + (np.zeros((3, 1, 1, 4), np.float32),),
     {"heads": 2}, ShapeError, "bias of shape"),
    ((np.zeros((2, 4, 6), np.float32),) * 2 + (np.zeros((2, 4, 6), np.int32),),
     {"heads": 2}, DTypeError, "float32 or float64"),
])
def test_bad_inputs_name_the_op(args, attrs, err, text):
    with pytest.raises(err, match=text) as e:
        OP.shape_rule(*args, **attrs)
    assert "attention" in str(e.value)
    with pytest.raises(err, match="attention"):
        OP.kernel(*args, **attrs)          # the numba kernel checks before its loop


def test_blas_variant_leaves_openblas_threads_as_they_were(variant):
    """The kernel runs OpenBLAS at one thread for its products and puts the process's count
    back, also when two Python threads run it at once (the count is process-wide): numpy's
    own matmuls after it still get every thread."""
    import threading

    from sampan.backends.numba import cblas
    lib = cblas.find()
    if lib is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS the kernel can call")
    before = lib.set_count(2)
    lib.set_count(before)
    rng = np.random.default_rng(5)
    q, k, v = _inputs(2, 16, 32, rng)
    want = _ref64(q, k, v, None, 4, 0.25)
    errs = []

    def work():
        for _ in range(20):
            errs.append(np.abs(OP.kernel(q, k, v, heads=4, scale=0.25) - want).max())
    ts = [threading.Thread(target=work) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(errs) == 40 and max(errs) < 2e-6
    now = lib.set_count(before)
    assert now == before


def test_dead_keys_are_skipped_exactly(variant):
    """Padding keys (bias float32's most negative number) after a sequence's last live key
    are not computed: the output equals the float64 reference, a sequence whose keys are
    all dead still gets the chain's uniform weights, and a NaN bias still reaches it."""
    from sampan.backends.numba.attention import live_keys
    rng = np.random.default_rng(6)
    b, s, h, heads = 4, 19, 16, 2
    q, k, v = _inputs(b, s, h, rng)
    lo = np.finfo(np.float32).min
    bias = np.zeros((b, 1, 1, s), np.float32)
    bias[0, ..., 7:] = lo                 # 7 live keys, the rest dead
    bias[1, ..., 3] = lo                  # a dead key inside: computed (weight 0)
    bias[2, ...] = lo                     # all dead: uniform weights
    bias[3, ..., 10:] = -1e4              # an old-style mask: not dead, computed
    assert live_keys(bias.reshape(b, s), b, s).tolist() == [7, s, s, s]
    got = OP.kernel(q, k, v, bias, heads=heads, scale=0.3)
    np.testing.assert_allclose(got, _ref64(q, k, v, bias, heads, 0.3), rtol=0, atol=2e-6)
    np.testing.assert_allclose(got[2], np.broadcast_to(v[2].mean(0), (s, h)), atol=2e-6)
    bias[0, ..., 12] = np.nan
    assert live_keys(bias.reshape(b, s), b, s)[0] == 13
    assert np.isnan(OP.kernel(q, k, v, bias, heads=heads, scale=0.3)[0]).all()
