"""The hand-written numba loops of eager kernels, one module per op family, each with
`KERNELS` {op name: kernel}: the numba provider's table of those ops. `install()` (run by
`import sampan` where numba is) registers each as its op's "numba" kernel
(`ops.registry.register_kernel`), which is then the op's default (`OpDef.kernel`, see
`ops.registry.DEFAULT_BACKENDS`); a kernel serves every call of its op, handing what its
loops do not cover to the op's numpy kernel. The op table itself (sampan/ops) stays
plain numpy: the reference provider and the source `sampan deploy` copies.

Example::

    >>> from sampan.backends.numba import loops
    >>> sorted(loops.kernels())[:3]
    ['erf', 'gelu', 'gelu_grad']
"""
from __future__ import annotations

import importlib

FAMILIES = ("unary", "elementwise", "rowwise", "layernorm", "sparse", "conv", "pool")
_INSTALLED = []


def kernels() -> dict:
    """{op: its numba kernel} of every family (imports numba)."""
    out = {}
    for fam in FAMILIES:
        out.update(importlib.import_module(f"{__name__}.{fam}").KERNELS)
    from .. import qkernels     # the int8 ops' VNNI loops (qkernels.py, qlayers.py)
    out.update(qkernels.kernels())
    from .. import convblock, gemv   # the float layers with their epilogues (issue 31)
    out.update(gemv.KERNELS)
    out.update(convblock.KERNELS)
    from .. import attention   # BERT's self-attention in one node (issue 31, W8)
    out.update(attention.KERNELS)
    return out


def install() -> bool:
    """Register the loops as the ops' numba kernels, once; False without numba."""
    from .. import available
    if _INSTALLED:
        return True
    if not available():
        return False
    from ....ops.registry import register_kernel
    for op, fn in kernels().items():
        register_kernel(op, "numba", fn)
    _INSTALLED.append(True)
    return True
