"""oneDNN kernels against the op table's numpy kernels (float32 within 1e-5 relative,
bfloat16 within bfloat16 rounding, int8 exact), post-ops and the primitive cache."""
import numpy as np
import pytest

from sampan import dtypes as _dt
from sampan.backends import onednn
from sampan.ops.registry import OPS

pytestmark = pytest.mark.skipif(not onednn.available(),
                                reason=f"oneDNN unavailable: {onednn.why_unavailable()}")
BF16 = _dt.bfloat16


def _rel(y, ref):
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30)) if ref.size else 0.0


def _r(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32)


MATMUL = [((3, 4), (4, 5)), ((128, 784), (784, 512)), ((2, 3, 4), (4, 2)),
          ((2, 1, 3, 4), (3, 4, 2)), ((2, 3, 64, 32), (2, 3, 32, 48)), ((0, 4), (4, 3)),
          ((3, 0), (0, 2))]


@pytest.mark.parametrize("sa,sb", MATMUL)
def test_matmul_float32_and_bf16(sa, sb):
    a, b = _r(*sa), _r(*sb, seed=1)
    numpy_k = OPS["matmul"].kernels["numpy"]
    ref = numpy_k(a.astype(np.float64), b.astype(np.float64))
    assert _rel(onednn.matmul(a, b), ref) < 1e-5
    ab, bb = a.astype(BF16), b.astype(BF16)
    y = onednn.matmul(ab, bb)
    assert y.dtype == BF16
    ref = numpy_k(ab.astype(np.float64), bb.astype(np.float64))
    assert _rel(y, ref) < 2 ** -7          # one bfloat16 rounding of the f32 accumulator


def test_matmul_strided_views_need_no_copy():
    a, b = _r(32, 64), _r(48, 64, seed=1)
    y = onednn.matmul(np.asfortranarray(a), b.T)      # column-major and transposed views
    assert _rel(y, a.astype(np.float64) @ b.T.astype(np.float64)) < 1e-5


def test_linear_post_ops():
    x, w, bias, r = _r(32, 64), _r(64, 48, seed=1), _r(48, seed=2), _r(32, 48, seed=3)
    ref = x.astype(np.float64) @ w + bias
    y = onednn.linear(x, w, bias, [("relu", 0.0, 0.0)])
    assert _rel(y, np.maximum(ref, 0)) < 1e-5
    y = onednn.linear(x, w, bias, [("binary:add", r), ("tanh", 0.0, 0.0)])
    assert _rel(y, np.tanh(ref + r)) < 1e-5
    from scipy.special import erf
    y = onednn.linear(x, w, None, [("gelu", 0.0, 0.0)])
    g = x.astype(np.float64) @ w
    assert _rel(y, 0.5 * g * (1 + erf(g / np.sqrt(2)))) < 1e-5


