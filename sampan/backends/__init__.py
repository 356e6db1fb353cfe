"""Backends are kernel tables: numpy kernels live in the op table, `numba` generates
fused CPU kernels for the fusion pass, `onednn` serves GEMMs, convolutions and pooling
through oneDNN where installed. `choice` picks between them by measurement; `prefer`
overrides it. `pool` runs a process's float32 GEMMs under one thread pool (OpenBLAS's or
oneDNN's), chosen per machine; `set_pool` forces one."""
from .choice import prefer
from .pool import set_pool

__all__ = ["prefer", "set_pool"]
