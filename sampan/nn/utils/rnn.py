"""`sampan.nn.utils.rnn`: padded and packed variable-length sequences."""
from __future__ import annotations

__all__: list = []
