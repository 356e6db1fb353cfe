"""Mixed precision (issue 22): `autocast` with an op-level policy read from the op table
(`OpDef.amp`), and `GradScaler` for float16 training. The `amp` pass
(`sampan.passes.amp`) converts a saved inference program to bfloat16 by the same policy.

Example::

    >>> scaler = sampan.amp.GradScaler()
    >>> with sampan.amp.autocast(sampan.float16):
    ...     loss = sampan.cross_entropy(model(x), y)
    >>> scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
"""
from .mode import autocast, get_autocast_dtype, is_autocast_enabled, policy
from .grad_scaler import GradScaler

EXPORTS: list = []  # names bound on `sampan` itself (none: use sampan.amp.*)
__all__ = ["autocast", "GradScaler", "is_autocast_enabled", "get_autocast_dtype", "policy"]
