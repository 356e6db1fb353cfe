"""Issue 16 ("Trust what exists"), the ops items: finite gradients where the math is
finite and PyTorch's conventions at kinks and ties (3), PyTorch's `gather` (4), zero-size
dims (5), 0-d dtype promotion and out-of-range indices (7).

Every value and gradient is checked against PyTorch, in eager mode and under sampan.jit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import sampan
import sampan.nn.functional as F
from sampan.autograd import gradcheck, gradgradcheck


def _grads(fn, arrays, diff=None):
    """fn(*tensors) -> (output, gradients of sum(output * cot) w.r.t. the float inputs),
    eager and through sampan.jit, as numpy."""
    diff = tuple(i for i, a in enumerate(arrays) if a.dtype.kind == "f") if diff is None \
        else diff
    cot_rng = np.random.default_rng(0)

    def run(*xs):
        y = fn(*xs)
        cot = sampan.tensor(cot_rng.standard_normal(tuple(y.shape)).astype(y.dtype.name))
        loss = (y * cot).sum()
        gs = sampan.grad(loss, [xs[k] for k in diff], allow_unused=True)
        return (y,) + tuple(gs)

    def fresh():
        return [sampan.tensor(a.copy(), requires_grad=k in diff) for k, a in enumerate(arrays)]

    eager = [t.numpy() for t in run(*fresh())]
    cot_rng = np.random.default_rng(0)
    jitted = [t.numpy() for t in sampan.jit(run)(*fresh())]
    return eager, jitted, diff


def _torch_grads(fn, arrays, diff, shape):
    ts = [torch.tensor(a, requires_grad=k in diff) for k, a in enumerate(arrays)]
    y = fn(*ts)
    cot = torch.tensor(np.random.default_rng(0).standard_normal(shape).astype(
        str(y.dtype).replace("torch.", "")))
    gs = torch.autograd.grad((y * cot).sum(), [ts[k] for k in diff], allow_unused=True)
    return [y.detach().numpy()] + [np.zeros(arrays[k].shape) if g is None else g.numpy()
                                   for k, g in zip(diff, gs)]


def _check_vs_torch(fn, tfn, *arrays, diff=None, atol=1e-9):
    eager, jitted, diff = _grads(fn, arrays, diff)
    ref = _torch_grads(tfn, arrays, diff, eager[0].shape)
    for what, got in (("eager", eager), ("jit", jitted)):
        assert len(got) == len(ref)
        for k, (a, b) in enumerate(zip(got, ref)):
            assert np.all(np.isfinite(a) == np.isfinite(b)), (what, k, a, b)
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=atol, err_msg=f"{what} {k}")


# ------------------------------------------------------------------ 3. NaN gradients, ties
@pytest.mark.parametrize("row", [[2.0, 0.0, 3.0, 5.0], [2.0, 0.0, 0.0, 5.0],
                                 [0.0, 0.0, 0.0, 5.0], [1.5, -2.0, 3.0, 0.5]])
def test_prod_gradient_is_the_product_of_the_others(row):
    x = np.array([row, row[::-1]], np.float64)
    _check_vs_torch(lambda t: sampan.prod(t, 1), lambda t: torch.prod(t, 1), x)
    _check_vs_torch(lambda t: sampan.prod(t), lambda t: torch.prod(t), x)
    # float64 finite differences, and the rule is differentiable again, zeros included
    t = sampan.tensor(x, requires_grad=True)
    assert gradcheck(lambda u: sampan.prod(u, 1), [t])
    assert gradgradcheck(lambda u: sampan.prod(u, 1), [t])


def test_pow_zero_exponent_at_zero():
    x = np.array([0.0, 2.0, 0.0, -1.5])
    e = np.array([0.0, 0.0, 2.0, 3.0])
    _check_vs_torch(lambda t: t ** 0, lambda t: t ** 0, x)
    _check_vs_torch(lambda t, u: t ** u, lambda t, u: t ** u, x[:3], e[:3])
    t = sampan.tensor(x, requires_grad=True)
    assert gradgradcheck(lambda u: u ** 2, [t])


def test_std_of_constant_values_has_zero_gradient():
    x = np.array([[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]])
    _check_vs_torch(lambda t: sampan.std(t, 1), lambda t: torch.std(t, 1), x)
    _check_vs_torch(lambda t: t.std(), lambda t: t.std(), np.full((4,), 0.5))


def test_clamp_passes_the_gradient_at_its_bounds():
    x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0])
    _check_vs_torch(lambda t: sampan.clamp(t, 0.0, 1.0), lambda t: torch.clamp(t, 0.0, 1.0), x)
    _check_vs_torch(lambda t: t.clamp(min=0.0), lambda t: t.clamp(min=0.0), x)
    # tensor bounds, min == max and min > max included
    x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, 5.0, -3.0])
    lo = np.array([0.0, 0.0, 1.0, 1.0, 3.0, 2.0, 2.0])
    hi = np.array([0.0, 1.0, 1.0, 2.0, 4.0, 1.0, 1.0])
    _check_vs_torch(lambda t, a, b: sampan.clamp(t, a, b),
                    lambda t, a, b: torch.clamp(t, a, b), x, lo, hi)
    _check_vs_torch(lambda t, a: sampan.clamp(t, max=a), lambda t, a: torch.clamp(t, max=a),
                    x, hi)
    # NaN stays NaN; min > max gives max everywhere
    y = sampan.clamp(sampan.tensor([np.nan, 5.0]), 2.0, 1.0).numpy()
    assert np.isnan(y[0]) and y[1] == 1.0


@pytest.mark.parametrize("which", ["max", "min"])
def test_max_with_dim_sends_the_gradient_to_the_returned_index(which):
    x = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [3.0, -1.0, 3.0]])

    def ours(t):
        v, i = getattr(sampan, which)(t, 1)
        return v

    def theirs(t):
        return getattr(torch, which)(t, 1).values
    _check_vs_torch(ours, theirs, x)
    v, i = getattr(sampan, which)(sampan.tensor(x), 1, keepdims=True)
    tv, ti = getattr(torch, which)(torch.tensor(x), 1, keepdim=True)
    assert v.shape == tuple(tv.shape) and np.array_equal(i.numpy(), ti.numpy())
    # amax still shares the gradient among ties (torch.amax does too)
    _check_vs_torch(lambda t: sampan.amax(t, 1), lambda t: torch.amax(t, 1), x)


@pytest.mark.parametrize("name,kw", [("hardtanh", {}), ("relu6", {}), ("elu", {"alpha": 2.0}),
                                     ("elu", {})])
def test_activation_kinks_follow_torch(name, kw):
    x = np.array([-2.0, -1.0, 0.0, 0.5, 1.0, 6.0, 7.0])
    _check_vs_torch(lambda t: getattr(F, name)(t, **kw),
                    lambda t: getattr(torch.nn.functional, name)(t, **kw), x)
    assert np.isnan(getattr(F, name)(sampan.tensor([np.nan])).numpy()[0])


def test_normalize_of_a_zero_vector_has_a_finite_gradient():
    # rows: zero, ordinary, norm == eps (the clamp's tie: the norm keeps the gradient)
    x = np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0], [1e-12, 0.0, 0.0]])
    for p in (2.0, 1.0):   # (gradients of order 1/eps = 1e12: cancellation leaves ~1e-4)
        _check_vs_torch(lambda t: F.normalize(t, p=p, axis=1),
                        lambda t: torch.nn.functional.normalize(t, p=p, dim=1), x, atol=1e-3)


# ------------------------------------------------------------------ 4. PyTorch's gather
@pytest.mark.parametrize("shape,index,axis", [
    ((3, 4), [[0], [3]], 1),                    # smaller in the non-gather dim
    ((3, 4), [[0, 3, 3, 1, 2]], 1),             # longer along the gather axis
    ((4, 3, 5), [[[3, 0]], [[1, 1]]], 0),
    ((2, 3), [[1, 0, 1]], 0),
])
def test_gather_follows_torch_gather(shape, index, axis):
    x = np.random.default_rng(1).standard_normal(shape)
    i = np.array(index, np.int64)
    _check_vs_torch(lambda t, j: sampan.gather(t, j, axis),
                    lambda t, j: torch.gather(t, axis, j), x, i, diff=(0,))
    _check_vs_torch(lambda t, j: sampan.take_along_axis(t, j, axis),
                    lambda t, j: torch.gather(t, axis, j), x, i, diff=(0,))
    # and the gather's own gradient op, scatter_add, the same way
    src = np.random.default_rng(2).standard_normal(i.shape)
    _check_vs_torch(lambda t, j, s: sampan.scatter_add(t, j, s, axis),
                    lambda t, j, s: t.scatter_add(axis, j, s), x, i, src, diff=(0, 2))


def test_gather_rejects_what_torch_rejects():
    x = sampan.tensor(np.arange(12.0).reshape(3, 4))
    with pytest.raises(sampan.ShapeError, match=r"index.shape\[0\] <= input.shape\[0\]"):
        sampan.gather(x, sampan.tensor([[0], [3], [1], [2]]), 1)
    with pytest.raises(sampan.ShapeError, match="same number of dims"):
        sampan.gather(x, sampan.tensor([0, 1]), 1)
    for bad in (-1, 4):
        with pytest.raises(IndexError, match=rf"index {bad} along axis 1.*\[0, 4\)") as e:
            sampan.gather(x, sampan.tensor([[bad]]), 1)
        assert isinstance(e.value, sampan.SampanError) and "test_trust_ops.py" in str(e.value)
    with pytest.raises(IndexError):
        sampan.scatter_add(x, sampan.tensor([[4]]), sampan.tensor([[1.0]]), 1)
    with pytest.raises(sampan.ShapeError, match="source of the index's shape"):
        sampan.scatter_add(x, sampan.tensor([[0, 1]]), sampan.tensor([[1.0]]), 1)


# ------------------------------------------------------------------ 5. zero-size dims
# (the warning: the test's loss sums logsumexp's -inf times cotangents of either sign)
@pytest.mark.filterwarnings("ignore:invalid value encountered in reduce")
@pytest.mark.parametrize("shape,axis", [((2, 0), -1), ((0, 2), 0), ((3, 0, 2), 1),
                                        ((0, 3), -1)])
def test_softmax_family_over_an_empty_axis(shape, axis):
    x = np.zeros(shape)
    for ours, theirs in ((sampan.softmax, torch.softmax), (sampan.log_softmax,
                                                            torch.log_softmax)):
        _check_vs_torch(lambda t: ours(t, axis), lambda t: theirs(t, axis), x)
    _check_vs_torch(lambda t: sampan.logsumexp(t, axis), lambda t: torch.logsumexp(t, axis), x)
    _check_vs_torch(lambda t: F.softmax(t, axis), lambda t: torch.softmax(t, axis), x)
    got = sampan.logsumexp(sampan.tensor(x), axis, keepdims=True).numpy()
    np.testing.assert_array_equal(got, torch.logsumexp(torch.tensor(x), axis, True).numpy())


@pytest.mark.parametrize("a,b", [((2, 0), (0, 3)), ((4, 2, 0), (0, 3)), ((2, 4, 0), (2, 0, 3)),
                                 ((0,), (0, 3))])
def test_matmul_with_a_zero_inner_dim(a, b):
    r = np.random.default_rng(3)
    x, w = r.standard_normal(a), r.standard_normal(b)
    _check_vs_torch(lambda s, t: s @ t, lambda s, t: s @ t, x, w)


def test_linear_and_layer_norm_on_zero_size_features():
    r = np.random.default_rng(4)
    x, w, b = r.standard_normal((4, 2, 0)), r.standard_normal((0, 3)), r.standard_normal(3)
    _check_vs_torch(lambda s, t, u: F.linear(s, t, u),
                    lambda s, t, u: torch.nn.functional.linear(s, t.T, u), x, w, b)
    _check_vs_torch(lambda s, t: F.linear(s, t), lambda s, t: s @ t, x[0], w)
    x, w, b = np.zeros((2, 0)), np.zeros(0), np.zeros(0)
    _check_vs_torch(lambda s, t, u: F.layer_norm(s, (0,), t, u),
                    lambda s, t, u: torch.nn.functional.layer_norm(s, (0,), t, u), x, w, b)
    _check_vs_torch(lambda s: F.layer_norm(s, (0,)),
                    lambda s: torch.nn.functional.layer_norm(s, (0,)), x)
    x, w = np.zeros((2, 3, 0)), np.zeros((3, 0))
    _check_vs_torch(lambda s, t, u: F.layer_norm(s, (3, 0), t, u),
                    lambda s, t, u: torch.nn.functional.layer_norm(s, (3, 0), t, u), x, w, w)
    # rows of features but no rows
    x, w, b = r.standard_normal((0, 5)), r.standard_normal(5), r.standard_normal(5)
    _check_vs_torch(lambda s, t, u: F.layer_norm(s, (5,), t, u),
                    lambda s, t, u: torch.nn.functional.layer_norm(s, (5,), t, u), x, w, b)


# ------------------------------------------------------------------ 7. 0-d promotion, indices
_PROMO = [("float16", (3,), "float32", ()), ("bfloat16", (3,), "float64", ()),
          ("int32", (3,), "float32", ()), ("int32", (3,), "float64", ()),
          ("int32", (3,), "int64", ()), ("uint8", (3,), "int8", ()), ("bool", (3,), "int32", ()),
          ("float16", (), "float64", ()), ("int8", (), "int64", ()), ("float32", (2,), "int64", ()),
          ("float16", (2,), "float32", (2,)), ("int32", (0,), "float64", ())]


def _tt(a):
    if a.dtype == sampan.bfloat16:
        return torch.tensor(a.astype(np.float32)).to(torch.bfloat16)
    return torch.tensor(a)


@pytest.mark.parametrize("da,sa,db,sb", _PROMO)
def test_0d_tensors_promote_like_torch(da, sa, db, sb):
    a, b = np.ones(sa, da), np.full(sb, 2, db)
    want = (_tt(a) * _tt(b)).dtype
    for x, y in ((a, b), (b, a)):
        for op in (lambda s, t: s * t, lambda s, t: s + t, lambda s, t: sampan.maximum(s, t),
                   lambda s, t: sampan.where(sampan.tensor(True), s, t)):
            got = op(sampan.tensor(x), sampan.tensor(y))
            assert str(want) == f"torch.{got.dtype.name}", (x.dtype, x.shape, y.dtype, y.shape)
            traced = sampan.jit(op)(sampan.tensor(x), sampan.tensor(y))
            assert traced.dtype == got.dtype


@pytest.mark.parametrize("da", ["float16", "int32", "bool", "uint8"])
@pytest.mark.parametrize("scalar", [2, 2.5, True, np.float64(2.5), np.float32(2.5), np.int64(3),
                                    np.int8(3)])   # (torch reads np.bool_ as a float)
def test_python_and_numpy_scalars_promote_like_torch(da, scalar):
    a = np.ones(3, da)
    want = (torch.tensor(a) * scalar).dtype
    got = sampan.tensor(a) * scalar
    assert str(want) == f"torch.{got.dtype.name}", (da, type(scalar))
    np.testing.assert_allclose(got.numpy().astype(np.float64),
                               (torch.tensor(a) * scalar).double().numpy())


def test_0d_gradient_keeps_its_dtype():
    x = sampan.tensor(np.ones(3, np.float16), requires_grad=True)
    s = sampan.tensor(np.float32(2.0), requires_grad=True)
    y = x * s
    assert y.dtype == sampan.float16
    y.sum().backward()
    assert s.grad.dtype == sampan.float32 and float(s.grad.numpy()) == 3.0


def test_out_of_range_class_ids_raise():
    with pytest.raises(IndexError, match=r"one_hot.*class ids in \[5, 5\].*\[0, 3\)"):
        F.one_hot(sampan.tensor([5]), 3)
    with pytest.raises(sampan.SampanIndexError, match="one_hot"):
        F.one_hot(sampan.tensor([[0, -1]]), 3)
    with pytest.raises(sampan.DTypeError, match="one_hot"):
        F.one_hot(sampan.tensor([0.0]), 3)
    got = F.one_hot(sampan.tensor([2, 0]), 3).numpy()
    np.testing.assert_array_equal(got, torch.nn.functional.one_hot(torch.tensor([2, 0]), 3))
    w = sampan.randn(3, 2)
    for bad in (-1, 3):
        with pytest.raises(IndexError, match=r"embedding.*\[0, 3\)") as e:
            F.embedding(sampan.tensor([0, bad]), w)
        assert isinstance(e.value, sampan.SampanError) and "test_trust_ops.py" in str(e.value)
        with pytest.raises(IndexError):
            sampan.nn.Embedding(3, 2)(sampan.tensor([bad]))
    # padding_idx may still be given negative, as in PyTorch
    assert F.embedding(sampan.tensor([2]), w, padding_idx=-1).shape == (1, 2)


def test_binary_cross_entropy_refuses_targets_outside_0_1():
    p = sampan.tensor([0.5, 0.25])
    for t in ([2.0, 0.0], [0.0, -0.5], [np.nan, 1.0]):
        with pytest.raises(sampan.SampanValueError, match="binary_cross_entropy.*targets in"):
            F.binary_cross_entropy(p, sampan.tensor(t))
        with pytest.raises(RuntimeError, match="between 0 and 1"):
            torch.nn.functional.binary_cross_entropy(torch.tensor(p.numpy()), torch.tensor(t))
    got = F.binary_cross_entropy(p, sampan.tensor([1.0, 0.3])).numpy()
    want = torch.nn.functional.binary_cross_entropy(torch.tensor(p.numpy()),
                                                     torch.tensor([1.0, 0.3]))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


@pytest.mark.parametrize("index,shown", [
    (5, "[5]"), ((1, 7), "[1, 7]"), ((slice(1, 2), 7), "[1:2, 7]"),
    ((Ellipsis, None, 9), "[..., None, 9]"), ((0, 0, 0), "[0, 0, 0]"),
])
def test_bad_indices_raise_index_error_in_the_users_words(index, shown):
    x = sampan.zeros(3, 4)
    with pytest.raises(IndexError) as e:
        x[index]
    with pytest.raises(IndexError):
        torch.zeros(3, 4)[index]
    msg = str(e.value)
    assert isinstance(e.value, sampan.SampanError)
    assert f"index {shown} into a tensor of shape (3, 4)" in msg, msg
    assert "('" not in msg and "test_trust_ops.py" in msg, msg   # no internal encoding


def test_bad_tensor_indices_raise_index_error():
    x = sampan.zeros(3, 4)
    cases = [lambda: x[sampan.tensor([0, 3])], lambda: x[:, sampan.tensor([4])],
             lambda: x[sampan.tensor([True, False])],
             lambda: x.__setitem__(sampan.tensor([3]), 1.0),
             lambda: sampan.index_select(x, sampan.tensor([3]), 0),
             lambda: sampan.index_select(x, sampan.tensor([-1]), 1)]
    for f in cases:
        with pytest.raises(IndexError) as e:
            f()
        assert isinstance(e.value, sampan.SampanError) and "('t'" not in str(e.value)
        assert "test_trust_ops.py" in str(e.value)
    with pytest.raises(sampan.SampanIndexError, match=r"\[<i64\[1\] tensor>\]"):
        x[sampan.tensor([5])]
    # under jit too (embedding's ids are values the tracer cannot see: index_select checks)
    f = sampan.jit(lambda t, i: t[i])
    with pytest.raises(IndexError, match="out of bounds"):
        f(x, sampan.tensor([7]))
    emb = sampan.jit(lambda w, i: F.embedding(i, w))
    w = sampan.randn(3, 2)
    np.testing.assert_array_equal(emb(w, sampan.tensor([2])).numpy(), w.numpy()[[2]])
    with pytest.raises(IndexError, match=r"index_select.*index -1.*\[0, 3\)"):
        emb(w, sampan.tensor([-1]))
