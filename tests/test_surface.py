"""The top-level surface a PyTorch user types first: dtype aliases and casts, finfo/iinfo,
inference_mode, set_num_threads, Tensor.data, strides and layout, new_* factories,
as_tensor/empty_like/is_tensor/numel; compared with PyTorch where it has the same."""
import numpy as np
import pytest
import torch

import sampan
from sampan.errors import SampanError

R = np.random.default_rng(1)


def test_dtype_aliases_and_casts():
    pairs = {"long": "int64", "int": "int32", "short": "int16", "half": "float16",
             "float": "float32", "double": "float64", "bool": "bool"}
    for alias, name in pairs.items():
        assert sampan.dtypes.dtype_name(getattr(sampan, alias)) == name == str(
            getattr(torch, alias)).replace("torch.", "")
        assert alias in sampan.__all__
    x = sampan.tensor([[1.5, -2.0], [0.0, 3.25]])
    t = torch.tensor([[1.5, -2.0], [0.0, 3.25]])
    for m in ("long", "float", "half", "int", "double", "bool", "short", "bfloat16"):
        a, b = getattr(x, m)(), getattr(t, m)()
        assert str(a.dtype) == str(b.dtype).replace("torch.", "")
        np.testing.assert_array_equal(a.float().numpy(), b.float().numpy())
    assert x.float() is x and x.to(sampan.float32) is x
    assert x.to(sampan.long).dtype == np.int64 and x.type(sampan.double).dtype == np.float64
    assert x.type() == t.type().replace("torch", "sampan") == "sampan.FloatTensor"
    assert x.long().type() == "sampan.LongTensor"
    assert x.to("cpu") is x and x.to(device="cpu", dtype=sampan.half).dtype == np.float16
    assert x.to(sampan.zeros(1, dtype=sampan.int32)).dtype == np.int32
    assert x.to("cpu", sampan.float64).dtype == np.float64


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_finfo_matches_torch(name):
    s, t = sampan.finfo(getattr(sampan, name)), torch.finfo(getattr(torch, name))
    for a in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
        assert getattr(s, a) == getattr(t, a), (name, a, getattr(s, a), getattr(t, a))
    assert sampan.finfo().dtype == "float32"


@pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32", "int64"])
def test_iinfo_matches_torch(name):
    s, t = sampan.iinfo(getattr(sampan, name)), torch.iinfo(getattr(torch, name))
    assert (s.bits, s.max, s.min, s.dtype) == (t.bits, t.max, t.min, t.dtype)
    with pytest.raises(TypeError):
        sampan.iinfo(sampan.float32)
    with pytest.raises(TypeError):
        sampan.finfo(sampan.int32)


def test_inference_mode():
    w = sampan.randn(3, requires_grad=True)
    assert not sampan.is_inference_mode_enabled()
    with sampan.inference_mode():
        assert sampan.is_inference_mode_enabled() and not sampan.is_grad_enabled()
        y = w * 2
    assert y.grad_fn is None and not y.requires_grad
    assert sampan.is_grad_enabled() and not sampan.is_inference_mode_enabled()
    with sampan.inference_mode(False):
        assert (w * 2).requires_grad and not sampan.is_inference_mode_enabled()

    @sampan.inference_mode()
    def f(a):
        return a * 3

    @sampan.inference_mode
    def g(a):
        return a * 3

    assert not f(w).requires_grad and not g(w).requires_grad
    assert f.__name__ == "f" and (w * 3).requires_grad
    with sampan.no_grad():
        with sampan.inference_mode():
            pass
        assert not sampan.is_grad_enabled()


def test_set_num_threads():
    import sampan._threads as th
    before = sampan.get_num_threads()
    try:
        sampan.set_num_threads(1)
        assert sampan.get_num_threads() == 1
        s, g = th._blas()
        if g is not None:            # numpy's bundled OpenBLAS was found: it follows
            assert g() == 1
        sampan.set_num_threads(2)
        if g is not None:            # up to the GEMM pool's cap (backends/pool.py)
            assert g() == min(2, th.blas_cap() or 2)
        a = sampan.randn(64, 64)
        np.testing.assert_allclose((a @ a).numpy(), a.numpy() @ a.numpy(), rtol=1e-5)
        with pytest.raises(ValueError):
            sampan.set_num_threads(0)
    finally:
        sampan.set_num_threads(before)


