"""Loss layers: each holds its options and calls the function of the same name in
`sampan.nn.functional`."""
from __future__ import annotations

from . import functional as F
from .layer import Layer


class _Loss(Layer):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def extra_repr(self):
        return f"reduction={self.reduction!r}"


class CrossEntropyLoss(_Loss):
    """Softmax cross-entropy (see `F.cross_entropy`).

    Example: ``nn.CrossEntropyLoss(label_smoothing=0.1)(logits, labels)``"""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__(reduction)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
        if weight is not None:
            self.register_buffer("weight", weight)
        else:
            self.weight = None

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction,
                               self.label_smoothing)


class NLLLoss(_Loss):
    """Negative log-likelihood from log-probabilities (see `F.nll_loss`).

    Example: ``nn.NLLLoss()(F.log_softmax(logits, 1), labels)``"""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__(reduction)
        self.ignore_index = ignore_index
        if weight is not None:
            self.register_buffer("weight", weight)
        else:
            self.weight = None

    def forward(self, input, target):
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(_Loss):
    """Mean squared error. Example: ``nn.MSELoss()(pred, y)``."""

    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
    """Mean absolute error. Example: ``nn.L1Loss()(pred, y)``."""

    def forward(self, input, target):
        return F.l1_loss(input, target, self.reduction)


class SmoothL1Loss(_Loss):
    """Smooth L1 (see `F.smooth_l1_loss`). Example: ``nn.SmoothL1Loss(beta=0.5)``."""

    def __init__(self, reduction="mean", beta=1.0):
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class BCELoss(_Loss):
    """Binary cross-entropy from probabilities. Example: ``nn.BCELoss()(p, y)``."""

    def __init__(self, weight=None, reduction="mean"):
        super().__init__(reduction)
        self.weight = weight

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, self.weight, self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross-entropy from logits, stable; optional `pos_weight`.

    Example: ``nn.BCEWithLogitsLoss(pos_weight=sampan.tensor([2.0]))(z, y)``"""

    def __init__(self, weight=None, reduction="mean", pos_weight=None):
        super().__init__(reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction,
                                                  self.pos_weight)


class KLDivLoss(_Loss):
    """KL divergence from log-probabilities (see `F.kl_div`).

    Example: ``nn.KLDivLoss(reduction="batchmean")(F.log_softmax(z, -1), p)``"""

    def __init__(self, reduction="mean", log_target=False):
        super().__init__(reduction)
        self.log_target = log_target

    def forward(self, input, target):
        return F.kl_div(input, target, self.reduction, self.log_target)


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "BCELoss", "BCEWithLogitsLoss", "KLDivLoss"]
