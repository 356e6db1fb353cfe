"""dim=/keepdim= (PyTorch's names) and axis=/keepdims= (numpy's) on every reduction, shape
and sorting frontend, as functions and as Tensor methods, compared with PyTorch."""
import numpy as np
import pytest
import torch

import sampan
from sampan.errors import SampanError

R = np.random.default_rng(0)
A = R.standard_normal((3, 4, 5)).astype(np.float32)
B = R.standard_normal((2, 6)).astype(np.float32)


def _close(s, t, atol=1e-5):
    if isinstance(t, (tuple, list)):
        assert len(s) == len(t)
        for a, b in zip(s, t):
            _close(a, b, atol)
        return
    t = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    s = s.numpy() if isinstance(s, sampan.Tensor) else np.asarray(s)
    assert s.shape == t.shape, (s.shape, t.shape)
    assert s.dtype == t.dtype, (s.dtype, t.dtype)
    np.testing.assert_allclose(s.astype(np.float64), t.astype(np.float64), atol=atol, rtol=1e-5)


def _both(name, arr, *args, **kw):
    """sampan.<name>(x, ...) and x.<name>(...) against torch's function and method."""
    t = torch.from_numpy(arr.copy())
    want = getattr(torch, name)(t, *args, **kw)
    _close(getattr(sampan, name)(sampan.tensor(arr), *args, **kw), want)
    _close(getattr(sampan.tensor(arr), name)(*args, **kw), getattr(t, name)(*args, **kw))


REDUCE_CASES = [dict(), dict(dim=1), dict(dim=-1, keepdim=True), dict(dim=(0, 2)),
                dict(dim=(-1, 0), keepdim=True)]


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "logsumexp", "std", "var"])
@pytest.mark.parametrize("kw", REDUCE_CASES, ids=str)
def test_reductions_dim_keepdim(name, kw):
    if name == "logsumexp" and "dim" not in kw:
        kw = dict(kw, dim=(0, 1, 2))
    _both(name, A, **kw)


@pytest.mark.parametrize("name", ["prod", "argmax", "argmin", "all", "any", "cumsum"])
@pytest.mark.parametrize("dim", [0, -1, 1])
def test_one_dim_reductions(name, dim):
    x = A > 0 if name in ("all", "any") else A
    kws = [dict(dim=dim)] + ([dict(dim=dim, keepdim=True)] if name != "cumsum" else [])
    for kw in kws:
        _both(name, x, **kw)
    if name != "cumsum":
        _both(name, x)
        _both(name, x, dim)


def test_numpy_spelling_and_both_given():
    x = sampan.tensor(A)
    _close(sampan.sum(x, axis=1, keepdims=True), torch.from_numpy(A).sum(1, keepdim=True))
    _close(x.mean(axis=(0, 2)), torch.from_numpy(A).mean((0, 2)))
    _close(sampan.softmax(x, axis=0), torch.softmax(torch.from_numpy(A), 0))
    _close(sampan.cat([x, x], axis=2), torch.cat([torch.from_numpy(A)] * 2, 2))
    for f in [lambda: x.sum(dim=1, axis=1), lambda: sampan.mean(x, keepdim=True, keepdims=True),
              lambda: x.max(dim=0, axis=0), lambda: sampan.softmax(x, dim=1, axis=1),
              lambda: sampan.cat([x, x], dim=0, axis=0), lambda: x.squeeze(dim=0, axis=0),
              lambda: x.var(dim=0, axis=0), lambda: x.var(unbiased=True, correction=0),
              lambda: sampan.sort(x, dim=0, axis=0), lambda: x.cumsum(dim=0, axis=0)]:
        with pytest.raises(SampanError, match="both"):
            f()


def test_sum_cumsum_mean_dtype():
    i = np.arange(12, dtype=np.int32).reshape(3, 4)
    _both("sum", i, dim=0)                     # int32 sums in int64, as torch
    _both("cumsum", i, dim=1)
    _both("sum", np.array([True, False, True]))
    t = torch.from_numpy(A)
    _close(sampan.tensor(A).sum(1, dtype=sampan.float64), t.sum(1, dtype=torch.float64))
    _close(sampan.cumsum(sampan.tensor(i), 0, dtype=sampan.float32),
           torch.cumsum(torch.from_numpy(i), 0, dtype=torch.float32))
    _close(sampan.tensor(i).mean(dtype=sampan.float64), torch.from_numpy(i).mean(
        dtype=torch.float64))
    _close(sampan.softmax(sampan.tensor(A), dim=1, dtype=sampan.float64),
           torch.softmax(t, 1, dtype=torch.float64))


