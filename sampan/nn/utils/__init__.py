"""`sampan.nn.utils`: gradient clipping, parameter vectors and `rnn` (padded and packed
sequences), at PyTorch's import paths."""
from __future__ import annotations

from . import rnn

__all__ = ["rnn"]
