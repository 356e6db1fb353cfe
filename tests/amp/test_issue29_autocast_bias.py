"""Issue 29 item 19: under autocast, a convolution with a bias (conv1d/2d/3d and the
transposed ones) computes in the autocast dtype, as PyTorch (where the bias is an input of the op) and sampan's own linear: the bias
joins the op under the op table's policy (the "lower" op's own input casts) instead of
promoting the result back to float32. Eager and jit agree."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan.amp import autocast

F = sampan.nn.functional


def _data():
    r = np.random.default_rng(0)
    f = lambda *s: r.standard_normal(s).astype(np.float32)    # noqa: E731
    return {
        "conv1d": ((f(2, 3, 9), f(4, 3, 3), f(4)), {"padding": 1}),
        "conv2d": ((f(1, 2, 6, 6), f(3, 2, 3, 3), f(3)), {"stride": 2}),
        "conv_transpose2d": ((f(1, 3, 4, 4), f(3, 2, 3, 3), f(2)), {"stride": 2}),
        "linear": ((f(4, 5), f(5, 3), f(3)), {}),
        "conv3d": ((f(1, 2, 4, 4, 4), f(3, 2, 3, 3, 3), f(3)), {}),
        "conv_transpose1d": ((f(1, 4, 5), f(4, 2, 3), f(2)), {"stride": 2}),
    }


def _ours(name, x, w, b, kw):
    return getattr(F, name)(x, w, b, **kw)


def _theirs(torch, name, x, w, b, kw):
    tF = torch.nn.functional
    if name == "linear":
        return tF.linear(x, w.T, b)
    return getattr(tF, name)(x, w, b, **kw)


@pytest.mark.parametrize("name", sorted(_data()))
def test_bias_op_dtype_and_values_match_torch_autocast(name):
    torch = pytest.importorskip("torch")
    (x, w, b), kw = _data()[name]
    with autocast(sampan.bfloat16):
        y = _ours(name, *(sampan.tensor(a) for a in (x, w, b)), kw)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t = _theirs(torch, name, *(torch.tensor(a) for a in (x, w, b)), kw)
    assert t.dtype == torch.bfloat16
    assert y.dtype == sampan.bfloat16, f"{name} with a bias under autocast: {y.dtype}"
    np.testing.assert_allclose(np.asarray(y.numpy(), np.float32), t.float().numpy(),
                               rtol=3e-2, atol=5e-2)


@pytest.mark.parametrize("name", sorted(_data()))
def test_bias_op_eager_and_jit_agree_and_grads_reach_float32(name):
    (x, w, b), kw = _data()[name]

    def f(x, w, b):
        with autocast(sampan.bfloat16):
            return _ours(name, x, w, b, kw)
    ins = [sampan.tensor(a, requires_grad=True) for a in (x, w, b)]
    eager = f(*ins)
    jitted = sampan.jit(f)(*(sampan.tensor(a) for a in (x, w, b)))
    assert eager.dtype == jitted.dtype == sampan.bfloat16
    np.testing.assert_array_equal(np.asarray(jitted.numpy(), np.float32),
                                  np.asarray(eager.numpy(), np.float32))
    gs = sampan.grad(eager.float().sum(), ins)
    assert [g.dtype for g in gs] == [np.float32] * 3


def test_outside_autocast_a_float32_bias_still_promotes():
    (x, w, b), kw = _data()["conv2d"]
    lo = lambda a: sampan.tensor(a).to(sampan.bfloat16)         # noqa: E731
    y = F.conv2d(lo(x), lo(w), sampan.tensor(b), **kw)           # no autocast: promotion
    assert y.dtype == np.float32
    with autocast(sampan.bfloat16, enabled=False):
        assert F.conv2d(*(sampan.tensor(a) for a in (x, w, b)), **kw).dtype == np.float32
