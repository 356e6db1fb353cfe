"""Backends are kernel tables: numpy kernels live in the op table, `numba` generates
fused CPU kernels for the fusion pass, `onednn` serves GEMMs, convolutions and pooling
through oneDNN where installed. `choice` picks between them by measurement; `prefer`
overrides it."""
from .choice import prefer

__all__ = ["prefer"]
