"""Issue 31, bf16 row ops: the numba provider's softmax / log_softmax / layer_norm /
standardize kernels and their gradients run bfloat16 rows over their uint16 bits (float32
inside, each output rounded once) and give exactly the bytes of the ops' rule, computing in
float32 arrays and rounding back (the path they replace), NaN, infinities and mixed dtypes
included."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")
ml = pytest.importorskip("ml_dtypes")

from sampan.backends.numba.loops import layernorm as L  # noqa: E402
from sampan.backends.numba.loops import rowwise as R  # noqa: E402

BF = np.dtype(ml.bfloat16)
EPS = 1e-5


def _via_f32(fn, *arrays, **kw):
    """The ops' rule the bit kernels replace: float32 arrays, rounded back."""
    out = fn(*(a.astype(np.float32) for a in arrays), **kw)
    return tuple(o.astype(BF) for o in out) if isinstance(out, tuple) else out.astype(BF)


def _same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == BF and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint16), w.view(np.uint16))


def _data(shape, seed):
    r = np.random.default_rng(seed)
    x = (3 * r.standard_normal(shape)).astype(BF)
    g = r.standard_normal(shape).astype(BF)
    c = shape[-1]
    return x, g, r.standard_normal(c).astype(BF), r.standard_normal(c).astype(BF)


SHAPES = [(1, 1), (5, 33), (2, 3, 64), (8, 257)]


def _special(shape, seed):
    x, g, w, b = _data(shape, seed)
    if x.size > 4:                      # NaN, +-inf and a masked row reach the results
        flat = x.reshape(-1, shape[-1])
        flat[0, 0] = np.nan
        flat[-1, :] = -np.inf
        flat[-1, 0] = 0
    return x, g, w, b


def test_bf16_softmax_equals_the_float32_rule():
    # one of the nine kernels (each compiles for a second or two on first use, and so
    # does its float32 twin; all nine: the slow test below)
    for shape in SHAPES:
        x = _special(shape, sum(shape))[0]
        for name in ("softmax", "log_softmax"):
            fn = getattr(R, name)
            _same(fn(x), _via_f32(fn, x))
    e = np.zeros((0, 5), BF)
    assert R.softmax(e).shape == (0, 5) and R.softmax(e).dtype == BF


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_row_kernels_equal_the_float32_rule(shape):
    x, g, w, b = _special(shape, sum(shape))
    for name in ("softmax", "log_softmax"):
        fn = getattr(R, name)
        y = fn(x)
        assert y.dtype == BF
        _same(y, _via_f32(fn, x))
        grad = getattr(R, name + "_grad")
        _same(grad(y, g), _via_f32(grad, y, g))
    _same(L.standardize(x, EPS), _via_f32(L.standardize, x, eps=EPS))
    _same(L.layer_norm_affine(x, w, b, EPS), _via_f32(L.layer_norm_affine, x, w, b, eps=EPS))
    _same(L.ln_grad_x(x, w, g, EPS), _via_f32(L.ln_grad_x, x, w, g, eps=EPS))
    _same(L.ln_grad_w(x, g, EPS), _via_f32(L.ln_grad_w, x, g, eps=EPS))
    _same(L.ln_grad(x, w, g, EPS), _via_f32(L.ln_grad, x, w, g, eps=EPS))
    _same(L.standardize_grad(x, g, EPS), _via_f32(L.standardize_grad, x, g, eps=EPS))


@pytest.mark.slow
def test_mixed_inputs_keep_the_float32_rule():
    x, g, w, b = _data((4, 16), 3)
    w32 = w.astype(np.float32)
    # a float32 weight with bfloat16 rows: the float32 route, as before
    _same(L.ln_grad(x, w32, g, EPS), _via_f32(L.ln_grad, x, w32, g, eps=EPS))
    _same(L.layer_norm_affine(x, w32, b, EPS), _via_f32(L.layer_norm_affine, x, w32, b,
                                                        eps=EPS))


def test_cast_to_bf16_equals_ml_dtypes_on_every_kind_of_bits():
    from sampan.backends.numba.loops import elementwise as E
    from sampan.ops.registry import OPS
    r = np.random.default_rng(11)
    x = r.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40,
                                     1.00390625, 1.01171875, 3.4e38], np.float32)])
    with np.errstate(all="ignore"):
        want = x.astype(BF)
    for a, w in ((x, want), (x.reshape(2, -1)[:, ::3], want.reshape(2, -1)[:, ::3])):
        got = E.cast(a, "bfloat16")
        assert got.dtype == BF and got.shape == a.shape
        np.testing.assert_array_equal(got.view(np.uint16), w.view(np.uint16))
    assert E.cast(x[:0], "bfloat16").dtype == BF
    np.testing.assert_array_equal(E.cast(want, "float32"), want.astype(np.float32))
    assert E.cast(x, "float32") is x                      # the op's rule: no copy
    assert OPS["cast"].kernels["numba"] is E.cast