CONV = [((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1),
        ((2, 3, 7, 8), (5, 3, 3, 2), (2, 1), (1, 2), (1, 1), 1),
        ((1, 2, 9, 9), (3, 2, 3, 3), (2, 2), (2, 2), (2, 2), 1),
        ((2, 4, 6, 5), (6, 2, 2, 3), (1, 1), (1, 0), (1, 1), 2),
        ((16, 1, 28, 28), (6, 1, 5, 5), (1, 1), (2, 2), (1, 1), 1),
        ((16, 6, 14, 14), (16, 6, 5, 5), (1, 1), (0, 0), (1, 1), 1)]


def _taps(x, w, st, pd, dl, ho, wo):
    """(i, j, window slices of the padded input) for every kernel tap."""
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            yield i, j, (slice(None), slice(None),
                         slice(i * dl[0], i * dl[0] + st[0] * (ho - 1) + 1, st[0]),
                         slice(j * dl[1], j * dl[1] + st[1] * (wo - 1) + 1, st[1]))


def _geom(xs, ws, st, pd, dl):
    return [(xs[2 + k] + 2 * pd[k] - dl[k] * (ws[2 + k] - 1) - 1) // st[k] + 1 for k in (0, 1)]


def _ref_conv(x, w, st, pd, dl, g):
    """float64 convolution, tap by tap (an independent reference)."""
    n, c = x.shape[:2]
    o = w.shape[0]
    ho, wo = _geom(x.shape, w.shape, st, pd, dl)
    xp = np.pad(x, ((0, 0), (0, 0), (pd[0],) * 2, (pd[1],) * 2))
    wg = w.reshape(g, o // g, c // g, *w.shape[2:])
    y = np.zeros((n, g, o // g, ho, wo))
    for i, j, sl in _taps(x, w, st, pd, dl, ho, wo):
        y += np.einsum("ngchw,goc->ngohw", xp[sl].reshape(n, g, c // g, ho, wo),
                       wg[..., i, j])
    return y.reshape(n, o, ho, wo)


def _ref_grads(x, w, gy, st, pd, dl, g):
    """float64 input and weight gradients of _ref_conv for output gradient gy."""
    n, c = x.shape[:2]
    o = w.shape[0]
    ho, wo = gy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pd[0],) * 2, (pd[1],) * 2))
    dxp = np.zeros_like(xp)
    wg = w.reshape(g, o // g, c // g, *w.shape[2:])
    gg = gy.reshape(n, g, o // g, ho, wo)
    dw = np.zeros_like(wg)
    for i, j, sl in _taps(x, w, st, pd, dl, ho, wo):
        dxp[sl] += np.einsum("ngohw,goc->ngchw", gg, wg[..., i, j]).reshape(n, c, ho, wo)
        dw[..., i, j] = np.einsum("ngohw,ngchw->goc", gg,
                                  xp[sl].reshape(n, g, c // g, ho, wo))
    dx = dxp[:, :, pd[0]:pd[0] + x.shape[2], pd[1]:pd[1] + x.shape[3]]
    return dx, dw.reshape(w.shape)


@pytest.mark.parametrize("xs,ws,st,pd,dl,g", CONV)
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_conv_forward_backward(xs, ws, st, pd, dl, g, dtype):
    from sampan.ops.conv import _outpad
    tol = 1e-5 if dtype == np.float32 else 2 ** -6
    x, w = _r(*xs).astype(dtype), _r(*ws, seed=1).astype(dtype)
    attrs = {"stride": st, "padding": pd, "dilation": dl, "groups": g}
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = _ref_conv(x64, w64, st, pd, dl, g)
    y = onednn.conv2d(x, w, **attrs)
    assert y.dtype == dtype and _rel(y, ref) < tol
    gy = _r(*ref.shape, seed=2).astype(dtype)
    dx, dw = _ref_grads(x64, w64, gy.astype(np.float64), st, pd, dl, g)
    ct = dict(attrs, output_padding=_outpad(xs[2:], ws[2:], st, pd, dl))
    assert _rel(onednn.conv_transpose2d(gy, w, **ct), dx) < tol
    gw = dict(attrs, kernel_size=ws[2:])
    assert _rel(onednn.conv2d_grad_weight(x, gy, **gw), dw) < tol * 4


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_pooling(dtype):
    x = _r(4, 6, 28, 28).astype(dtype)
    for k, s, p, ceil in [((2, 2), (2, 2), (0, 0), False), ((3, 3), (2, 2), (1, 1), True)]:
        at = {"kernel_size": k, "stride": s, "padding": p, "dilation": (1, 1),
              "ceil_mode": ceil}
        ref = OPS["max_pool2d"].kernels["numpy"](x, **at)
        assert np.array_equal(onednn.max_pool2d(x, **at), ref)
    tol = 1e-6 if dtype == np.float32 else 2 ** -7
    for inc in (True, False):
        ref = OPS["avg_pool2d"].kernels["numpy"](x.astype(np.float64), kernel_size=(3, 3),
                                                 stride=(2, 2), padding=(1, 1),
                                                 count_include_pad=inc)
        assert _rel(onednn.avg_pool2d(x, (3, 3), (2, 2), (1, 1), inc), ref) < tol
    with pytest.raises(onednn.Unsupported):
        onednn.avg_pool2d(x, (3, 3), (2, 2), (1, 1), True, True)


def test_int8_matmul_exact():
    r = np.random.default_rng(5)
    b = r.integers(-128, 128, (96, 40)).astype(np.int8)
    for a, za in [(r.integers(0, 256, (33, 96)).astype(np.uint8), np.uint8(128)),
                  (r.integers(-128, 128, (33, 96)).astype(np.int8), np.int8(3))]:
        zb = np.array(0, np.int8)
        ref = (a.astype(np.int64) - int(za)) @ b.astype(np.int64)
        y = onednn.matmul_integer(a, b, za, zb)
        assert y.dtype == np.int32 and np.array_equal(y, ref)
    with pytest.raises(onednn.Unsupported):
        onednn.matmul_integer(a, b, za, np.array(1, np.int8))


def test_primitive_cache_hits():
    from sampan.backends.onednn import primitives as P
    a, b = _r(17, 23), _r(23, 9, seed=1)
    onednn.matmul(a, b)
    before = dict(P.STATS)
    y = onednn.matmul(a + 1, b)          # same shapes, dtypes, layout: the same primitive
    assert P.STATS["hits"] == before["hits"] + 1 and P.STATS["misses"] == before["misses"]
    assert _rel(y, (a + 1).astype(np.float64) @ b) < 1e-5
    onednn.matmul(a[:, :22], b[:22])     # another layout: a new primitive
    assert P.STATS["misses"] == before["misses"] + 1


def test_broadcast_strides_fall_back():
    a = np.broadcast_to(_r(1, 8), (5, 8))
    with pytest.raises(onednn.Unsupported):
        onednn.matmul(a, _r(8, 3))
