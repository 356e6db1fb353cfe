"""Backends are kernel tables: numpy kernels live in the op table, `numba` generates
fused CPU kernels for the fusion pass."""
