"""Mixed precision (issue 22): `autocast` with an op-level policy read from the op table,
and `GradScaler` for float16 training."""

EXPORTS: list = []  # names bound on `sampan` itself (none: use sampan.amp.*)
