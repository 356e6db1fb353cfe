"""Issue 17 losses against PyTorch (float64, every reduction): values and the gradients
of every floating input; CTC against torch.nn.functional.ctc_loss."""
import numpy as np
import pytest
import torch

import sampan
from sampan import nn
from sampan.nn import functional as F

from ._ref import close

R = np.random.default_rng(0)


def _sign(*shape):
    return np.where(R.uniform(size=shape) > 0.5, 1.0, -1.0)


def _run(s_fn, t_fn, arrays, diff):
    s_in = [sampan.tensor(a.copy(), requires_grad=i in diff) for i, a in enumerate(arrays)]
    t_in = [torch.tensor(a.copy(), requires_grad=i in diff) for i, a in enumerate(arrays)]
    ys, yt = s_fn(*s_in), t_fn(*t_in)
    close(ys.numpy(), yt, what="loss")
    g = np.random.default_rng(1).standard_normal(tuple(yt.shape))
    ys.backward(sampan.tensor(g))
    yt.backward(torch.tensor(g))
    for i in diff:
        close(s_in[i].grad.numpy(), t_in[i].grad, what=f"grad of input {i}")


def _cases():
    n, d = 6, 5
    x, y = R.standard_normal((n, d)), R.standard_normal((n, d))
    return [
        ("HuberLoss", {"delta": 0.7}, [x, y], (0, 1)),
        ("TripletMarginLoss", {"margin": 0.5}, [x, y, R.standard_normal((n, d))], (0, 1, 2)),
        ("TripletMarginLoss", {"p": 1, "swap": True}, [x, y, R.standard_normal((n, d))],
         (0, 1, 2)),
        ("TripletMarginLoss", {"p": 3}, [x[0], y[0], x[1]], (0, 1, 2)),
        ("MarginRankingLoss", {"margin": 0.3}, [x[:, 0], y[:, 0], _sign(n)], (0, 1)),
        ("CosineEmbeddingLoss", {"margin": 0.2}, [x, y, _sign(n)], (0, 1)),
        ("MultiLabelSoftMarginLoss", {}, [x, (y > 0).astype(float)], (0,)),
        ("PoissonNLLLoss", {}, [x, np.abs(y) * 3], (0,)),
        ("PoissonNLLLoss", {"log_input": False, "full": True}, [np.abs(x) + 0.1,
                                                                np.round(np.abs(y) * 3)], (0,)),
        ("GaussianNLLLoss", {}, [x, y, np.abs(R.standard_normal((n, d))) + 0.05], (0, 1, 2)),
        ("GaussianNLLLoss", {"full": True, "eps": 0.5}, [x, y, np.abs(R.standard_normal(n))],
         (0, 1, 2)),
        ("GaussianNLLLoss", {}, [x, y, np.abs(R.standard_normal((n, 1))) + 0.1], (0, 2)),
        ("HingeEmbeddingLoss", {"margin": 0.8}, [x, _sign(n, d)], (0,)),
        ("SoftMarginLoss", {}, [x, _sign(n, d)], (0,)),
        ("MultiMarginLoss", {}, [x, R.integers(0, d, n)], (0,)),
        ("MultiMarginLoss", {"p": 2, "margin": 0.5}, [x, R.integers(0, d, n)], (0,)),
        ("TripletMarginWithDistanceLoss", {"margin": 0.4, "swap": True},
         [x, y, R.standard_normal((n, d))], (0, 1, 2)),
    ]


CASES = _cases()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("k", range(len(CASES)))
def test_loss_layers_match_torch(k, reduction):
    name, kw, arrays, diff = CASES[k]
    s = getattr(nn, name)(reduction=reduction, **kw)
    t = getattr(torch.nn, name)(reduction=reduction, **kw)
    if name == "MultiMarginLoss":
        arrays = [arrays[0], arrays[1].astype(np.int64)]
    _run(s, t, arrays, diff)


def test_weighted_losses():
    x, y = R.standard_normal((4, 3)), (R.uniform(size=(4, 3)) > 0.5).astype(float)
    w = np.array([0.5, 2.0, 1.0])
    _run(nn.MultiLabelSoftMarginLoss(weight=sampan.tensor(w)),
         torch.nn.MultiLabelSoftMarginLoss(weight=torch.tensor(w)), [x, y], (0,))
    t = R.integers(0, 3, 4)
    _run(nn.MultiMarginLoss(weight=sampan.tensor(w)),
         torch.nn.MultiMarginLoss(weight=torch.tensor(w)), [x, t], (0,))


