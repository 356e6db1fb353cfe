"""conv2d's numba im2col/col2im loops (stride 1, dilation 1) against the numpy path
(strided window view, strided-slice accumulation) on the same inputs: forward, weight
gradient and transposed convolution, with padding, groups, rectangular kernels and
inputs where the padding exceeds the kernel reach."""
import numpy as np
import pytest

import sampan  # noqa: F401  (installs the numba kernels)
from sampan.backends.numba import available
from sampan.ops import conv

if available():
    from sampan.backends.numba.loops import conv as nbconv   # the loops' kernels
else:   # pragma: no cover - the no-numba variant skips every test below
    nbconv = None

CASES = [  # x shape, w shape (conv2d), padding, groups
    ((3, 1, 28, 28), (6, 1, 5, 5), (2, 2), 1),
    ((2, 6, 14, 14), (16, 6, 5, 5), (0, 0), 1),
    ((2, 4, 7, 9), (6, 2, 3, 2), (1, 0), 2),
    ((1, 3, 5, 4), (2, 3, 1, 3), (0, 1), 1),
    ((2, 2, 4, 4), (3, 2, 3, 3), (3, 3), 1),
]


def _numpy_path(monkeypatch):
    monkeypatch.setattr(nbconv, "_unit_loops", lambda *a: False)
    monkeypatch.setattr(nbconv, "_any_loops", lambda *a: False)


@pytest.mark.skipif(not available(), reason="needs numba")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,ws,pad,groups", CASES)
@pytest.mark.parametrize("one_gemm", [False, True])   # per-sample GEMMs or one GEMM
def test_loops_match_numpy_path(xs, ws, pad, groups, dtype, one_gemm, monkeypatch):
    monkeypatch.setattr(nbconv, "_ONE_GEMM_MAX_PIXELS", 10**9 if one_gemm else -1)
    r = np.random.default_rng(0)
    x = r.standard_normal(xs).astype(dtype)
    w = r.standard_normal(ws).astype(dtype)
    a = dict(stride=(1, 1), padding=pad, dilation=(1, 1), groups=groups)
    assert nbconv._unit_loops(x.dtype, (1, 1), (1, 1))
    y = nbconv._conv2d(x, w, **a)
    g = r.standard_normal(y.shape).astype(dtype)
    gw = nbconv._gw(x, g, ws[2:], **a)
    op = conv._outpad(xs[2:], ws[2:], (1, 1), pad, (1, 1))
    gx = nbconv._conv_transpose(g, w, output_padding=op, **a)
    _numpy_path(monkeypatch)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, nbconv._conv2d(x, w, **a), rtol=tol, atol=tol)
    gw_ref = nbconv._gw(x, g, ws[2:], **a)   # long sums, summed in another order
    np.testing.assert_allclose(gw, gw_ref, rtol=tol, atol=tol * np.abs(gw_ref).max())
    ref = nbconv._conv_transpose(g, w, output_padding=op, **a)
    assert gx.shape == ref.shape == xs and gx.flags.c_contiguous
    np.testing.assert_allclose(gx, ref, rtol=tol, atol=tol)


@pytest.mark.skipif(not available(), reason="needs numba")
@pytest.mark.parametrize("xs,ws,stride,pad,dil,groups", [
    ((2, 3, 11, 10), (4, 3, 3, 3), (2, 2), (1, 1), (1, 1), 1),
    ((2, 4, 13, 9), (6, 2, 3, 2), (2, 3), (0, 1), (1, 1), 2),
    ((1, 2, 12, 12), (3, 2, 3, 3), (1, 1), (2, 2), (2, 2), 1),     # dilated
    ((2, 2, 9, 11), (2, 2, 2, 3), (3, 2), (1, 2), (2, 1), 1),      # both
])
def test_strided_loops_match_numpy_path(xs, ws, stride, pad, dil, groups, monkeypatch):
    """im2col_strided / col2im_strided (other strides and dilations) against the numpy
    strided-window path: forward, weight gradient and transposed convolution."""
    r = np.random.default_rng(4)
    x = r.standard_normal(xs).astype(np.float32)
    w = r.standard_normal(ws).astype(np.float32)
    a = dict(stride=stride, padding=pad, dilation=dil, groups=groups)
    y = nbconv._conv2d(x, w, **a)
    g = r.standard_normal(y.shape).astype(np.float32)
    gw = nbconv._gw(x, g, ws[2:], **a)
    op = conv._outpad(xs[2:], ws[2:], stride, pad, dil)
    gx = nbconv._conv_transpose(g, w, output_padding=op, **a)
    _numpy_path(monkeypatch)
    np.testing.assert_allclose(y, nbconv._conv2d(x, w, **a), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, nbconv._gw(x, g, ws[2:], **a), rtol=1e-5, atol=1e-5)
    ref = nbconv._conv_transpose(g, w, output_padding=op, **a)
    assert gx.shape == ref.shape == xs and gx.flags.c_contiguous
    np.testing.assert_allclose(gx, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not available(), reason="needs numba")
