"""(issue 17) layout ops: the primitives that need kernels of their own (tril/triu, roll,
diagonal as a view and its inverse diag_embed, the repeat index of repeat_interleave),
with einsum in `einsum.py`, matrix products in `layout_mm.py` and the composites in
`layout_shape.py`.

`EXPORTS` lists the functions exported as `sampan.<name>`, `METHODS` the Tensor methods
(name -> function) and `INPLACE` the in-place methods (name -> out-of-place function),
both bound by `sampan/_tensor_methods.py`; the composites are registered with their test
samples in `COMPOSITES` at the end."""
from __future__ import annotations

# the primitives first (the op table keeps its order), then the composites built on them
from .layout_prims import (DIAG_EMBED, DIAGONAL, REPEAT_INDEX, ROLL, TRIL,  # noqa: F401
                           TRIU, diag_embed, diag_len, diagonal, repeat_index, roll, tril,
                           triu)
from . import layout_mm as _mm
from . import layout_shape as _sh
from .einsum import einsum, tensordot  # noqa: F401  (exported)

_MM = ["mm", "bmm", "mv", "dot", "vdot", "inner", "outer", "ger", "addmm", "addmv", "addbmm",
       "baddbmm"]
_SH = ["t", "movedim", "moveaxis", "unbind", "tile", "repeat_interleave", "meshgrid",
       "vstack", "row_stack", "hstack", "dstack", "column_stack", "atleast_1d", "atleast_2d",
       "atleast_3d", "ravel", "take", "rot90", "fliplr", "flipud", "kron", "cross", "trace",
       "triu_indices", "tril_indices", "cartesian_prod", "block_diag", "diag"]
globals().update({n: getattr(_mm, n) for n in _MM})
globals().update({n: getattr(_sh, n) for n in _SH})

EXPORTS: list = (["einsum", "tensordot", "tril", "triu", "roll", "diagonal", "diag_embed"] + _MM
                 + _SH)
METHODS: dict = {n: globals()[n] for n in [
    "tril", "triu", "roll", "diagonal", "diag_embed", "mm", "bmm", "mv", "dot", "vdot",
    "inner", "outer", "ger", "addmm", "addmv", "addbmm", "baddbmm", "t", "movedim",
    "moveaxis", "unbind", "tile", "repeat_interleave", "ravel", "take", "rot90", "fliplr",
    "flipud", "kron", "cross", "trace", "diag"]}
METHODS.update({"repeat": _sh.repeat, "reshape_as": _sh.reshape_as})
INPLACE: dict = {"tril_": tril, "triu_": triu, "addmm_": _mm.addmm, "addmv_": _mm.addmv,
                 "addbmm_": _mm.addbmm, "baddbmm_": _mm.baddbmm}

from . import layout_samples as _samples  # noqa: E402,F401  (registers the COMPOSITES)
