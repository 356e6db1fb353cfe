"""`sampan.linalg`: norms, inverses, solves and decompositions, as torch.linalg (numpy/LAPACK
kernels in `sampan/ops/decomp.py`, with gradient rules; its docstring has the sign and
gradient conventions). Example: ``Q, R = sampan.linalg.qr(A)``."""
from __future__ import annotations

from .ops.decomp import (QRResult, SlogdetResult, cholesky, det, eigh, eigvalsh, inv,
                         matrix_norm, qr, slogdet, solve, svd, svdvals, vector_norm)
from .ops.decomp import linalg_norm as norm
from .ops.decomp_norms import LstsqResult, lstsq, matrix_power, matrix_rank, multi_dot, pinv
from .ops.decomp_spectral import EighResult, SVDResult

__all__: list = ["norm", "vector_norm", "matrix_norm", "inv", "solve", "det", "slogdet",
                 "cholesky", "qr", "svd", "svdvals", "eigh", "eigvalsh", "matrix_power",
                 "matrix_rank", "multi_dot", "pinv", "lstsq", "QRResult", "LstsqResult",
                 "SlogdetResult", "SVDResult", "EighResult"]
