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


class HuberLoss(_Loss):
    """0.5 d^2 where |d| < delta, else delta (|d| - delta / 2). Example:
    ``nn.HuberLoss(delta=0.5)``."""

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction)
        self.delta = delta

    def forward(self, input, target):
        return F.huber_loss(input, target, self.reduction, self.delta)


class CTCLoss(_Loss):
    """Connectionist temporal classification (see `F.ctc_loss`). Example:
    ``nn.CTCLoss(blank=0, zero_infinity=True)(log_probs, targets, in_lens, tgt_lens)``."""

    def __init__(self, blank=0, reduction="mean", zero_infinity=False):
        super().__init__(reduction)
        self.blank, self.zero_infinity = blank, zero_infinity

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank,
                          self.reduction, self.zero_infinity)


class TripletMarginLoss(_Loss):
    """max(d(a, p) - d(a, n) + margin, 0) (see `F.triplet_margin_loss`). Example:
    ``nn.TripletMarginLoss(margin=0.5, p=2, swap=True)``."""

    def __init__(self, margin=1.0, p=2.0, eps=1e-6, swap=False, reduction="mean"):
        super().__init__(reduction)
        self.margin, self.p, self.eps, self.swap = margin, p, eps, swap

    def forward(self, anchor, positive, negative):
        return F.triplet_margin_loss(anchor, positive, negative, self.margin, self.p,
                                     self.eps, self.swap, self.reduction)


class TripletMarginWithDistanceLoss(_Loss):
    """Triplet loss with any distance function. Example:
    ``nn.TripletMarginWithDistanceLoss(distance_function=f, margin=0.5)``."""

    def __init__(self, distance_function=None, margin=1.0, swap=False, reduction="mean"):
        super().__init__(reduction)
        self.distance_function, self.margin, self.swap = distance_function, margin, swap

    def forward(self, anchor, positive, negative):
        return F.triplet_margin_with_distance_loss(anchor, positive, negative,
                                                   self.distance_function, self.margin,
                                                   self.swap, self.reduction)


class MarginRankingLoss(_Loss):
    """max(0, -y (x1 - x2) + margin). Example: ``nn.MarginRankingLoss(0.1)(x1, x2, y)``."""

    def __init__(self, margin=0.0, reduction="mean"):
        super().__init__(reduction)
        self.margin = margin

    def forward(self, input1, input2, target):
        return F.margin_ranking_loss(input1, input2, target, self.margin, self.reduction)


class HingeEmbeddingLoss(_Loss):
    """x where y == 1, max(0, margin - x) where y == -1. Example:
    ``nn.HingeEmbeddingLoss(margin=2.0)``."""

    def __init__(self, margin=1.0, reduction="mean"):
        super().__init__(reduction)
        self.margin = margin

    def forward(self, input, target):
        return F.hinge_embedding_loss(input, target, self.margin, self.reduction)


class SoftMarginLoss(_Loss):
    """log(1 + exp(-y x)). Example: ``nn.SoftMarginLoss()(x, y)``."""

    def forward(self, input, target):
        return F.soft_margin_loss(input, target, self.reduction)


class CosineEmbeddingLoss(_Loss):
    """1 - cos where y == 1, max(0, cos - margin) where y == -1. Example:
    ``nn.CosineEmbeddingLoss(margin=0.2)(x1, x2, y)``."""

    def __init__(self, margin=0.0, reduction="mean"):
        super().__init__(reduction)
        self.margin = margin

    def forward(self, input1, input2, target):
        return F.cosine_embedding_loss(input1, input2, target, self.margin, self.reduction)


class MultiLabelSoftMarginLoss(_Loss):
    """Per-class logistic loss averaged over classes. Example:
    ``nn.MultiLabelSoftMarginLoss(weight=w)(z, y)``."""

    def __init__(self, weight=None, reduction="mean"):
        super().__init__(reduction)
        if weight is not None:
            self.register_buffer("weight", weight)
        else:
            self.weight = None

    def forward(self, input, target):
        return F.multilabel_soft_margin_loss(input, target, self.weight, self.reduction)


class PoissonNLLLoss(_Loss):
    """Poisson negative log-likelihood (see `F.poisson_nll_loss`). Example:
    ``nn.PoissonNLLLoss(log_input=False, full=True)``."""

    def __init__(self, log_input=True, full=False, eps=1e-8, reduction="mean"):
        super().__init__(reduction)
        self.log_input, self.full, self.eps = log_input, full, eps

    def forward(self, log_input, target):
        return F.poisson_nll_loss(log_input, target, self.log_input, self.full, self.eps,
                                  self.reduction)


class GaussianNLLLoss(_Loss):
    """Gaussian negative log-likelihood with predicted variances. Example:
    ``nn.GaussianNLLLoss()(mu, y, var)``."""

    def __init__(self, full=False, eps=1e-6, reduction="mean"):
        super().__init__(reduction)
        self.full, self.eps = full, eps

    def forward(self, input, target, var):
        return F.gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)


class MultiMarginLoss(_Loss):
    """Multi-class hinge loss (see `F.multi_margin_loss`). Example:
    ``nn.MultiMarginLoss(p=2, margin=0.5)``."""

    def __init__(self, p=1, margin=1.0, weight=None, reduction="mean"):
        super().__init__(reduction)
        self.p, self.margin = p, margin
        if weight is not None:
            self.register_buffer("weight", weight)
        else:
            self.weight = None

    def forward(self, input, target):
        return F.multi_margin_loss(input, target, self.p, self.margin, self.weight,
                                   self.reduction)


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "BCELoss",
           "BCEWithLogitsLoss", "KLDivLoss", "HuberLoss", "CTCLoss", "TripletMarginLoss",
           "TripletMarginWithDistanceLoss", "MarginRankingLoss", "HingeEmbeddingLoss",
           "SoftMarginLoss", "CosineEmbeddingLoss", "MultiLabelSoftMarginLoss",
           "PoissonNLLLoss", "GaussianNLLLoss", "MultiMarginLoss"]
