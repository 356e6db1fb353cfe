"""(issue 17) op family: one block per op (rule, kernel, gradient, FLOPs, ONNX mapping,
samples) registered with `defop`; `EXPORTS` lists the functions exported as `sampan.<name>`,
`METHODS` the Tensor methods (name -> function) and `INPLACE` the in-place methods
(name -> out-of-place function), both bound by `sampan/_tensor_methods.py`."""
from __future__ import annotations

EXPORTS: list = []
METHODS: dict = {}
INPLACE: dict = {}   # e.g. {"masked_fill_": masked_fill}: see _tensor_methods