def test_strided_and_dilated_calls_skip_the_unit_stride_loops():
    assert not nbconv._unit_loops(np.dtype(np.float32), (2, 1), (1, 1))
    assert not nbconv._unit_loops(np.dtype(np.float32), (1, 1), (1, 2))
    assert not nbconv._unit_loops(np.dtype(np.float16), (1, 1), (1, 1))


@pytest.mark.skipif(not available(), reason="needs numba")
def test_dot_loop_serves_only_tiny_weight_gradients_of_small_images():
    f32 = np.dtype(np.float32)
    assert nbconv._weight_grad_dots(f32, (1, 1), (1, 1), 1, 6 * 25, 28 * 28) == \
        available()
    assert not nbconv._weight_grad_dots(f32, (1, 1), (1, 1), 1, 16 * 150, 10 * 10)
    assert not nbconv._weight_grad_dots(f32, (1, 1), (1, 1), 1, 6 * 25, 224 * 224)
    assert not nbconv._weight_grad_dots(f32, (1, 1), (1, 1), 2, 6 * 25, 28 * 28)


DIRECT_CASES = [  # x shape, w shape, padding, groups, dtype: odd and even output channels
    ((3, 1, 28, 28), (6, 1, 5, 5), (2, 2), 1, np.float32),
    pytest.param((3, 1, 28, 28), (6, 1, 5, 5), (2, 2), 1, np.float64,  # compiles float64
                 marks=pytest.mark.slow),                                # kernels: ~12 s
    ((2, 3, 9, 7), (5, 3, 3, 2), (1, 0), 1, np.float32),
    ((1, 2, 6, 11), (5, 2, 3, 2), (0, 3), 1, np.float32),
    ((2, 1, 3, 3), (6, 1, 5, 5), (2, 2), 1, np.float32),    # the kernel reaches past the input
    ((0, 1, 5, 5), (4, 1, 5, 5), (1, 3), 1, np.float32),    # empty batch
    ((2, 4, 9, 8), (4, 1, 3, 2), (1, 1), 4, np.float32),    # depthwise
    ((1, 3, 8, 8), (6, 1, 5, 5), (2, 1), 3, np.float32),    # depthwise, multiplier 2
    ((2, 4, 7, 7), (4, 2, 5, 5), (0, 2), 2, np.float32),    # 50 taps, 2 outputs a group
]


