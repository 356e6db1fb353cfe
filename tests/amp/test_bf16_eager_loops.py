"""The numba loops that serve bfloat16 in eager (issue 31: W2's bf16 step on AMD Zen 4 was
0.56x its float32, its relu, bias adds and pooling in ml_dtypes' per-element ufuncs)
against ml_dtypes' own numpy result, bit for bit: add / sub / mul with broadcasting,
strided and transposed operands, NaN, infinities and signed zeros; relu; max pooling and
its gradient; a bf16 convolution within one rounding of its float32 reference."""
import numpy as np
import pytest

import sampan  # noqa: F401  (installs the numba kernels)
from sampan import dtypes as _dt
from sampan.ops.registry import OPS

pytest.importorskip("numba")
BF = _dt.bfloat16
SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40, 3e38],
                    np.float32)


def _bf(shape, seed=0, specials=True):
    r = np.random.default_rng(seed)
    a = (r.standard_normal(shape) * 3).astype(np.float32)
    if specials and a.size >= SPECIALS.size:
        a.reshape(-1)[:SPECIALS.size] = SPECIALS
    return a.astype(BF)


def _same_bits(got, want):
    """Equal bits; NaN results NaN alike (the sign of NaN op NaN is the hardware's pick
    of operand, not a rounding)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.view(np.uint16).copy(), want.view(np.uint16).copy()
    nan = (w & 0x7FFF) > 0x7F80
    np.testing.assert_array_equal(nan, (g & 0x7FFF) > 0x7F80)
    g[nan] = w[nan] = 0
    np.testing.assert_array_equal(g, w)


CASES = [((64, 6, 28, 28), (1, 6, 1, 1)), ((128, 512), (512,)), ((128, 512), (128, 512)),
         ((128, 512), ()), ((8, 128, 256), (128, 256)), ((64, 1), (1, 4096)),
         ((2, 3, 4, 5, 6, 7), (3, 1, 5, 1, 7)), ((3, 5), (3, 5))]


@pytest.mark.parametrize("name,ufunc", [("add", np.add), ("sub", np.subtract),
                                        ("mul", np.multiply)])
@pytest.mark.parametrize("sa,sb", CASES)
def test_binary_bits_match_ml_dtypes(name, ufunc, sa, sb):
    k = OPS[name].kernel
    a, b = _bf(sa, 1), _bf(sb, 2)
    for x, y in ((a, b), (b, a)):
        _same_bits(k(x, y), ufunc(x, y))


@pytest.mark.parametrize("name,ufunc", [("add", np.add), ("mul", np.multiply)])
def test_binary_strided_and_float32_operands(name, ufunc):
    k = OPS[name].kernel
    a = _bf((96, 80), 3)
    for x, y in ((a.T, a.T), (a[::2], a[1::2]), (a[:80].T, a[:80].T.copy()),
                 (a[:, ::3], a[5, ::3]), (a[::-1], a)):
        _same_bits(k(x, y), ufunc(x, y))
    f = a.astype(np.float32)
    np.testing.assert_array_equal(k(f, f), ufunc(f, f))       # float32 stays numpy's
    assert k(a[:0], a[:0]).shape == (0, 80)


def test_binary_eager_ops_and_gradient():
    xb, bb = _bf((32, 300), 4, specials=False), _bf((300,), 5, specials=False)
    x = sampan.tensor(xb, requires_grad=True)
    b = sampan.tensor(bb, requires_grad=True)
    y = (x + b) * x - b
    _same_bits(y.numpy(), np.subtract(np.multiply(np.add(xb, bb), xb), bb))
    y.sum().backward()
    xf, bf = xb.astype(np.float64), bb.astype(np.float64)
    np.testing.assert_allclose(x.grad.numpy().astype(np.float64), 2 * xf + bf,
                               rtol=2 ** -7, atol=0.1)


def test_relu_bits_match_ml_dtypes():
    k, ref = OPS["relu"].kernel, OPS["relu"].kernels["numpy"]
    a = _bf((64, 6, 28, 28), 6)
    _same_bits(k(a), ref(a))
    _same_bits(k(a[:, :, ::2].transpose(0, 2, 1, 3)), ref(a[:, :, ::2].transpose(0, 2, 1, 3)))
    assert k(a[:0]).shape == (0, 6, 28, 28)


@pytest.mark.parametrize("shape", [(64, 6, 28, 28), (4, 3, 9, 7)])
def test_max_pool_bf16_matches_numpy_kernel(shape):
    kw = dict(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1))
    x = _bf(shape, 7, specials=False)
    y = OPS["max_pool2d"].kernel(x, **kw)
    _same_bits(y, OPS["max_pool2d"].kernels["numpy"](x, **kw))
    g = _bf(y.shape, 8, specials=False)
    _same_bits(OPS["max_pool2d_grad"].kernel(x, g, **kw),
               OPS["max_pool2d_grad"].kernels["numpy"](x, g, **kw))
    x.reshape(-1)[[0, 5, 11]] = np.array([np.nan, np.inf, -np.inf], np.float32).astype(BF)
    _same_bits(OPS["max_pool2d_grad"].kernel(x, g, **kw),     # NaN: the general loop
               OPS["max_pool2d_grad"].kernels["numpy"](x, g, **kw))
    x[0, 0, :4, :4] = x[0, 0, 0, 0] = x[0, 0, 1, 1]            # ties: the first maximum
    _same_bits(OPS["max_pool2d_grad"].kernel(x, g, **kw),
               OPS["max_pool2d_grad"].kernels["numpy"](x, g, **kw))


def test_conv_bf16_within_one_rounding_of_float32():
    ck = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    x, w = _bf((8, 6, 14, 14), 9, specials=False), _bf((16, 6, 5, 5), 10, specials=False)
    got = OPS["conv2d"].kernels["numba"](x, w, **ck)
    want = OPS["conv2d"].kernels["numpy"](x.astype(np.float32), w.astype(np.float32), **ck)
    assert got.dtype == BF
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2 ** -8, atol=1e-3)
