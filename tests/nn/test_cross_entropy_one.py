"""One cross_entropy: `sampan.cross_entropy` is `sampan.nn.functional.cross_entropy`, with
PyTorch's convention (classes on dim 1). The top-level one took classes on the last axis,
so on an (N, C, L) input the two silently gave different losses."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import sampan
import sampan.nn.functional as F

R = np.random.default_rng(7)
X3 = R.standard_normal((2, 5, 4))               # (N, C, L): classes on dim 1
T3 = R.integers(0, 5, (2, 4))
T3[1, 2] = -100
X4 = R.standard_normal((2, 3, 2, 3))            # (N, C, H, W)
T4 = R.integers(0, 3, (2, 2, 3))
W5 = R.uniform(0.5, 2.0, 5)


def test_one_function():
    assert sampan.cross_entropy is F.cross_entropy
    assert sampan.nn.CrossEntropyLoss()(sampan.tensor(X3), sampan.tensor(T3)).item() == \
        pytest.approx(TF.cross_entropy(torch.tensor(X3), torch.tensor(T3)).item(), rel=1e-12)


def _both(x, t, w=None, **kw):
    """Loss and input gradient from sampan and from torch (float64)."""
    xs = sampan.tensor(x, requires_grad=True)
    ls = sampan.cross_entropy(xs, sampan.tensor(t), None if w is None else sampan.tensor(w),
                              **kw)
    xt = torch.tensor(x, requires_grad=True)
    lt = TF.cross_entropy(xt, torch.tensor(t), None if w is None else torch.tensor(w), **kw)
    cot = R.standard_normal(tuple(lt.shape))
    ls.backward(sampan.tensor(cot))
    lt.backward(torch.tensor(cot))
    return ls.numpy(), lt.detach().numpy(), xs.grad.numpy(), xt.grad.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
def test_nd_class_indices_match_torch(reduction, weighted, smoothing):
    a, b, ga, gb = _both(X3, T3, W5 if weighted else None, reduction=reduction,
                         label_smoothing=smoothing)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ga, gb, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_4d_and_probabilities_match_torch(reduction):
    a, b, ga, gb = _both(X4, T4, reduction=reduction)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ga, gb, rtol=1e-10, atol=1e-12)
    p = np.exp(X3) / np.exp(X3).sum(1, keepdims=True)
    a, b, ga, gb = _both(X3 * 0.5, p, W5, reduction=reduction, label_smoothing=0.1)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ga, gb, rtol=1e-10, atol=1e-12)


def test_unbatched_and_2d_unchanged():
    a, b, ga, gb = _both(X3[0, :, 0], np.array(2))
    np.testing.assert_allclose(a, b, rtol=1e-12)
    a, b, ga, gb = _both(X3[:, :, 0], T3[:, 0], ignore_index=1)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(ga, gb, rtol=1e-10, atol=1e-12)


def _ops_on_tape(y):
    seen, stack, ops = set(), [y._node], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        ops.add(n.op.name)
        stack.extend(getattr(t, "_node", None) for t in n.inputs)
    return ops


@pytest.mark.parametrize("x,t", [(X3[:, :, 0], T3[:, 0]), (X3, T3)])
def test_index_targets_run_as_the_row_op(x, t):
    # the fast (N, C) row kernel stays the implementation: for (N, C, L) over the rows of
    # the classes-last view
    y = sampan.cross_entropy(sampan.tensor(x.astype(np.float32), requires_grad=True),
                             sampan.tensor(t))
    assert "softmax_cross_entropy" in _ops_on_tape(y)


def test_errors_name_the_function_and_the_line():
    with pytest.raises(sampan.ShapeError, match=r"cross_entropy.*target of shape \(2, 4\)"
                                                r"[\s\S]*test_cross_entropy_one\.py"):
        sampan.cross_entropy(sampan.tensor(X3), sampan.tensor(T3[:, :3]))
    with pytest.raises(sampan.SampanValueError, match=r"cross_entropy: got target value 5"):
        sampan.cross_entropy(sampan.tensor(X3), sampan.tensor(np.full((2, 4), 5)))
    with pytest.raises(sampan.ShapeError, match="cross_entropy"):
        sampan.cross_entropy(sampan.tensor(1.0), sampan.tensor(0))


def test_under_jit_matches_eager():
    x = sampan.tensor(X3.astype(np.float32))
    t = sampan.tensor(T3)

    @sampan.jit
    def f(x, t):
        return sampan.cross_entropy(x, t)
    np.testing.assert_allclose(f(x, t).numpy(), sampan.cross_entropy(x, t).numpy(), rtol=1e-5)
