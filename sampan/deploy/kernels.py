"""`KERNELS` (the old name): {op: the kernel the standalone module runs it with}, now a
view of the op table's own numpy kernels for the ops deploy supports (see
`sampan.deploy.kernelsource`); nothing here is a kernel of its own.

Example::

    >>> from sampan.deploy.kernels import KERNELS
    >>> KERNELS["relu"] is sampan.ops.registry.OPS["relu"].kernels["numpy"]
    True
"""
from __future__ import annotations

from collections.abc import Mapping

from .kernelsource import kernel_of, standalone, supported_ops


class _Kernels(Mapping):
    def __getitem__(self, op):
        if op == "fused" or not standalone(op):
            raise KeyError(op)
        return kernel_of(op)

    def __iter__(self):
        return (op for op in supported_ops() if op != "fused")

    def __len__(self):
        return sum(1 for _ in self)


KERNELS = _Kernels()

__all__ = ["KERNELS"]
