"""numpy reference kernels for the standalone module that `sampan deploy` writes.

Each op the generator supports has a function `k_<op>` in one of the family modules here,
written with numpy alone and computing exactly what the op table's kernel computes on its
numpy path (no numba: the same numpy calls in the same order, so the results agree bit
for bit). Ops whose numpy kernel is a ufunc need nothing here: the generator binds the
ufunc itself. The generator copies the source of the kernels a program uses, and of the
module-level helpers they call, into the generated file; so a kernel may call only numpy
and other functions of its own module.

Example::

    >>> from sampan.deploy.kernels import KERNELS
    >>> KERNELS["relu"](np.array([-1.0, 2.0], np.float32))
"""
from __future__ import annotations

from . import basic, nn

KERNELS = {}
for _m in (basic, nn):
    KERNELS.update({name[2:]: f for name, f in vars(_m).items()
                    if name.startswith("k_") and callable(f)})

__all__ = ["KERNELS"]