def test_loss_errors_name_the_op():
    with pytest.raises(sampan.SampanValueError, match="gaussian_nll_loss"):
        F.gaussian_nll_loss(sampan.zeros(2), sampan.zeros(2), sampan.tensor([1.0, -1.0]))
    with pytest.raises(sampan.ShapeError, match="cosine_embedding_loss"):
        F.cosine_embedding_loss(sampan.zeros(2, 3), sampan.zeros(2, 4), sampan.ones(2))
    with pytest.raises(sampan.SampanValueError, match="reduction"):
        nn.HuberLoss(reduction="avg")(sampan.zeros(2), sampan.zeros(2))


# ---------------------------------------------------------------------- CTC
def _ctc_inputs(t=12, n=3, c=5, s=4, seed=0):
    r = np.random.default_rng(seed)
    logits = r.standard_normal((t, n, c))
    tl = np.array([s, s - 1, 2][:n], dtype=np.int64)
    il = np.array([t, t - 2, t - 5][:n], dtype=np.int64)
    tg = r.integers(1, c, (n, s)).astype(np.int64)
    tg[0, 1] = tg[0, 0]       # a repeated label: needs a blank between the two
    return logits, tg, il, tl


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("concat", [False, True])
def test_ctc_matches_torch(reduction, concat):
    logits, tg, il, tl = _ctc_inputs()
    zs = sampan.tensor(logits, requires_grad=True)
    zt = torch.tensor(logits, requires_grad=True)
    if concat:
        flat = np.concatenate([tg[i, :tl[i]] for i in range(len(tl))])
        s_tg, t_tg = sampan.tensor(flat), torch.tensor(flat)
    else:
        s_tg, t_tg = sampan.tensor(tg), torch.tensor(tg)
    ls = nn.CTCLoss(reduction=reduction)(F.log_softmax(zs, -1), s_tg, sampan.tensor(il),
                                         list(tl))
    lt = torch.nn.CTCLoss(reduction=reduction)(zt.log_softmax(-1), t_tg, torch.tensor(il),
                                               torch.tensor(tl))
    close(ls.numpy(), lt, what="ctc loss")
    g = np.random.default_rng(2).standard_normal(tuple(lt.shape))
    ls.backward(sampan.tensor(g))
    lt.backward(torch.tensor(g))
    close(zs.grad.numpy(), zt.grad, what="logits grad")


def test_ctc_float32_blank_and_unbatched():
    logits, tg, il, tl = _ctc_inputs(seed=3)
    tg = np.where(tg == 2, 0, tg)    # blank=2: keep it out of the targets
    lp = torch.tensor(logits, dtype=torch.float32).log_softmax(-1)
    s = F.ctc_loss(sampan.tensor(lp.numpy()), sampan.tensor(tg), il, tl, blank=2)
    t = torch.nn.functional.ctc_loss(lp, torch.tensor(tg), torch.tensor(il),
                                     torch.tensor(tl), blank=2)
    assert s.dtype == sampan.float32
    np.testing.assert_allclose(s.numpy(), t.numpy(), rtol=1e-5)
    one = F.ctc_loss(sampan.tensor(lp.numpy()[:, 0]), sampan.tensor(tg[0]), 12, 4, blank=2,
                     reduction="none")
    ref = torch.nn.functional.ctc_loss(lp[:, 0], torch.tensor(tg[0]), torch.tensor(12),
                                       torch.tensor(4), blank=2, reduction="none")
    assert one.shape == ()
    np.testing.assert_allclose(one.numpy(), ref.numpy(), rtol=1e-5)


def test_ctc_zero_infinity_and_bad_lengths():
    # 4 frames cannot emit 3 labels of which two repeat (needs 4 + 1 blank)
    lp = torch.randn(4, 1, 3, dtype=torch.float64).log_softmax(-1)
    tg = np.array([[1, 1, 2]])
    for zi in (False, True):
        x = sampan.tensor(lp.numpy(), requires_grad=True)
        s = F.ctc_loss(x, sampan.tensor(tg), [4], [3], reduction="sum", zero_infinity=zi)
        t = torch.nn.functional.ctc_loss(lp, torch.tensor(tg), torch.tensor([4]),
                                         torch.tensor([3]), reduction="sum", zero_infinity=zi)
        assert float(s.numpy()) == float(t.numpy())
        s.backward()
        assert np.isfinite(x.grad.numpy()).all()
    with pytest.raises(sampan.SampanValueError, match="ctc_loss.*input_lengths"):
        F.ctc_loss(sampan.tensor(lp.numpy()), sampan.tensor(tg), [5], [3])
    with pytest.raises(sampan.SampanValueError, match="ctc_loss.*target_lengths"):
        F.ctc_loss(sampan.tensor(lp.numpy()), sampan.tensor(tg), [4], [4])
    with pytest.raises(sampan.SampanValueError, match="ctc_loss.*labels"):
        F.ctc_loss(sampan.tensor(lp.numpy()), sampan.tensor([[1, 7, 2]]), [4], [3])