def test_max_min_return_types():
    x, t = sampan.tensor(A), torch.from_numpy(A)
    for name in ("max", "min"):
        for kw in (dict(dim=1), dict(dim=-1, keepdim=True)):
            r, want = getattr(x, name)(**kw), getattr(t, name)(**kw)
            v, i = r
            _close(v, want.values)
            _close(i, want.indices)
            assert r.values is v and r.indices is i and i.dtype == np.int64
            _close(getattr(sampan, name)(x, 0), getattr(torch, name)(t, 0))
        _close(getattr(x, name)(), getattr(t, name)())
        other = sampan.tensor(A[::-1].copy())
        _close(getattr(sampan, name)(x, other), getattr(torch, name)(t, torch.from_numpy(
            A[::-1].copy())))
        _close(getattr(x, name)(other), getattr(t, name)(torch.from_numpy(A[::-1].copy())))
    assert repr(x.max(dim=0)).startswith("max(values=tensor(")
    v, i = sampan.tensor(3.0).max(dim=0)
    assert v.shape == () and i.item() == 0


def test_max_values_gradient():
    x = sampan.tensor(A, requires_grad=True)
    t = torch.from_numpy(A).requires_grad_()
    x.max(dim=1).values.sum().backward()
    t.max(dim=1).values.sum().backward()
    _close(x.grad, t.grad)


@pytest.mark.parametrize("kw", [dict(), dict(dim=0), dict(dim=1, unbiased=False),
                                dict(dim=(0, 2), correction=0, keepdim=True),
                                dict(dim=-1, correction=2)], ids=str)
def test_std_var_mean(kw):
    for name in ("std", "var", "std_mean", "var_mean"):
        _both(name, A, **kw) if not name.endswith("_mean") else _close(
            getattr(sampan, name)(sampan.tensor(A), **kw),
            getattr(torch, name)(torch.from_numpy(A), **kw))
    _close(sampan.tensor(A).var(False), torch.from_numpy(A).var(False))
    _close(sampan.tensor(A).std(1, True, True), torch.from_numpy(A).std(1, True, True))


def test_std_var_no_dof_is_nan():
    with np.errstate(all="ignore"):
        assert np.isnan(sampan.var(sampan.tensor([1.0])).item())
        assert np.isnan(sampan.tensor([2.0]).std().item())


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_dim(name, dim):
    _close(getattr(sampan, name)(sampan.tensor(A), dim=dim),
           getattr(torch, name)(torch.from_numpy(A), dim=dim))
    _close(getattr(sampan.tensor(A), name)(dim), getattr(torch.from_numpy(A), name)(dim))


def test_cat_stack_squeeze_unsqueeze():
    x, t = sampan.tensor(A), torch.from_numpy(A)
    for d in (0, 1, -1):
        _close(sampan.cat([x, x], dim=d), torch.cat([t, t], dim=d))
        _close(sampan.concat((x, x), d), torch.concat((t, t), d))
        _close(sampan.stack([x, x], dim=d), torch.stack([t, t], dim=d))
    _close(sampan.stack([x, x], dim=3), torch.stack([t, t], dim=3))
    s = np.zeros((1, 3, 1, 2), np.float32)
    for kw in (dict(), dict(dim=0), dict(dim=1), dict(dim=-2), dict(dim=(0, 2)),
               dict(dim=(1, 3))):
        _both("squeeze", s, **kw)
    for d in (0, 2, 4, -1, -5):
        _both("unsqueeze", s, d)
        _both("unsqueeze", s, dim=d)
    with pytest.raises(SampanError, match="dim"):
        x.unsqueeze(5)
    with pytest.raises(SampanError, match="shapes"):
        sampan.stack([x, x[0]])


def test_split_chunk():
    x, t = sampan.tensor(B), torch.from_numpy(B)
    for arg, kw in [(2, {}), (4, dict(dim=1)), ([1, 5], dict(dim=-1)), (1, dict(dim=0)),
                    ([2, 0, 4], dict(dim=1)), (7, dict(dim=1))]:
        _close(sampan.split(x, arg, **kw), torch.split(t, arg, **kw))
        _close(x.split(arg, **kw), t.split(arg, **kw))
    for c, d in [(2, 1), (4, -1), (5, 1), (3, 0)]:
        _close(x.chunk(c, dim=d), t.chunk(c, dim=d))
        _close(sampan.chunk(x, c, d), torch.chunk(t, c, d))
    e = np.zeros((0, 3), np.float32)
    _close(sampan.split(sampan.tensor(e), 2), torch.split(torch.from_numpy(e), 2))
    _close(sampan.chunk(sampan.tensor(e), 3), torch.chunk(torch.from_numpy(e), 3))
    with pytest.raises(SampanError, match="add up"):
        x.split([2, 3], dim=1)


