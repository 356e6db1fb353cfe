"""(issue 17) Primitive ops of `sampan.nn` that no composite writes well: the CTC loss.

`ctc_loss` takes log-probabilities (T, N, C), padded targets (N, S) and the lengths
(N,) and returns each sample's negative log-likelihood (N,). The forward (alpha) and
backward (beta) recursions run in log space over the extended label sequence (a blank
between labels and at both ends). Its gradient is ``-g * posterior`` where
`ctc_loss_posterior` (T, N, C) is the probability that frame t emits class c on a
valid alignment: the true derivative for any input. (PyTorch's kernel returns
``exp(log_probs) - posterior``, the gradient with respect to the logits under a
log_softmax; through a log_softmax both give the same logits gradient.)
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanValueError, ShapeError, op_error
from ._util import Sample, rng
from .registry import NO_ONNX, Spec, defop

EXPORTS: list = []
METHODS: dict = {}
INPLACE: dict = {}

_NEG_INF = -np.inf


def _ctc_rule(log_probs, targets, input_lengths, target_lengths, blank=0):
    op = "ctc_loss"
    if len(log_probs.shape) != 3 or not _dt.is_floating(log_probs.dtype):
        raise op_error(ShapeError, op, f"log_probs {log_probs!r}"
                       if not hasattr(log_probs, "ndim") else
                       f"log_probs of shape {tuple(log_probs.shape)}, {log_probs.dtype}",
                       "floating log_probs of shape (T, N, C)")
    t, n, c = log_probs.shape
    if len(targets.shape) != 2 or not _dt.is_integer(targets.dtype):
        raise op_error(ShapeError, op, f"targets of shape {tuple(targets.shape)}, "
                       f"{targets.dtype}", "integer targets of shape (N, S)")
    for name, v in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if tuple(v.shape) != (n,) or not _dt.is_integer(v.dtype):
            raise op_error(ShapeError, op, f"{name} of shape {tuple(v.shape)}, {v.dtype}",
                           f"integer {name} of shape ({n},), one per sample")
    if isinstance(n, int) and isinstance(targets.shape[0], int) and targets.shape[0] != n:
        raise op_error(ShapeError, op, f"targets of shape {tuple(targets.shape)} for "
                       f"log_probs {tuple(log_probs.shape)}", f"targets of shape ({n}, S)")
    if isinstance(c, int) and not 0 <= blank < c:
        raise op_error(SampanValueError, op, f"blank={blank} with {c} classes",
                       f"blank in [0, {c})")
    return Spec((n,), log_probs.dtype)


def _check_values(lp, tg, il, tl, blank):
    """The kernels index with these: check them first (a bad length read out of bounds)."""
    op = "ctc_loss"
    t, _, c = lp.shape
    s = tg.shape[1]
    if il.size and (il.min() < 0 or il.max() > t):
        raise op_error(SampanValueError, op, f"input_lengths in [{il.min()}, {il.max()}]",
                       f"lengths in [0, {t}] (T = {t} frames)")
    if tl.size and (tl.min() < 0 or tl.max() > s):
        raise op_error(SampanValueError, op, f"target_lengths in [{tl.min()}, {tl.max()}]",
                       f"lengths in [0, {s}] (targets padded to {s})")
    for i in range(tg.shape[0]):
        row = tg[i, :tl[i]]
        if row.size and (row.min() < 0 or row.max() >= c or (row == blank).any()):
            raise op_error(SampanValueError, op, f"target labels of sample {i}: "
                           f"{row.tolist()}", f"labels in [0, {c}) other than blank={blank}")


def _ext_labels(tg, tl, blank):
    n, s = tg.shape
    ext = np.full((n, 2 * s + 1), blank, dtype=np.int64)
    ext[:, 1::2] = tg
    # s-2 skip allowed where the label is not blank and differs from the one two back
    skip = np.zeros(ext.shape, dtype=bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    valid = np.arange(2 * s + 1)[None, :] < (2 * tl[:, None] + 1)
    return ext, skip, valid


def _lse(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = np.logaddexp(out, x)
    return out


def _alpha_beta(lp, tg, il, tl, blank):
    """log alpha and log beta (T, N, L) in float64, the extended labels and the nll."""
    lp = lp.astype(np.float64)
    t_max, n, _ = lp.shape
    ext, skip, valid = _ext_labels(tg, tl, blank)
    big_l = ext.shape[1]
    rows = np.arange(n)[:, None]
    lpe = lp[:, rows, ext] if t_max else np.zeros((0, n, big_l))   # (T, N, L)
    lpe = np.where(valid[None], lpe, _NEG_INF)
    alpha = np.full((t_max, n, big_l), _NEG_INF)
    beta = np.full((t_max, n, big_l), _NEG_INF)
    neg = np.full((n, 1), _NEG_INF)
    with np.errstate(invalid="ignore", divide="ignore"):
        if t_max:
            a0 = np.full((n, big_l), _NEG_INF)
            a0[:, 0] = lpe[0, :, 0]
            if big_l > 1:
                a0[:, 1] = np.where(tl > 0, lpe[0, :, 1], _NEG_INF)
            alpha[0] = a0
        for t in range(1, t_max):
            a = alpha[t - 1]
            s1 = np.concatenate([neg, a[:, :-1]], 1)
            s2 = np.concatenate([neg, neg, a[:, :-2]], 1)[:, :big_l]
            alpha[t] = _lse(a, s1, np.where(skip, s2, _NEG_INF)) + lpe[t]
        end = 2 * tl
        last = np.clip(il - 1, 0, None)
        lp_end = np.full(n, _NEG_INF)
        if t_max:
            a_last = alpha[last, np.arange(n)]                    # (N, L)
            lp_end = _lse(a_last[np.arange(n), end],
                          np.where(tl > 0, a_last[np.arange(n), np.maximum(end - 1, 0)],
                                   _NEG_INF))
        nll = np.where(il > 0, -lp_end, np.where(tl == 0, 0.0, np.inf))
        skip_next = np.zeros(skip.shape, dtype=bool)
        skip_next[:, :-2] = skip[:, 2:]
        for t in range(t_max - 1, -1, -1):
            init = np.full((n, big_l), _NEG_INF)
            init[np.arange(n), end] = lpe[t, np.arange(n), end]
            init[np.arange(n), np.maximum(end - 1, 0)] = np.where(
                tl > 0, lpe[t, np.arange(n), np.maximum(end - 1, 0)],
                init[np.arange(n), np.maximum(end - 1, 0)])
            if t + 1 < t_max:
                b = beta[t + 1]
                s1 = np.concatenate([b[:, 1:], neg], 1)
                s2 = np.concatenate([b[:, 2:], neg, neg], 1)[:, :big_l]
                rec = _lse(b, s1, np.where(skip_next, s2, _NEG_INF)) + lpe[t]
            else:
                rec = init
            here = (t == il - 1)[:, None]
            inside = (t < il - 1)[:, None]
            beta[t] = np.where(here, init, np.where(inside, rec, _NEG_INF))
    return alpha, beta, ext, lpe, nll


def _ctc_kernel(lp, tg, il, tl, blank=0):
    _check_values(lp, tg, il, tl, blank)
    nll = _alpha_beta(lp, tg, il, tl, blank)[-1]
    return nll.astype(lp.dtype)


def _posterior_kernel(lp, tg, il, tl, blank=0):
    _check_values(lp, tg, il, tl, blank)
    alpha, beta, ext, lpe, nll = _alpha_beta(lp, tg, il, tl, blank)
    t_max, n, c = lp.shape
    out = np.zeros((t_max, n, c))
    if t_max == 0 or n == 0:
        return out.astype(lp.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        # alpha and beta both count frame t's emission: divide it out once
        logp = alpha + beta - lpe + nll[None, :, None]
        p = np.where(np.isfinite(logp) & np.isfinite(nll)[None, :, None], np.exp(logp), 0.0)
    tt, nn, ss = np.nonzero(p)
    np.add.at(out, (tt, nn, ext[nn, ss]), p[tt, nn, ss])
    return out.astype(lp.dtype)


def _ctc_grad(g, y, lp, tg, il, tl, blank=0):
    from .elementwise import mul, neg
    from .shape import unsqueeze
    post = ctc_loss_posterior(lp, tg, il, tl, blank)
    return (mul(neg(post), unsqueeze(unsqueeze(g, 0), -1)), None, None, None)


def _ctc_flops(lp, tg, il, tl, blank=0):
    t, n, _ = lp.shape
    s = tg.shape[1]
    total = 1
    for d in (t, n, 2 * s + 1):
        total *= d if isinstance(d, int) else 1
    return 12 * total


def _ctc_samples():
    r = rng(170)
    x = r.standard_normal((6, 2, 4))
    lp = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
    tg = np.array([[1, 2, 2], [3, 1, 0]], dtype=np.int64)
    il = np.array([6, 5], dtype=np.int64)
    tl = np.array([3, 2], dtype=np.int64)
    raw = r.uniform(-2, 2, (5, 2, 3)).astype(np.float32)   # not normalised
    tg2 = np.array([[1, 1], [2, 0]], dtype=np.int64)
    return [Sample((lp, tg, il, tl), {"blank": 0}, diff=(0,)),
            Sample((raw, tg2, np.array([5, 4]), np.array([2, 1])), {"blank": 0}, diff=(0,))]


def _posterior_grad(g, y, lp, tg, il, tl, blank=0):
    # the posterior's derivative (the covariance of the alignment indicators) is not
    # written; raising beats the silent 0 of a non-differentiable op (a wrong second
    # derivative of ctc_loss). PyTorch raises here too.
    from ..errors import AutogradError
    raise op_error(AutogradError, "ctc_loss", "a second derivative (double backward "
                   "through ctc_loss's gradient)", "first derivatives only",
                   "the derivative of the CTC posterior is not implemented")


CTC_LOSS = defop("ctc_loss", _ctc_rule, kernel=_ctc_kernel, grad=_ctc_grad,
                 nondiff_inputs=(1, 2, 3), flops=_ctc_flops, onnx=NO_ONNX,
                 samples=_ctc_samples, amp="float32")
CTC_LOSS_POSTERIOR = defop(
    "ctc_loss_posterior",
    lambda lp, tg, il, tl, blank=0: (_ctc_rule(lp, tg, il, tl, blank),
                                     Spec(tuple(lp.shape), lp.dtype))[1],
    kernel=_posterior_kernel, grad=_posterior_grad, nondiff_inputs=(1, 2, 3),
    flops=_ctc_flops, onnx=NO_ONNX,
    samples=lambda: [Sample(s.args, s.attrs, diff=()) for s in _ctc_samples()])


def ctc_loss_posterior(log_probs, targets, input_lengths, target_lengths, blank=0):
    """(T, N, C) probability that frame t emits class c on a valid alignment."""
    from ..tensor import apply
    return apply(CTC_LOSS_POSTERIOR, (log_probs, targets, input_lengths, target_lengths),
                 {"blank": int(blank)})


def ctc_nll(log_probs, targets, input_lengths, target_lengths, blank=0):
    """Per-sample CTC negative log-likelihood (N,) of padded targets (N, S)."""
    from ..tensor import apply
    for t, what in ((targets, "targets"), (input_lengths, "input_lengths"),
                    (target_lengths, "target_lengths")):
        if not _dt.is_integer(t.dtype):
            raise op_error(DTypeError, "ctc_loss", f"{what} of dtype {t.dtype}",
                           f"integer {what}")
    return apply(CTC_LOSS, (log_probs, targets, input_lengths, target_lengths),
                 {"blank": int(blank)})
