"""Streaming CTR metrics: AUC from score histograms, and log loss.

AUC is accumulated in ``bins`` equal-width buckets of the predicted probability, so memory
is fixed however many samples stream through; samples in one bucket count as ties (half a
correctly ordered pair), which bounds the error by the mass that shares a bucket.
"""

from __future__ import annotations

import numpy as np

__all__ = ["LogLoss", "StreamingAUC", "auc"]


class StreamingAUC:
    """ROC AUC over a stream of (probability, label) batches.

    >>> m = StreamingAUC(); m.update([0.1, 0.9, 0.8], [0, 1, 0]); m.value()
    1.0
    """

    def __init__(self, bins: int = 1 << 16):
        if bins < 2:
            raise ValueError(f"bins must be >= 2, got {bins}")
        self.bins = int(bins)
        self.pos = np.zeros(self.bins, np.int64)
        self.neg = np.zeros(self.bins, np.int64)

    def update(self, probs, labels) -> None:
        """Add a batch of predicted probabilities in [0, 1] and 0/1 labels."""
        p = np.asarray(probs, np.float64).ravel()
        y = np.asarray(labels).ravel()
        if p.shape != y.shape:
            raise ValueError(f"got {p.size} predictions and {y.size} labels")
        if p.size and (np.isnan(p).any() or p.min() < 0 or p.max() > 1):
            raise ValueError("predictions must be probabilities in [0, 1] (apply sigmoid)")
        b = np.minimum((p * self.bins).astype(np.int64), self.bins - 1)
        pos = y > 0.5
        self.pos += np.bincount(b[pos], minlength=self.bins)
        self.neg += np.bincount(b[~pos], minlength=self.bins)

    def value(self) -> float:
        """AUC so far (nan until both classes were seen)."""
        n_pos, n_neg = self.pos.sum(), self.neg.sum()
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        neg_below = np.cumsum(self.neg) - self.neg
        correct = (self.pos * neg_below).sum() + 0.5 * (self.pos * self.neg).sum()
        return float(correct / (n_pos * n_neg))

    def reset(self) -> None:
        """Forget everything seen."""
        self.pos[:] = 0
        self.neg[:] = 0


class LogLoss:
    """Mean binary cross-entropy over a stream, probabilities clipped to [eps, 1-eps].

    >>> m = LogLoss(); m.update([0.5], [1]); round(m.value(), 4)
    0.6931
    """

    def __init__(self, eps: float = 1e-7):
        self.eps, self.total, self.count = eps, 0.0, 0

    def update(self, probs, labels) -> None:
        """Add a batch of probabilities and 0/1 labels."""
        p = np.clip(np.asarray(probs, np.float64).ravel(), self.eps, 1 - self.eps)
        y = np.asarray(labels, np.float64).ravel()
        if p.shape != y.shape:
            raise ValueError(f"got {p.size} predictions and {y.size} labels")
        self.total += float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).sum())
        self.count += p.size

    def value(self) -> float:
        """Mean log loss so far."""
        return self.total / self.count if self.count else float("nan")


def auc(probs, labels, bins: int = 1 << 16) -> float:
    """One-shot binned AUC of probabilities against labels.

    >>> auc([0.2, 0.7], [0, 1])
    1.0
    """
    m = StreamingAUC(bins)
    m.update(probs, labels)
    return m.value()