def test_data_shares_storage_without_history():
    p = sampan.randn(3, requires_grad=True)
    y = p * p                              # saves p for its gradient
    d = p.data
    assert not d.requires_grad and d.grad_fn is None and np.shares_memory(d.numpy(), p.numpy())
    before = p.numpy().copy()
    p.data.mul_(2)                         # no error (a leaf needing grad), no version bump
    np.testing.assert_allclose(p.numpy(), before * 2)
    y.sum().backward()                     # torch: .data writes escape the version check
    assert p.grad is not None and p.is_leaf
    new = sampan.zeros(3)
    p.data = new
    assert np.shares_memory(p.numpy(), new.numpy()) and p.requires_grad and p.is_leaf
    p.data = sampan.ones(2, 2)             # shape may change, as torch
    assert p.shape == (2, 2)
    with pytest.raises(SampanError):
        p.data = sampan.tensor([1, 2])     # a tensor that requires grad stays floating


def test_data_under_jit():
    w = sampan.ones(3)

    @sampan.jit
    def step(x):
        w.data.add_(x)
        return w * 1.0

    out = step(sampan.ones(3))
    np.testing.assert_allclose(out.numpy(), 2.0)
    np.testing.assert_allclose(w.numpy(), 2.0)


STRIDE_CASES = [((2, 3, 4), None), ((2, 3, 4), (2, 0, 1)), ((5,), None), ((3, 1, 4), (1, 0, 2)),
                ((0, 3), None), ((2, 3), (1, 0)), ((), None)]


@pytest.mark.parametrize("shape,perm", STRIDE_CASES)
def test_stride_and_contiguity_match_torch(shape, perm):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    s, t = sampan.tensor(a), torch.from_numpy(a.copy())
    if perm is not None:
        s, t = s.permute(*perm), t.permute(*perm)
    assert s.stride() == t.stride() and s.is_contiguous() == t.is_contiguous()
    for d in range(-s.ndim, s.ndim):
        assert s.stride(d) == t.stride(d)
    c = s.contiguous()
    assert c.is_contiguous() and c.stride() == t.contiguous().stride()
    assert (s.element_size(), s.itemsize, s.nbytes) == (t.element_size(), t.itemsize, t.nbytes)


def test_stride_of_views():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    s, t = sampan.tensor(a), torch.from_numpy(a.copy())
    for f in (lambda x: x.transpose(0, 1), lambda x: x[:, 1:4], lambda x: x[::2],
              lambda x: x[1], lambda x: x[:, :1].expand(4, 5), lambda x: x.unsqueeze(1),
              lambda x: x.T[1:]):
        assert f(s).stride() == f(t).stride()
        assert f(s).is_contiguous() == f(t).is_contiguous()
    assert sampan.zeros(2, dtype=sampan.int16).element_size() == 2
    with pytest.raises(SampanError):
        s.stride(2)


def test_new_factories():
    x = sampan.zeros(2, dtype=sampan.float64)
    t = torch.zeros(2, dtype=torch.float64)
    for s_, t_ in [(x.new_zeros(2, 3), t.new_zeros(2, 3)), (x.new_ones((3,)), t.new_ones((3,))),
                   (x.new_full((2, 2), 7), t.new_full((2, 2), 7)),
                   (x.new_empty(4).shape, tuple(t.new_empty(4).shape)),
                   (x.new_tensor([1, 2]), t.new_tensor([1, 2])),
                   (x.new_zeros(2, dtype=sampan.int32), t.new_zeros(2, dtype=torch.int32))]:
        if isinstance(s_, tuple):
            assert s_ == t_
            continue
        assert str(s_.dtype) == str(t_.dtype).replace("torch.", "")
        np.testing.assert_array_equal(s_.numpy(), t_.numpy())
    r = x.new_ones(3, requires_grad=True)
    assert r.requires_grad and r.is_leaf and r.dtype == np.float64
    src = sampan.tensor([1.0, 2.0], requires_grad=True)
    c = x.new_tensor(src)
    assert not c.requires_grad and not np.shares_memory(c.numpy(), src.numpy())


def test_as_tensor_empty_like_is_tensor_numel():
    a = np.zeros(3, np.float64)
    t = sampan.as_tensor(a)
    assert t.dtype == np.float64 and np.shares_memory(t.numpy(), a)
    a[0] = 5
    assert t[0].item() == 5
    assert sampan.as_tensor(t) is t and sampan.as_tensor(t, sampan.float32).dtype == np.float32
    assert sampan.as_tensor([1, 2]).dtype == np.int64
    assert sampan.as_tensor(a, dtype=sampan.float32).dtype == np.float32
    e = sampan.empty_like(sampan.ones(2, 3, dtype=sampan.int32))
    assert e.shape == (2, 3) and e.dtype == np.int32
    assert sampan.empty_like(t, dtype=sampan.float16).dtype == np.float16
    assert sampan.is_tensor(t) and not sampan.is_tensor(a)
    assert sampan.numel(sampan.zeros(2, 5)) == 10 == sampan.zeros(2, 5).nelement()
