"""Import handlers for ONNX's losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss
(opsets 12 on), over (N, C) or (N, C, d1, ..., dk) inputs with class weights,
`ignore_index` (any value, negative or past the class count) and the three reductions.

Both are built from sampan ops (log_softmax, take_along_dim, where, sum), so an imported
training graph differentiates. A target equal to `ignore_index` contributes zero loss and
zero weight; with `mean` the loss is divided by the sum of the gathered weights (the
number of targets not ignored when there is no weight), as the spec and PyTorch do.
"""
from __future__ import annotations

import sampan

from . import onnx_op

_REDUCTIONS = ("none", "sum", "mean")


def _nll(ctx, node, logp, target, weight):
    """The loss of log-probabilities `logp` (N, C, d...) against class ids `target`."""
    reduction = node.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise ctx.error(f"reduction {reduction!r} is not one of {', '.join(_REDUCTIONS)}")
    ii = node.attr("ignore_index")
    if logp.ndim < 2:
        raise ctx.error(f"input has shape {list(logp.shape)}; expected (N, C) or "
                        "(N, C, d1, ..., dk)")
    want = [logp.shape[0]] + list(logp.shape[2:])
    if list(target.shape) != want:
        raise ctx.error(f"target has shape {list(target.shape)}; expected {want} (input "
                        f"{list(logp.shape)} without its class axis)")
    if target.dtype.kind not in "iu":
        raise ctx.error(f"target is {target.dtype}; expected int32 or int64 class ids")
    c = logp.shape[1]
    keep = None
    idx = target
    if ii is not None:
        keep = target != int(ii)
        # an ignored target may be any value, out of range too: gather class 0 instead
        idx = sampan.where(keep, target, sampan.zeros_like(target))
    picked = sampan.squeeze(sampan.take_along_dim(logp, sampan.unsqueeze(idx, 1), dim=1), 1)
    loss = -picked
    w = None
    if weight is not None:
        if list(weight.shape) != [c]:
            raise ctx.error(f"weight has shape {list(weight.shape)}; expected [{c}] (one "
                            "per class)")
        w = sampan.reshape(sampan.index_select(weight, 0, sampan.reshape(idx, -1)),
                           *idx.shape)
        if w.dtype != loss.dtype:
            w = sampan.cast(w, loss.dtype)
    if keep is not None:
        k = sampan.cast(keep, loss.dtype)
        w = k if w is None else w * k
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return sampan.sum(loss)
    if w is None:
        return sampan.mean(loss)
    return sampan.sum(loss) / sampan.sum(w)


@onnx_op("NegativeLogLikelihoodLoss", since=12)
def nll_loss(ctx, node, x, target, weight=None):
    return _nll(ctx, node, x, target, weight)


@onnx_op("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(ctx, node, x, target, weight=None):
    if x.ndim < 2:
        raise ctx.error(f"scores have shape {list(x.shape)}; expected (N, C) or "
                        "(N, C, d1, ..., dk)")
    logp = sampan.log_softmax(x, dim=1)
    loss = _nll(ctx, node, logp, target, weight)
    return (loss, logp) if node.n_outputs > 1 else loss
