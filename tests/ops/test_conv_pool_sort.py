"""conv / pool / sort ops: forward and gradients against PyTorch over many configurations
(float64, tight tolerances), finite differences, second order, shape rules, dtypes,
errors."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import sampan
from sampan.autograd import gradcheck, gradgradcheck
from sampan.ops.registry import OPS, Spec

F = torch.nn.functional
NN_OPS = ["conv2d", "conv_transpose2d", "conv2d_grad_weight", "max_pool2d", "max_pool2d_grad",
          "max_pool2d_gather", "avg_pool2d", "avg_pool2d_grad", "sort", "argsort", "topk"]
TIGHT = {"rtol": 1e-10, "atol": 1e-11}


def _r(seed):
    return np.random.default_rng(seed)


def _rn(*shape, requires_grad=False):
    return sampan.tensor(_r(99).standard_normal(shape).astype(np.float32),
                         requires_grad=requires_grad)


def _st(a, grad=True):
    return sampan.tensor(a, dtype="float64", requires_grad=grad)


def _tt(a, grad=True):
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def _close(ours, theirs, what="", **tol):
    np.testing.assert_allclose(ours.numpy() if isinstance(ours, sampan.Tensor) else ours,
                               theirs.detach().numpy(), err_msg=what, **(tol or TIGHT))


def _compare(fs, ft, arrays, seed=0):
    """Forward and all input gradients of sampan fs vs torch ft on float64 arrays."""
    xs = [_st(a) for a in arrays]
    ts = [_tt(a) for a in arrays]
    y, ty = fs(*xs), ft(*ts)
    _close(y, ty, "forward")
    g = _r(seed).standard_normal(ty.shape)
    gs = sampan.grad(y, xs, sampan.tensor(g, dtype="float64"))
    tg = torch.autograd.grad(ty, ts, torch.tensor(g))
    for k, (a, b) in enumerate(zip(gs, tg)):
        _close(a, b, f"grad of input {k}")


# ---------------------------------------------------------------------- shape rules
def _cases():
    return [(n, i) for n in NN_OPS for i in range(len(OPS[n].samples()))]


@pytest.mark.parametrize("name,i", _cases())
def test_shape_rule_matches_kernel(name, i):
    op = OPS[name]
    s = op.samples()[i]
    spec = op.shape_rule(*[Spec(tuple(a.shape), a.dtype) for a in s.args], **s.attrs)
    out = op.kernel(*s.args, **s.attrs)
    specs = spec if isinstance(spec, tuple) else (spec,)
    outs = out if isinstance(out, tuple) else (out,)
    assert len(specs) == len(outs) == op.n_out
    for sp, o in zip(specs, outs):
        assert tuple(sp.shape) == o.shape and sp.dtype == o.dtype, (name, sp, o.shape, o.dtype)
    flops = op.flops(*[Spec(tuple(a.shape), a.dtype) for a in s.args], **s.attrs)
    assert isinstance(flops, int) and flops >= 0


def test_shape_rule_symbolic_batch():
    y = OPS["conv2d"].shape_rule(Spec(("B", 3, 8, 8), np.dtype("f4")),
                                 Spec((4, 3, 3, 3), np.dtype("f4")), stride=(2, 2),
                                 padding=(1, 1), dilation=(1, 1), groups=1)
    assert y.shape == ("B", 4, 4, 4)


# ---------------------------------------------------------------------- conv2d
CONV_CONFIGS = [
    # (N, C, H, W, O, kh, kw, stride, padding, dilation, groups)
    (2, 3, 7, 7, 4, 3, 3, 1, 0, 1, 1),
    (2, 3, 8, 9, 5, 3, 3, 1, 1, 1, 1),
    (1, 2, 9, 8, 3, 3, 2, 2, 1, 1, 1),
    (2, 4, 10, 7, 6, 3, 3, (2, 1), (1, 2), 1, 2),
    (1, 3, 11, 11, 2, 3, 3, 1, 2, 2, 1),
    (1, 2, 12, 10, 4, 2, 3, (3, 2), (0, 1), (2, 3), 1),
    (2, 4, 6, 6, 4, 3, 3, 1, 1, 1, 4),      # depthwise
    (3, 4, 5, 5, 6, 1, 1, 1, 0, 1, 2),      # 1x1 grouped
    (2, 3, 5, 5, 4, 5, 5, 1, 2, 1, 1),
    (1, 6, 8, 8, 6, 3, 3, 2, 1, 1, 3),
    (1, 1, 4, 6, 2, 4, 6, 1, 0, 1, 1),      # kernel covers the whole input
    (2, 2, 7, 5, 3, 2, 2, 3, 0, 1, 1),      # stride remainder rows never used
]


@pytest.mark.parametrize("cfg", CONV_CONFIGS)
def test_conv2d_vs_torch(cfg):
    n, c, h, w, o, kh, kw, s, p, d, g = cfg
    r = _r(1)
    arrays = [r.standard_normal((n, c, h, w)), r.standard_normal((o, c // g, kh, kw)),
              r.standard_normal(o)]
    _compare(lambda x, wt, b: sampan.conv2d(x, wt, b, s, p, d, g),
             lambda x, wt, b: F.conv2d(x, wt, b, s, p, d, g), arrays)


@pytest.mark.parametrize("cfg", CONV_CONFIGS)
def test_conv_transpose2d_vs_torch(cfg):
    n, c, h, w, o, kh, kw, s, p, d, g = cfg
    s2 = (s, s) if isinstance(s, int) else s
    op = tuple(max(0, k - 1) for k in s2)          # largest legal output_padding
    r = _r(2)
    arrays = [r.standard_normal((n, c, h, w)), r.standard_normal((c, o // g, kh, kw)),
              r.standard_normal(o // g * g)]
    _compare(lambda x, wt, b: sampan.conv_transpose2d(x, wt, b, s, p, op, g, d),
             lambda x, wt, b: F.conv_transpose2d(x, wt, b, s, p, op, g, d), arrays)


@pytest.mark.parametrize("s,p,d,g", [(1, 0, 1, 1), (2, 1, 1, 1), (3, 2, 2, 2), (1, "same", 2, 1),
                                     (1, "valid", 1, 2)])
def test_conv1d_vs_torch(s, p, d, g):
    r = _r(3)
    arrays = [r.standard_normal((2, 4, 13)), r.standard_normal((6, 4 // g, 3)),
              r.standard_normal(6)]
    _compare(lambda x, w, b: sampan.conv1d(x, w, b, s, p, d, g),
             lambda x, w, b: F.conv1d(x, w, b, s, p, d, g), arrays)


@pytest.mark.parametrize("k,d", [((3, 3), 1), ((2, 4), 1), ((3, 2), 2)])
def test_conv2d_padding_same_vs_torch(k, d):
    r = _r(4)
    arrays = [r.standard_normal((1, 2, 7, 6)), r.standard_normal((3, 2) + k)]
    _compare(lambda x, w: sampan.conv2d(x, w, padding="same", dilation=d),
             lambda x, w: F.conv2d(x, w, padding="same", dilation=d), arrays)


def test_conv2d_gradcheck_and_second_order():
    r = _r(5)
    x = _st(r.standard_normal((1, 2, 5, 4)))
    w = _st(r.standard_normal((4, 1, 3, 2)))
    b = _st(r.standard_normal(4))

    def f(x, w, b):
        return sampan.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    assert gradcheck(f, [x, w, b])
    assert gradgradcheck(f, [x, w, b])


def test_conv_transpose2d_gradcheck_and_second_order():
    r = _r(6)
    x = _st(r.standard_normal((1, 2, 3, 3)))
    w = _st(r.standard_normal((2, 2, 2, 3)))

    def f(x, w):
        return sampan.conv_transpose2d(x, w, stride=2, padding=(1, 0), output_padding=1)
    assert gradcheck(f, [x, w])
    assert gradgradcheck(f, [x, w])


def test_conv2d_second_order_vs_torch():
    """A gradient penalty (d/dparams of |d loss/d x|^2) matches PyTorch exactly."""
    r = _r(7)
    arrays = [r.standard_normal((2, 2, 6, 6)), r.standard_normal((3, 2, 3, 3))]
    xs, ts = [_st(a) for a in arrays], [_tt(a) for a in arrays]
    (gx,) = sampan.grad(sampan.sum(sampan.tanh(sampan.conv2d(xs[0], xs[1], stride=2,
                                                             padding=1))), [xs[0]],
                        create_graph=True)
    (tgx,) = torch.autograd.grad(torch.tanh(F.conv2d(ts[0], ts[1], stride=2, padding=1)).sum(),
                                 [ts[0]], create_graph=True)
    ours = sampan.grad(sampan.sum(gx * gx), xs)
    theirs = torch.autograd.grad((tgx * tgx).sum(), ts)
    for a, b in zip(ours, theirs):
        _close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 2e-2),
                                       ("bfloat16", 5e-2)])
def test_conv2d_low_precision(dtype, tol):
    r = _r(8)
    x = r.standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = (r.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    y = sampan.conv2d(sampan.tensor(x).to(dtype), sampan.tensor(w).to(dtype), padding=1)
    assert y.dtype == sampan.tensor(x).to(dtype).dtype
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
    np.testing.assert_allclose(y.float().numpy(), ref, rtol=tol, atol=tol * 4)


def test_conv_errors_name_the_op():
    x, w = _rn(1, 3, 5, 5), _rn(4, 2, 3, 3)
    with pytest.raises(sampan.ShapeError, match=r"conv2d: got input \(1, 3, 5, 5\)"):
        sampan.conv2d(x, w)
    with pytest.raises(sampan.ShapeError, match="conv2d.*large enough"):
        sampan.conv2d(_rn(1, 2, 2, 2), w)
    with pytest.raises(sampan.ShapeError, match="conv_transpose2d.*output_padding"):
        sampan.conv_transpose2d(_rn(1, 4, 3, 3), w, stride=2, output_padding=2)
    with pytest.raises(sampan.DTypeError, match="conv2d"):
        sampan.conv2d(sampan.ones(1, 2, 5, 5, dtype="int64"), sampan.ones(4, 2, 3, 3,
                                                                          dtype="int64"))
    with pytest.raises(sampan.ShapeError, match="max_pool2d.*half the kernel"):
        sampan.max_pool2d(_rn(1, 1, 6, 6), 2, padding=2)


def test_zero_batch():
    x = sampan.zeros(0, 3, 5, 5, requires_grad=True)
    w = _rn(2, 3, 3, 3, requires_grad=True)
    y = sampan.conv2d(x, w, padding=1)
    assert y.shape == (0, 2, 5, 5)
    sampan.sum(sampan.max_pool2d(y, 2)).backward()
    assert x.grad.shape == x.shape and float(sampan.sum(sampan.abs(w.grad))) == 0.0


# ---------------------------------------------------------------------- pooling
POOL_CONFIGS = [
    # (H, W, kernel, stride, padding, dilation)
    (6, 6, 2, None, 0, 1),
    (7, 8, 3, 2, 1, 1),
    (9, 7, (3, 2), (2, 1), (1, 0), 1),
    (8, 8, 3, 1, 1, 1),
    (10, 9, 3, 2, 1, (2, 1)),
    (5, 5, 5, 1, 2, 1),
]


@pytest.mark.parametrize("cfg", POOL_CONFIGS)
def test_max_pool2d_vs_torch(cfg):
    h, w, k, s, p, d = cfg
    x = _r(9).permutation(2 * 3 * h * w).reshape(2, 3, h, w) / 7.0   # no ties
    _compare(lambda x: sampan.max_pool2d(x, k, s, p, d),
             lambda x: F.max_pool2d(x, k, s, p, d), [x])


def test_max_pool2d_ties_go_to_first_max_like_torch():
    x = np.ones((1, 1, 4, 4))
    _compare(lambda x: sampan.max_pool2d(x, 3, 1, 1), lambda x: F.max_pool2d(x, 3, 1, 1), [x])


@pytest.mark.parametrize("cfg", [c for c in POOL_CONFIGS if c[5] == 1])
@pytest.mark.parametrize("cip", [True, False])
def test_avg_pool2d_vs_torch(cfg, cip):
    h, w, k, s, p, _ = cfg
    x = _r(10).standard_normal((2, 3, h, w))
    _compare(lambda x: sampan.avg_pool2d(x, k, s, p, count_include_pad=cip),
             lambda x: F.avg_pool2d(x, k, s, p, count_include_pad=cip), [x])


@pytest.mark.parametrize("hw,out", [((8, 8), (4, 2)), ((7, 7), 1), ((7, 5), (3, 2)),
                                    ((5, 9), (None, 4)), ((3, 3), (5, 4)), ((6, 6), 6)])
def test_adaptive_avg_pool2d_vs_torch(hw, out):
    x = _r(11).standard_normal((2, 3) + hw)
    _compare(lambda x: sampan.adaptive_avg_pool2d(x, out),
             lambda x: F.adaptive_avg_pool2d(x, out), [x])


def test_pool_accepts_chw():
    x = _r(12).standard_normal((3, 6, 6))
    _compare(lambda x: sampan.max_pool2d(x, 2), lambda x: F.max_pool2d(x, 2), [x])
    _compare(lambda x: sampan.avg_pool2d(x, 3, 1, 1), lambda x: F.avg_pool2d(x, 3, 1, 1), [x])


def test_pool_gradcheck_and_second_order():
    x = _st(_r(13).permutation(2 * 5 * 5).reshape(1, 2, 5, 5) / 3.0)
    for f in (lambda x: sampan.max_pool2d(x, 3, 2, 1),
              lambda x: sampan.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
              lambda x: sampan.adaptive_avg_pool2d(x, (2, 3))):
        assert gradcheck(f, [x])
        assert gradgradcheck(lambda x, f=f: sampan.tanh(f(x)), [x])


def test_max_pool2d_double_backward_vs_torch():
    a = _r(14).permutation(2 * 6 * 6).reshape(1, 2, 6, 6) / 5.0
    x, tx = _st(a), _tt(a)
    (g,) = sampan.grad(sampan.sum(sampan.max_pool2d(x, 2) ** 2), [x], create_graph=True)
    (tg,) = torch.autograd.grad((F.max_pool2d(tx, 2) ** 2).sum(), [tx], create_graph=True)
    _close(sampan.grad(sampan.sum(g * g), [x])[0], torch.autograd.grad((tg * tg).sum(), tx)[0])


# ---------------------------------------------------------------------- sort / topk
@pytest.mark.parametrize("shape,axis,desc", [((5,), 0, False), ((3, 6), -1, True),
                                             ((4, 3, 2), 0, False), ((2, 7, 3), 1, True)])
def test_sort_vs_torch(shape, axis, desc):
    a = _r(15).standard_normal(shape)
    x, t = _st(a), _tt(a)
    v, i = sampan.sort(x, axis, desc)
    tv, ti = torch.sort(t, dim=axis, descending=desc)
    _close(v, tv)
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    np.testing.assert_array_equal(sampan.argsort(x, axis, desc).numpy(), ti.numpy())
    g = _r(16).standard_normal(shape)
    (gx,) = sampan.grad(v, [x], sampan.tensor(g, dtype="float64"))
    _close(gx, torch.autograd.grad(tv, t, torch.tensor(g))[0])
    assert gradcheck(lambda x: sampan.sort(x, axis, desc)[0], [x])


def test_sort_is_stable_and_nan_is_largest():
    a = np.array([[2, 1, 2, 0, 1, 2]])
    for desc in (False, True):
        v, i = sampan.sort(sampan.tensor(a), -1, desc)
        ti = torch.sort(torch.tensor(a), dim=-1, descending=desc, stable=True).indices
        np.testing.assert_array_equal(i.numpy(), ti.numpy())
    f = np.array([1.0, np.nan, -1.0, 3.0])
    for desc in (False, True):
        v, i = sampan.sort(sampan.tensor(f), descending=desc)
        np.testing.assert_array_equal(i.numpy(),
                                      torch.sort(torch.tensor(f), descending=desc).indices)
    v = sampan.sort(sampan.tensor(f).to("bfloat16"))[0]
    assert v.dtype == sampan.bfloat16 and np.isnan(v.float().numpy()[-1])


@pytest.mark.parametrize("shape,k,axis,largest", [((10,), 3, 0, True), ((4, 9), 4, 1, False),
                                                  ((6, 5), 6, 0, True), ((3, 4), 0, 1, True),
                                                  ((2, 8, 3), 1, 1, False)])
def test_topk_vs_torch(shape, k, axis, largest):
    a = _r(17).standard_normal(shape)
    x, t = _st(a), _tt(a)
    v, i = sampan.topk(x, k, axis, largest)
    tv, ti = torch.topk(t, k, dim=axis, largest=largest)
    _close(v, tv)
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    if k:
        g = _r(18).standard_normal(tv.shape)
        (gx,) = sampan.grad(v, [x], sampan.tensor(g, dtype="float64"))
        _close(gx, torch.autograd.grad(tv, t, torch.tensor(g))[0])
        assert gradcheck(lambda x: sampan.topk(x, k, axis, largest)[0], [x])
        assert gradgradcheck(lambda x: sampan.topk(x, k, axis, largest)[0] ** 2, [x])


def test_topk_integers_and_errors():
    a = np.array([[5, 1, 9, 3], [0, 7, 2, 8]], dtype=np.uint8)
    v, i = sampan.topk(sampan.tensor(a), 2)
    np.testing.assert_array_equal(v.numpy(), [[9, 5], [8, 7]])
    np.testing.assert_array_equal(i.numpy(), [[2, 0], [3, 1]])
    with pytest.raises(sampan.ShapeError, match=r"topk: got k=5 for an axis of length 4"):
        sampan.topk(sampan.tensor(a), 5)


def test_sort_second_order():
    x = _st(_r(19).standard_normal((3, 4)))
    assert gradgradcheck(lambda x: sampan.sort(x, 1, True)[0] ** 2, [x])


def test_all_configs_covered():
    # the samples of every op exercise stride, padding, dilation, groups and a zero batch
    attrs = [s.attrs for s in OPS["conv2d"].samples()]
    for key in ("stride", "padding", "dilation"):
        assert any(a[key] != (1, 1) if key != "padding" else a[key] != (0, 0) for a in attrs)
    assert any(a["groups"] > 1 for a in attrs)
    assert any(s.args[0].shape[0] == 0 for s in OPS["conv2d"].samples())
    assert list(itertools.chain(*[OPS[n].samples() for n in NN_OPS]))
