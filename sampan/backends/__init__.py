"""Kernel providers behind one contract (`provider.py`): each maps op names to kernels
over numpy arrays and answers `supports(node)` and `bind(node)`; each is found by its
name (`get_provider`, `register_provider`, `providers()`).

- "numpy" (`numpy/`): the reference, the op table's own kernels;
- "numba" (`numba/`): generated fused kernels for the fusion pass's `fused` nodes;
- "onednn" (`onednn/`): GEMM, convolution and pooling through oneDNN where installed;
- "onnxruntime" (`onnxruntime/`): engine nodes, subgraphs run as onnxruntime sessions.

Which provider runs a node is the first of an ordered list that supports it: the
Predictor's (`Config.set_providers`, the partition pass), and eager dispatch's and the
jit's (`set_providers` here, also a context manager; `get_providers`). Below the contract,
which of numpy and oneDNN wins an op class on this machine is measured (`choice`;
`prefer` overrides it), under one GEMM thread pool (`pool`; `set_pool` forces one), both
kept in one cache (`cache`)."""
from .choice import prefer
from .pool import set_pool
from .provider import (Call, Provider, ProviderError, get_provider, providers,
                       register_provider, unregister_provider)
from .dispatch import get_providers, set_providers
from . import onnxruntime as _onnxruntime  # noqa: F401  (registers the engine runner)

__all__ = ["Call", "Provider", "ProviderError", "get_provider", "get_providers", "prefer",
           "providers", "register_provider", "set_pool", "set_providers",
           "unregister_provider"]
