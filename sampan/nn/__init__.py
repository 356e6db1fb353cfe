"""`sampan.nn`: layers, the functional API, initialisers and losses.

Example::

    >>> from sampan import nn
    >>> net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
    >>> loss = nn.functional.cross_entropy(net(sampan.randn(128, 784)),
    ...                                    sampan.randint(0, 10, (128,)))
    >>> loss.backward()
"""
from . import functional, init, utils
from . import (activation, attention, container, conv, distance, dropout, linear, losses, norm,
               rnn, rnn_cells, sampling, sparse, transformer)
from .layer import Layer, LoadResult, Parameter, RemovableHandle, is_parameter

_LAYER_MODULES = (activation, attention, container, conv, distance, dropout, linear, losses,
                  norm, rnn, rnn_cells, sampling, sparse, transformer)
for _m in _LAYER_MODULES:  # each layer module lists the names it exports in EXPORTS
    globals().update({_n: getattr(_m, _n) for _n in _m.EXPORTS})

F = functional
Module = Layer  # PyTorch's name
ModuleList = LayerList  # noqa: F405
ModuleDict = LayerDict  # noqa: F405
MultiheadAttention = MultiHeadAttention  # noqa: F405

__all__ = ["functional", "init", "utils", "F", "Layer", "Module", "Parameter", "RemovableHandle",
           "LoadResult", "is_parameter", "ModuleList", "ModuleDict", "MultiheadAttention"]
__all__ += [n for m in _LAYER_MODULES for n in m.EXPORTS]
