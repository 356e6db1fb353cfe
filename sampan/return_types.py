"""Named-tuple results of ops that return values with their indices, as
``torch.return_types``: unpackable (``v, i = x.max(dim=1)``) and readable by name
(``x.max(dim=1).indices``)."""
from __future__ import annotations

from collections import namedtuple

max = namedtuple("max", ["values", "indices"])
min = namedtuple("min", ["values", "indices"])
sort = namedtuple("sort", ["values", "indices"])
topk = namedtuple("topk", ["values", "indices"])

__all__ = ["max", "min", "sort", "topk"]