def test_sort_argsort_topk():
    x, t = sampan.tensor(A), torch.from_numpy(A)
    for kw in (dict(), dict(dim=0), dict(dim=1, descending=True), dict(dim=-1, stable=True)):
        r, w = x.sort(**kw), t.sort(**kw)
        _close(r.values, w.values)
        _close(r.indices, w.indices)
        _close(sampan.argsort(x, **kw), torch.argsort(t, **kw))
    for kw in (dict(), dict(dim=0), dict(dim=1, largest=False), dict(dim=-1, sorted=True)):
        r, w = sampan.topk(x, 2, **kw), torch.topk(t, 2, **kw)
        v, i = r
        _close(v, w.values)
        _close(r.indices, w.indices)
        _close(x.topk(3, **kw), t.topk(3, **kw))


def test_views_and_sizes():
    x, t = sampan.tensor(A), torch.from_numpy(A)
    _close(x.flip(0, 2), t.flip(0, 2))
    _close(sampan.flip(x, dims=(1,)), torch.flip(t, dims=(1,)))
    _close(x.flip([-1]), t.flip([-1]))
    for a, b in [(0, 1), (-1, 0), (2, -2)]:
        _close(x.transpose(a, b), t.transpose(a, b))
        _close(sampan.swapaxes(x, a, b), torch.swapaxes(t, a, b))
        _close(x.swapdims(a, b), t.swapdims(a, b))
    _close(x.narrow(1, 1, 2), t.narrow(1, 1, 2))
    _close(sampan.narrow(x, -1, -3, 3), torch.narrow(t, -1, -3, 3))
    with pytest.raises(SampanError, match="start"):
        x.narrow(1, 3, 2)
    for s, e in [(0, -1), (1, 2), (-2, -1), (0, 0)]:
        _close(x.flatten(s, e), t.flatten(s, e))
        _close(sampan.flatten(x, start_dim=s, end_dim=e), torch.flatten(t, start_dim=s,
                                                                         end_dim=e))
    idx = np.array([2, 0, 2])
    for d in (0, 1, -1):
        _close(x.index_select(d, sampan.tensor(idx)), t.index_select(d, torch.from_numpy(idx)))
        _close(sampan.index_select(x, dim=d, index=sampan.tensor(idx)),
               torch.index_select(t, dim=d, index=torch.from_numpy(idx)))
    _close(sampan.index_select(x, sampan.tensor(idx), 1), t.index_select(1, torch.from_numpy(idx)))
    assert x.size(1) == t.size(1) and x.size(-1) == t.size(-1) and x.size() == tuple(t.size())
    assert x.dim() == x.ndimension() == 3 and x.numel() == t.numel() == sampan.numel(x)
    _close(x.view(12, 5), t.view(12, 5))
    _close(x.view(-1), t.view(-1))
    _close(x.view((4, 15)), t.view((4, 15)))
    _close(x.view(sampan.int32), t.view(torch.int32))
    _close(x[:, :1].expand(-1, 4, -1), t[:, :1].expand(-1, 4, -1))
    _close(x[:, :1].expand(2, 3, 4, 5), t[:, :1].expand(2, 3, 4, 5))
    _close(x.permute(2, 0, 1), t.permute(2, 0, 1))
    _close(x.permute((-1, 0, 1)), t.permute((-1, 0, 1)))
    with pytest.raises(SampanError, match="dim"):
        x.permute(0, 1, 3)


def test_dim_idioms_under_jit():
    def f(x):
        v, i = x.max(dim=-1)
        s = sampan.softmax(x, dim=1).sum(dim=(0, 2), keepdim=True)
        a, b = x.split(2, dim=1)
        top = x.topk(2, dim=-1).values
        m = sampan.cat([a, b], dim=1).mean(dim=0)
        sd = x.std(dim=-1, unbiased=False)
        return (v + i.float() + top.sum(dim=-1) + sd, s.squeeze(dim=0), m.unsqueeze(dim=0),
                x.argmax(dim=1), x.flip(dims=(0,)).cumsum(dim=2))

    x = sampan.tensor(A)
    g = sampan.jit(f)
    for a, b in zip(g(x), f(x)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    r = sampan.jit(lambda x: x.max(dim=1))(x)
    assert isinstance(r, sampan.return_types.max)
    np.testing.assert_array_equal(r.indices.numpy(), A.argmax(1))


def test_std_mean_var_gradients():
    a = A.astype(np.float64)
    for name, kw in [("std_mean", dict(dim=1)), ("var_mean", dict(dim=(0, 2), correction=0)),
                     ("std", dict(dim=-1, unbiased=False, keepdim=True))]:
        x = sampan.tensor(a, requires_grad=True)
        t = torch.from_numpy(a.copy()).requires_grad_()
        r, w = getattr(sampan, name)(x, **kw), getattr(torch, name)(t, **kw)
        r, w = (r, w) if isinstance(r, tuple) else ((r,), (w,))
        sum((o * (i + 1.0)).sum() for i, o in enumerate(r)).backward()
        sum((o * (i + 1.0)).sum() for i, o in enumerate(w)).backward()
        _close(x.grad, t.grad, atol=1e-10)