# a compiled kernel serves every shape with the same kernel size, dtype and parity of
# the output channels (~2 s to compile each with a cold kernel cache): the cases share
# three pairs
@pytest.mark.skipif(not available(), reason="needs numba")
@pytest.mark.parametrize("xs,ws,pad,groups,dtype", DIRECT_CASES)
def test_direct_kernels_match_gemm_path(xs, ws, pad, groups, dtype, monkeypatch):
    monkeypatch.setattr(nbconv, "DIRECT_MIN_OUTPUTS", 0)
    r = np.random.default_rng(1)
    x = r.standard_normal(xs).astype(dtype)
    w = r.standard_normal(ws).astype(dtype)
    a = dict(stride=(1, 1), padding=pad, dilation=(1, 1), groups=groups)
    assert nbconv._direct(x.dtype, (1, 1), (1, 1), ws[1], ws[0] // groups, *ws[2:])
    y = nbconv._conv2d(x, w, **a)
    g = r.standard_normal(y.shape).astype(dtype)
    gw = nbconv._gw(x, g, ws[2:], **a)
    op = conv._outpad(xs[2:], ws[2:], (1, 1), pad, (1, 1))
    gx = nbconv._conv_transpose(g, w, output_padding=op, **a)   # the input gradient
    monkeypatch.setattr(nbconv, "DIRECT_MAX_TAPS", 0)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    y_ref = nbconv._conv2d(x, w, **a)
    assert y.shape == y_ref.shape and y.dtype == dtype and y.flags.c_contiguous
    np.testing.assert_allclose(y, y_ref, rtol=tol, atol=tol)
    gx_ref = nbconv._conv_transpose(g, w, output_padding=op, **a)
    assert gx.shape == gx_ref.shape == xs and gx.dtype == dtype and gx.flags.c_contiguous
    np.testing.assert_allclose(gx, gx_ref, rtol=tol, atol=tol)
    gw_ref = nbconv._gw(x, g, ws[2:], **a)
    assert gw.shape == gw_ref.shape == ws and gw.dtype == dtype
    np.testing.assert_allclose(gw, gw_ref, rtol=tol, atol=tol * np.abs(gw_ref).max(initial=1))


@pytest.mark.skipif(not available(), reason="needs numba")
def test_direct_kernels_serve_small_or_depthwise_unit_stride_layers():
    f32 = np.dtype(np.float32)
    assert nbconv._direct(f32, (1, 1), (1, 1), 1, 6, 5, 5, 64 * 6 * 28 * 28) == \
        available()
    assert not nbconv._direct(f32, (1, 1), (1, 1), 1, 6, 5, 5, 2 * 6 * 28 * 28)  # too small
    assert not nbconv._direct(f32, (1, 1), (1, 1), 6, 16, 5, 5)     # 150 taps: BLAS
    assert nbconv._direct(f32, (1, 1), (1, 1), 1, 1, 7, 7) == available()  # depthwise
    assert not nbconv._direct(f32, (1, 1), (1, 1), 1, 1, 13, 13)    # compiles too long
    assert nbconv._direct(f32, (1, 1), (1, 1), 8, 2, 5, 5) == available()
    assert not nbconv._direct(f32, (2, 2), (1, 1), 1, 6, 5, 5)
    assert not nbconv._direct(f32, (1, 1), (1, 1), 4, 8, 1, 1)      # 1x1: a plain GEMM
    assert not nbconv._direct(np.dtype(np.float16), (1, 1), (1, 1), 1, 6, 5, 5)


def _kernel_sets():
    """(conv2d, conv_transpose2d, weight gradient): the numpy kernels, and the loops'."""
    from sampan.ops import conv_transpose
    out = [(conv._conv2d_numpy, conv_transpose._ct_kernel, conv._gw_kernel)]
    if available():
        out.append((nbconv._conv2d, nbconv._conv_transpose, nbconv._gw))
    return out


@pytest.mark.parametrize("kernels", range(len(_kernel_sets())), ids=["numpy", "numba"][
    :len(_kernel_sets())])
@pytest.mark.parametrize("xs,ws,stride,pad,groups", [
    ((5, 6, 17, 18), (8, 6, 3, 3), (1, 1), (1, 1), 1),     # numba im2col, 306 pixels
    ((5, 4, 12, 11), (6, 2, 3, 2), (2, 1), (1, 0), 2),     # strided, grouped: numpy path
])
def test_batch_chunks_match_one_call(xs, ws, stride, pad, groups, kernels, monkeypatch):
    """Large batches of columns run in chunks of images; results equal one call's."""
    conv2d, conv_t, conv_gw = _kernel_sets()[kernels]
    r = np.random.default_rng(2)
    x = r.standard_normal(xs).astype(np.float32)
    w = r.standard_normal(ws).astype(np.float32)
    a = dict(stride=stride, padding=pad, dilation=(1, 1), groups=groups)
    if available():
        monkeypatch.setattr(nbconv, "DIRECT_MAX_TAPS", 0)
    y = conv2d(x, w, **a)
    g = r.standard_normal(y.shape).astype(np.float32)
    op = conv._outpad(xs[2:], ws[2:], stride, pad, (1, 1))
    gx = conv_t(g, w, output_padding=op, **a)
    gw = conv_gw(x, g, ws[2:], **a)
    per_image = ws[1] * groups * ws[2] * ws[3] * y.shape[2] * y.shape[3] * 4
    monkeypatch.setattr(conv, "_CHUNK_ABOVE", per_image)      # so 5 images are chunked
    monkeypatch.setattr(conv, "_CHUNK_BYTES", 2 * per_image)  # 2, 2 and 1 image(s)
    assert conv._chunk(5, per_image) == 2
    np.testing.assert_array_equal(conv2d(x, w, **a), y)
    np.testing.assert_allclose(conv_t(g, w, output_padding=op, **a), gx, rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(conv_gw(x, g, ws[2:], **a), gw, rtol=1e-5,
                               atol=1e-5 * np.abs(gw).max())


@pytest.mark.skipif(not available(), reason="needs numba")
def test_direct_depthwise_layer_vs_torch(monkeypatch):
    """Through sampan.conv2d and autograd (forward, input and weight gradients) with the
    direct kernels serving every call, against PyTorch."""
    torch = pytest.importorskip("torch")
    import sampan
    monkeypatch.setattr(nbconv, "DIRECT_MIN_OUTPUTS", 0)
    r = np.random.default_rng(3)
    xa = r.standard_normal((2, 4, 9, 8)).astype(np.float32)
    wa = r.standard_normal((4, 1, 3, 2)).astype(np.float32)
    ga = r.standard_normal((2, 4, 9, 9)).astype(np.float32)
    x = sampan.tensor(xa, requires_grad=True)
    w = sampan.tensor(wa, requires_grad=True)
    y = sampan.conv2d(x, w, padding=(1, 1), groups=4)
    y.backward(sampan.tensor(ga))
    tx = torch.tensor(xa, requires_grad=True)
    tw = torch.tensor(wa, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, padding=(1, 1), groups=4)
    ty.backward(torch.tensor(ga))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not available(), reason="needs numba")
@pytest.mark.parametrize("xs,ws,stride,pad,groups", [
    ((2, 4, 9, 8), (4, 1, 3, 2), (2, 2), (1, 1), 4),     # depthwise
    ((2, 3, 10, 11), (6, 1, 5, 5), (2, 1), (2, 0), 3),   # multiplier 2, one axis strided
    ((1, 2, 12, 12), (2, 1, 3, 2), (1, 2), (0, 1), 2),
])
def test_direct_strided_depthwise_match_gemm_path(xs, ws, stride, pad, groups, monkeypatch):
    monkeypatch.setattr(nbconv, "DIRECT_MIN_OUTPUTS", 0)
    r = np.random.default_rng(5)
    x = r.standard_normal(xs).astype(np.float32)
    w = r.standard_normal(ws).astype(np.float32)
    a = dict(stride=stride, padding=pad, dilation=(1, 1), groups=groups)
    assert nbconv._direct_strided(x.dtype, stride, (1, 1), ws[1], ws[0] // groups, *ws[2:], 1)
    y = nbconv._conv2d(x, w, **a)
    g = r.standard_normal(y.shape).astype(np.float32)
    gw = nbconv._gw(x, g, ws[2:], **a)
    op = conv._outpad(xs[2:], ws[2:], stride, pad, (1, 1))
    gx = nbconv._conv_transpose(g, w, output_padding=op, **a)
    monkeypatch.setattr(nbconv, "DIRECT_MAX_TAPS", 0)
    np.testing.assert_allclose(y, nbconv._conv2d(x, w, **a), rtol=1e-5, atol=1e-5)
    ref = nbconv._gw(x, g, ws[2:], **a)
    np.testing.assert_allclose(gw, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    ref = nbconv._conv_transpose(g, w, output_padding=op, **a)
    assert gx.shape == ref.shape == xs and gx.flags.c_contiguous
    np.testing.assert_allclose(gx, ref, rtol=1e-5, atol=1e-5)
