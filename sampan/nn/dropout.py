"""Dropout layers: channel-wise (Dropout1d/2d/3d) and for SELU networks (AlphaDropout,
FeatureAlphaDropout); each is the identity in eval mode. `nn.Dropout` is in linear.py."""
from __future__ import annotations

from . import functional as F
from .linear import Dropout


class Dropout1d(Dropout):
    """Zero whole channels of (N, C, L) or (C, L) with probability p in training mode.
    Example: ``nn.Dropout1d(0.2)``."""

    def forward(self, x):
        return F.dropout1d(x, self.p, self.training, self.inplace)


class Dropout2d(Dropout):
    """Zero whole channels of (N, C, H, W) or (C, H, W). Example: ``nn.Dropout2d(0.2)``."""

    def forward(self, x):
        return F.dropout2d(x, self.p, self.training, self.inplace)


class Dropout3d(Dropout):
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W). Example:
    ``nn.Dropout3d(0.2)``."""

    def forward(self, x):
        return F.dropout3d(x, self.p, self.training, self.inplace)


class AlphaDropout(Dropout):
    """Dropout that keeps zero mean and unit variance (for SELU networks). Example:
    ``nn.AlphaDropout(0.1)``."""

    def forward(self, x):
        return F.alpha_dropout(x, self.p, self.training, self.inplace)


class FeatureAlphaDropout(Dropout):
    """`AlphaDropout` of whole channels of (N, C, ...). Example:
    ``nn.FeatureAlphaDropout(0.1)``."""

    def forward(self, x):
        return F.feature_alpha_dropout(x, self.p, self.training, self.inplace)


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"]
