"""`sampan.linalg`: norms, inverses, solves and decompositions (numpy/LAPACK kernels in
`sampan/ops/decomp.py`, with gradient rules)."""
from __future__ import annotations

__all__: list = []
