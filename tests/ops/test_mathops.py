"""issue 17 math ops beyond the op-table harness: special values, dtype rules, in-place
methods, the special functions' accuracy and fusion under jit, all against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import sampan
from sampan.errors import DTypeError, SampanValueError

from .torch_oracle import to_torch

UNARY = ["tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log2",
         "log10", "exp2", "erfc", "lgamma", "digamma", "erfinv", "sinc", "trunc", "frac", "isnan",
         "isinf", "isfinite", "isposinf", "isneginf", "signbit", "nan_to_num"]
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-30, -1e-30, 3.5,
           -3.5, 40.0, -40.0, 1e5, -1e5, 1e30, -1e30, -2.0, 1.0 - 1e-7, -1.0 + 1e-7]


def _torch_fn(name):
    return getattr(torch.special, name) if name == "erfinv" else getattr(torch, name)


def _same(ours, theirs, rtol, atol=0.0, signed_zero=False):
    a = np.asarray(ours)
    b = theirs.detach()
    b = (b.float() if b.dtype == torch.bfloat16 else b).numpy()
    assert a.shape == b.shape
    a64 = a.astype(np.float64) if a.dtype != np.bool_ else a
    np.testing.assert_allclose(a64, b, rtol=rtol, atol=atol, equal_nan=True)
    if signed_zero:
        z = b == 0
        np.testing.assert_array_equal(np.signbit(a64[z]), np.signbit(b[z]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", UNARY)
def test_special_values_match_torch(name, dtype):
    x = np.array(SPECIAL, dtype)
    with np.errstate(all="ignore"):
        ours = getattr(sampan, name)(sampan.tensor(x)).numpy()
    theirs = _torch_fn(name)(torch.from_numpy(x))
    if name == "digamma":   # torch's float32 digamma computes in float32: ~1e-5 at -3.5
        rtol = 1e-5 if dtype == np.float32 else 1e-12
    else:
        rtol = 2e-6 if dtype == np.float32 else 1e-13
    assert ours.dtype == x.dtype or ours.dtype == np.bool_
    _same(ours, theirs, rtol, signed_zero=name not in ("acos", "cosh", "erfc"))


BINARY = ["atan2", "logaddexp", "logaddexp2", "hypot", "copysign", "xlogy", "fmod",
          "remainder", "heaviside"]


@pytest.mark.parametrize("name", BINARY)
def test_binary_special_values_match_torch(name):
    v = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.5, -2.5, 1e30], np.float64)
    a, b = np.meshgrid(v, v, indexing="ij")
    with np.errstate(all="ignore"):
        ours = getattr(sampan, name)(sampan.tensor(a), sampan.tensor(b)).numpy()
    theirs = getattr(torch, name)(torch.from_numpy(a), torch.from_numpy(b))
    _same(ours, theirs, 1e-14, signed_zero=name in ("copysign", "fmod", "atan2"))


def _int_ok(name):
    return name not in ("frac", "logaddexp", "logaddexp2", "hypot", "lerp")


@pytest.mark.parametrize("name", UNARY + BINARY + ["lerp", "addcmul", "addcdiv"])
def test_result_dtypes_match_torch(name):
    r = np.random.default_rng(0)
    inputs = {"int64": np.array([1, 2, -3]), "bool": np.array([True, False, True]),
              "float16": np.array([0.5, -0.25, 0.75], np.float16),
              "bfloat16": np.array([0.5, -0.25, 0.75], sampan.bfloat16),
              "float64": r.uniform(0.1, 0.9, 3)}
    for kind, x in inputs.items():
        tx = to_torch(torch, x)
        if name in UNARY:
            args, targs = (sampan.tensor(x),), (tx,)
        elif name == "lerp":
            args, targs = (sampan.tensor(x), sampan.tensor(x), 0.5), (tx, tx, 0.5)
        elif name in ("addcmul", "addcdiv"):
            args, targs = (sampan.tensor(x),) * 3, (tx,) * 3
        else:
            args, targs = (sampan.tensor(x), sampan.tensor(x)), (tx, tx)
        try:
            want = _torch_fn(name)(*targs)
        except (RuntimeError, TypeError):
            if kind == "bool" and name in ("trunc", "fmod", "remainder", "addcmul"):
                continue   # sampan computes these on bools (as numpy); torch refuses
            # torch has no kernel for it (frac(int), hypot(bool) ...): a sampan error
            with pytest.raises(sampan.SampanError):
                with np.errstate(all="ignore"):
                    getattr(sampan, name)(*args)
            continue
        with np.errstate(all="ignore"):
            got = getattr(sampan, name)(*args)
        assert str(got.dtype) == str(want.dtype).replace("torch.", "").replace(
            "bool", "bool"), (name, kind, got.dtype, want.dtype)
        if kind not in ("float16", "bfloat16"):
            _same(got.numpy(), want, 1e-6)


def test_special_functions_float64_accuracy():
    x = np.concatenate([np.linspace(-6.7, 40.0, 997), np.geomspace(1e-8, 1e8, 61)])
    t = torch.from_numpy(x)
    _same(sampan.lgamma(sampan.tensor(x)).numpy(), torch.lgamma(t), 1e-13, 1e-13)
    _same(sampan.digamma(sampan.tensor(x)).numpy(), torch.digamma(t), 1e-12, 1e-13)
    for n in (1, 2, 3):
        # torch's own trigamma is good to ~5e-10 only: ours is checked tighter below
        _same(sampan.polygamma(n, sampan.tensor(x)).numpy(), torch.polygamma(n, t), 1e-9)
    # trigamma against exact values: pi^2/6 at 1, pi^2/2 at 1/2, and the recurrence
    # psi1(x) = psi1(x + 1) + 1/x^2
    got = sampan.polygamma(1, sampan.tensor(np.array([1.0, 0.5, 3.7, 4.7]))).numpy()
    np.testing.assert_allclose(got[:2], [np.pi ** 2 / 6, np.pi ** 2 / 2], rtol=1e-14)
    np.testing.assert_allclose(got[2], got[3] + 1 / 3.7 ** 2, rtol=1e-14)
    y = np.concatenate([np.linspace(-1, 1, 4001), 1 - np.geomspace(1e-16, 1e-2, 40),
                        -np.geomspace(1e-300, 1e-2, 40)])
    ours = sampan.erfinv(sampan.tensor(y)).numpy()
    _same(ours, torch.special.erfinv(torch.from_numpy(y)), 5e-15, 1e-300)
    inner = np.abs(y) < 1
    np.testing.assert_allclose(sampan.erf(sampan.tensor(ours[inner])).numpy(), y[inner],
                               rtol=4e-16, atol=4e-16)


def test_polygamma_and_float_only_errors():
    with pytest.raises(SampanValueError, match="polygamma"):
        sampan.polygamma(-1, sampan.tensor([1.0]))
    with pytest.raises(SampanValueError):
        sampan.polygamma(1.5, sampan.tensor([1.0]))
    for f in (lambda x: sampan.logaddexp(x, x), lambda x: sampan.hypot(x, x), sampan.frac,
              lambda x: sampan.lerp(x, x, 0.5), lambda x: sampan.addcdiv(x, x, x)):
        with pytest.raises(DTypeError):
            f(sampan.tensor([1, 2]))


def _grads(fn, tfn, *arrays, nondiff=()):
    ts = [sampan.tensor(a, requires_grad=i not in nondiff) for i, a in enumerate(arrays)]
    out = fn(*ts)
    out.backward(sampan.ones_like(out))
    tt = [torch.tensor(a, requires_grad=i not in nondiff) for i, a in enumerate(arrays)]
    tout = tfn(*tt)
    tout.backward(torch.ones_like(tout))
    for i, (a, b) in enumerate(zip(ts, tt)):
        if i not in nondiff:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12, atol=1e-14)
    _same(out.numpy(), tout, 1e-14)


def test_gradients_at_nondifferentiable_points_match_torch():
    x = np.array([-2.0, -1.5, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0])
    lo, hi = np.full(8, -1.5), np.array([1.0, 2.0, 0.0, 0.0, 0.5, 1.0, 0.5, 3.0])
    _grads(sampan.trunc, torch.trunc, x)
    _grads(sampan.frac, torch.frac, x)
    _grads(lambda a: sampan.clamp_min(a, 1.0), lambda a: torch.clamp_min(a, 1.0), x)
    _grads(lambda a: sampan.clamp_max(a, 0.5), lambda a: torch.clamp_max(a, 0.5), x)
    # tensor bounds (clamp/clip accept them), the input sitting on a bound
    _grads(sampan.clamp, torch.clamp, x, lo, hi)
    _grads(sampan.clip, torch.clip, x, lo, hi)
    _grads(sampan.clamp_min, torch.clamp_min, x, hi)
    _grads(sampan.clamp_max, torch.clamp_max, x, hi)
    # remainder/fmod: gradient through both operands, negative divisors included
    a, b = np.array([5.5, -5.5, 5.5, -5.5, 0.25]), np.array([2.0, 2.0, -2.0, -2.0, 0.3])
    _grads(sampan.remainder, torch.remainder, a, b)
    _grads(sampan.fmod, torch.fmod, a, b)
    _grads(lambda p, q: p % q, lambda p, q: p % q, a, b)
    # lerp with a tensor weight, both sides of |w| < 0.5, and a scalar weight
    w = np.array([-0.5, 0.2, 0.5, 0.7, 1.0])
    _grads(sampan.lerp, torch.lerp, a, b, w)
    _grads(lambda p, q: sampan.lerp(p, q, 0.75), lambda p, q: torch.lerp(p, q, 0.75), a, b)
    _grads(lambda p, q, r: sampan.addcmul(p, q, r, value=-0.5),
           lambda p, q, r: torch.addcmul(p, q, r, value=-0.5), a, b, w)
    _grads(lambda p, q, r: sampan.addcdiv(p, q, r, value=2.0),
           lambda p, q, r: torch.addcdiv(p, q, r, value=2.0), a, w, b)
    # copysign at a == 0 and xlogy at x == 0, the points torch masks
    _grads(sampan.copysign, torch.copysign, np.array([0.0, -0.0, 1.5, -2.0]),
           np.array([-1.0, 1.0, -0.0, 3.0]), nondiff=(1,))
    _grads(sampan.xlogy, torch.xlogy, np.array([0.0, 0.0, 2.0, -1.0]),
           np.array([0.0, 2.0, 3.0, 0.5]))
    _grads(sampan.nan_to_num, torch.nan_to_num, np.array([np.nan, np.inf, -np.inf, 1.0]))


def test_nan_to_num_defaults_per_dtype():
    x = np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)
    for d, td in [("float32", torch.float32), ("float16", torch.float16),
                  ("bfloat16", torch.bfloat16), ("float64", torch.float64)]:
        got = sampan.nan_to_num(sampan.tensor(x).to(d))
        want = torch.nan_to_num(torch.from_numpy(x).to(td))
        assert str(got.dtype) == d
        _same(got.numpy(), want, 0)
    got = sampan.nan_to_num(sampan.tensor(x), nan=-1.0, posinf=7.0)
    _same(got.numpy(), torch.nan_to_num(torch.from_numpy(x), nan=-1.0, posinf=7.0), 0)
    i = sampan.tensor([1, 2])
    assert sampan.nan_to_num(i).dtype == np.int64


def test_isclose_allclose_equal():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 1e-9, 100.0])
    b = np.array([1.0 + 1e-6, np.nan, np.inf, np.inf, 0.0, 100.001])
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.0, "atol": 0.0}, {"rtol": 1e-4}):
        got = sampan.isclose(sampan.tensor(a), sampan.tensor(b), **kw)
        np.testing.assert_array_equal(got.numpy(), torch.isclose(
            torch.from_numpy(a), torch.from_numpy(b), **kw).numpy())
        assert sampan.allclose(sampan.tensor(a[:1]), sampan.tensor(b[:1]), **kw) is \
            torch.allclose(torch.from_numpy(a[:1]), torch.from_numpy(b[:1]), **kw)
    x = sampan.tensor([1.0, 2.0])
    assert sampan.equal(x, x.clone()) is True and x.equal(x * 2) is False
    assert sampan.equal(x, sampan.tensor([1.0, 2.0, 3.0])) is False
    assert sampan.equal(sampan.tensor([np.nan]), sampan.tensor([np.nan])) is False
    assert x.allclose(x + 1e-9) is True
    ints = sampan.isclose(sampan.tensor([1, 2, 3]), sampan.tensor([1, 3, 3]))
    np.testing.assert_array_equal(ints.numpy(), [True, False, True])


def test_inplace_methods():
    r = np.random.default_rng(3)
    a = r.uniform(0.1, 0.9, (3, 4))
    for name in ["tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh", "log2",
                 "log10", "exp2", "erfc", "erfinv", "lgamma", "digamma", "trunc", "fix",
                 "frac", "nan_to_num", "arcsin", "arctanh"]:
        x = sampan.tensor(a)
        v = x._version
        assert getattr(x, name + "_")() is x and x._version > v
        np.testing.assert_allclose(x.numpy(), getattr(sampan, name)(sampan.tensor(a)).numpy())
    x = sampan.tensor(a)
    x.polygamma_(1)
    np.testing.assert_allclose(x.numpy(), torch.polygamma(1, torch.from_numpy(a)).numpy())
    for name, args in [("atan2", (0.5,)), ("fmod", (0.3,)), ("remainder", (-0.3,)),
                       ("copysign", (-1.0,)), ("hypot", (2.0,)), ("xlogy", (3.0,)),
                       ("lerp", (1.0, 0.25)), ("clamp_min", (0.5,)), ("clamp_max", (0.5,)),
                       ("addcmul", (a, a)), ("heaviside", (0.5,))]:
        x, t = sampan.tensor(a), torch.from_numpy(a.copy())
        targs = [torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                 if name in ("clamp_min", "clamp_max") or (name == "lerp" and k == 1)
                 else torch.tensor(v, dtype=torch.float64) for k, v in enumerate(args)]
        getattr(x, name + "_")(*args)
        getattr(t, name + "_")(*targs)
        np.testing.assert_allclose(x.numpy(), t.numpy(), rtol=1e-14, err_msg=name)
    x = sampan.tensor(a, requires_grad=True)
    y = x * 1.0
    y.atan_()
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 1 / (1 + a * a))
    i = sampan.tensor([5, -7, 9])
    i.fmod_(4)
    np.testing.assert_array_equal(i.numpy(), [1, -3, 1])
    i.remainder_(-3)
    np.testing.assert_array_equal(i.numpy(), [-2, 0, -2])
    with pytest.raises(DTypeError, match="tan_"):
        sampan.tensor([1, 2]).tan_()


def test_methods_and_aliases():
    x = sampan.tensor([0.25, -0.5])
    np.testing.assert_allclose(x.arctan2(x * 2).numpy(), sampan.atan2(x, x * 2).numpy())
    assert sampan.fix is sampan.trunc and sampan.arcsin is sampan.asin
    np.testing.assert_allclose(x.polygamma(0).numpy(), x.digamma().numpy())
    np.testing.assert_allclose(x.isclose(x).numpy(), [True, True])
    np.testing.assert_allclose(sampan.atan2(1, 2).numpy(), np.arctan2(1, 2), rtol=1e-6)
    assert sampan.atan2(sampan.tensor([1]), sampan.tensor([2])).dtype == np.float32


def _mixed(x, y, w):
    a = sampan.atan2(x, y) + sampan.hypot(x, y)
    b = sampan.lerp(sampan.tan(x * 0.5), sampan.asinh(y), w)
    c = sampan.fmod(a, 1.5) + sampan.remainder(b, 0.7) + sampan.trunc(a * 3.0)
    d = sampan.where(sampan.isfinite(c), sampan.copysign(c, y), 0.0)
    return sampan.logaddexp(d, sampan.lgamma(sampan.abs(x) + 1.0)) + sampan.frac(d)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_jit_fuses_mixed_math(dtype):
    r = np.random.default_rng(5)
    x, y, w = (sampan.tensor(r.uniform(-2, 2, s).astype(dtype)) for s in ((16, 8), (8,), ()))
    jf = sampan.jit(_mixed, debug=True)
    got = jf(x, y, w)
    np.testing.assert_allclose(got.numpy(), _mixed(x, y, w).numpy(), rtol=1e-5, atol=1e-5)
    from sampan.passes.fuse import count_kernels
    k = count_kernels(jf.graph)
    # two kernels for the 15 elementwise ops of one shape (the remainder, the `mod` op,
    # runs between them), asinh of the (8,) input on its own
    assert k["fused"] == 2 and k["total"] <= 4, str(jf.graph)
    assert "('lgamma', " in str(jf.graph) and "('lerp', " in str(jf.graph)


def test_jit_gradient_through_special_functions():
    r = np.random.default_rng(6)
    a = r.uniform(0.5, 3.0, (4, 5))

    def f(x):
        return (sampan.lgamma(x) * sampan.erfinv(x * 0.2) + sampan.digamma(x)).sum()

    def step(x):
        return sampan.grad(f(x), [x])[0]
    jf = sampan.jit(step)
    got = jf(sampan.tensor(a, requires_grad=True))
    t = torch.from_numpy(a).requires_grad_(True)
    (torch.lgamma(t) * torch.special.erfinv(t * 0.2) + torch.digamma(t)).sum().backward()
    np.testing.assert_allclose(got.numpy(), t.grad.numpy(), rtol=1e-9)


def test_jit_fused_integer_math_matches_eager():
    # fused integer fmod: numba's own np.fmod of negative integers is wrong (the scalar
    # form works on magnitudes); trunc, the predicates and signbit on integers
    def f(a, b):
        r = sampan.fmod(a * 2, b) + sampan.trunc(a) + sampan.heaviside(a, b)
        return r, sampan.isnan(a) | sampan.isinf(a * 2) | sampan.signbit(a - 1)
    x = sampan.tensor(np.array([[5, -7, 9, 3, -18, 0]] * 3))
    y = sampan.tensor(np.array([2, 3, -4, 3, -5, 7]))
    jf = sampan.jit(f)
    for a, b in zip(jf(x, y), f(x, y)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert "fused(" in str(jf.graph)
