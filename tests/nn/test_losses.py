"""Every loss with every option against torch.nn.functional (float64, rel 1e-10), with
gradients of the input (and of the target where PyTorch defines one)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import sampan
from sampan.nn import functional as F

from ._ref import close

RED = ["none", "mean", "sum"]


def _run(sfn, tfn, arrays, diff, skw=None, tkw=None):
    """Compare forward and the gradients of the inputs flagged in `diff`."""
    skw, tkw = skw or {}, tkw or {}
    s_in = [sampan.tensor(a, requires_grad=d) for a, d in zip(arrays, diff)]
    t_in = [torch.tensor(a, requires_grad=d) for a, d in zip(arrays, diff)]
    s_out, t_out = sfn(*s_in, **skw), tfn(*t_in, **tkw)
    close(s_out.numpy(), t_out, "float64", "forward")
    g = np.random.default_rng(0).standard_normal(t_out.shape)
    s_out.backward(sampan.tensor(g))
    t_out.backward(torch.tensor(g))
    for i, (a, b, d) in enumerate(zip(s_in, t_in, diff)):
        if d:
            close(a.grad.numpy(), b.grad, "float64", f"grad {i}")


R = np.random.default_rng(1)
LOGITS = R.standard_normal((6, 5)) * 2
LOGITS_ND = R.standard_normal((3, 5, 4, 2))
LABELS = np.array([0, 4, 2, 2, 1, 3])
LABELS_ND = R.integers(0, 5, (3, 4, 2))
PROBS = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)
WEIGHT = np.array([0.5, 1.0, 2.0, 1.5, 0.2])


@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("weight", [None, WEIGHT])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy_indices(reduction, weight, smoothing, ignore):
    labels = LABELS.copy()
    labels_nd = LABELS_ND.copy()
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    if ignore:
        labels[[1, 3]] = -1
        labels_nd[0, 1] = -1
        kw["ignore_index"] = -1
    skw = dict(kw, weight=None if weight is None else sampan.tensor(weight))
    tkw = dict(kw, weight=None if weight is None else torch.tensor(weight))
    _run(F.cross_entropy, TF.cross_entropy, [LOGITS, labels], [True, False], skw, tkw)
    _run(F.cross_entropy, TF.cross_entropy, [LOGITS_ND, labels_nd], [True, False], skw, tkw)


@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("weight", [None, WEIGHT])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_probabilities(reduction, weight, smoothing):
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    skw = dict(kw, weight=None if weight is None else sampan.tensor(weight))
    tkw = dict(kw, weight=None if weight is None else torch.tensor(weight))
    _run(F.cross_entropy, TF.cross_entropy, [LOGITS, PROBS], [True, True], skw, tkw)
    p_nd = np.exp(LOGITS_ND) / np.exp(LOGITS_ND).sum(1, keepdims=True)
    _run(F.cross_entropy, TF.cross_entropy, [LOGITS_ND, p_nd], [True, False], skw, tkw)


def test_cross_entropy_unbatched_and_errors():
    _run(F.cross_entropy, TF.cross_entropy, [LOGITS[0], np.array(3)], [True, False])
    with pytest.raises(sampan.SampanValueError, match="cross_entropy: got target value 7"):
        F.cross_entropy(sampan.tensor(LOGITS), sampan.tensor([7, 0, 0, 0, 0, 0]))
    with pytest.raises(sampan.ShapeError, match="cross_entropy.*expected a target of shape"):
        F.cross_entropy(sampan.tensor(LOGITS), sampan.tensor([1, 2]))
    with pytest.raises(sampan.SampanValueError, match="reduction='avg'"):
        F.cross_entropy(sampan.tensor(LOGITS), sampan.tensor(LABELS), reduction="avg")


@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("weight", [None, WEIGHT])
def test_nll_loss(reduction, weight):
    lsm = LOGITS - np.log(np.exp(LOGITS).sum(1, keepdims=True))
    labels = LABELS.copy()
    labels[2] = -100
    skw = dict(reduction=reduction, weight=None if weight is None else sampan.tensor(weight))
    tkw = dict(reduction=reduction, weight=None if weight is None else torch.tensor(weight))
    _run(F.nll_loss, TF.nll_loss, [lsm, labels], [True, False], skw, tkw)
    _run(F.nll_loss, TF.nll_loss, [LOGITS_ND, LABELS_ND], [True, False], skw, tkw)


@pytest.mark.parametrize("reduction", RED)
def test_regression_losses(reduction):
    a, b = R.standard_normal((4, 5)) * 2, R.standard_normal((4, 5))
    kw = dict(reduction=reduction)
    _run(F.mse_loss, TF.mse_loss, [a, b], [True, True], kw, kw)
    _run(F.l1_loss, TF.l1_loss, [a, b], [True, True], kw, kw)
    for beta in (1.0, 0.5, 0.0):
        _run(F.smooth_l1_loss, TF.smooth_l1_loss, [a, b], [True, True], dict(kw, beta=beta),
             dict(kw, beta=beta))
    _run(F.huber_loss, TF.huber_loss, [a, b], [True, True], dict(kw, delta=0.7),
         dict(kw, delta=0.7))
    with pytest.raises(sampan.ShapeError, match="mse_loss: got input \\(4, 5\\)"):
        F.mse_loss(sampan.tensor(a), sampan.tensor(b[:2]))


@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy(reduction, weighted):
    p = R.uniform(0.05, 0.95, (4, 3))
    y = R.uniform(0, 1, (4, 3))
    w = R.uniform(0.5, 2, (4, 3))
    skw = dict(reduction=reduction, weight=sampan.tensor(w) if weighted else None)
    tkw = dict(reduction=reduction, weight=torch.tensor(w) if weighted else None)
    _run(F.binary_cross_entropy, TF.binary_cross_entropy, [p, y], [True, True], skw, tkw)
    with pytest.raises(sampan.SampanValueError, match="binary_cross_entropy.*probabilities"):
        F.binary_cross_entropy(sampan.tensor([2.0]), sampan.tensor([1.0]))


@pytest.mark.parametrize("reduction", RED)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("pos", [False, True])
def test_bce_with_logits(reduction, weighted, pos):
    x = R.standard_normal((4, 3)) * 3
    x[0, 0], x[1, 1] = 200.0, -200.0  # stability: no overflow, finite grads
    y = (R.uniform(0, 1, (4, 3)) > 0.5).astype(np.float64)
    w = R.uniform(0.5, 2, (3,))
    pw = R.uniform(0.5, 3, (3,))
    skw = dict(reduction=reduction, weight=sampan.tensor(w) if weighted else None,
               pos_weight=sampan.tensor(pw) if pos else None)
    tkw = dict(reduction=reduction, weight=torch.tensor(w) if weighted else None,
               pos_weight=torch.tensor(pw) if pos else None)
    _run(F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits, [x, y],
         [True, True], skw, tkw)


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")
@pytest.mark.parametrize("reduction", RED + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    inp = np.log(PROBS)
    target = np.exp(LOGITS[::-1]) / np.exp(LOGITS[::-1]).sum(1, keepdims=True)
    target[0, 0] = 0.0  # 0 * log 0 = 0
    if log_target:
        target = np.log(target + 1e-3)
    kw = dict(reduction=reduction, log_target=log_target)
    _run(F.kl_div, TF.kl_div, [inp, target], [True, False], kw, kw)


def test_loss_layers():
    from sampan import nn
    x, y = sampan.tensor(LOGITS), sampan.tensor(LABELS)
    close(nn.CrossEntropyLoss(label_smoothing=0.1)(x, y).numpy(),
          TF.cross_entropy(torch.tensor(LOGITS), torch.tensor(LABELS), label_smoothing=0.1))
    close(nn.NLLLoss(reduction="sum")(x, y).numpy(),
          TF.nll_loss(torch.tensor(LOGITS), torch.tensor(LABELS), reduction="sum"))
    assert "reduction='mean'" in repr(nn.MSELoss())
