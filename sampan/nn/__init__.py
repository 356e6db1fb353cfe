"""`sampan.nn`: layers, the functional API, initialisers and losses.

Example::

    >>> from sampan import nn
    >>> net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
    >>> loss = nn.functional.cross_entropy(net(sampan.randn(128, 784)),
    ...                                    sampan.randint(0, 10, (128,)))
    >>> loss.backward()
"""
from . import functional, init
from .activation import (ELU, GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax,
                         Softplus, Tanh)
from .attention import MultiHeadAttention, TransformerDecoderBlock, TransformerEncoderLayer
from .container import LayerDict, LayerList, Sequential
from .conv import AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, ConvTranspose2d, MaxPool2d
from .layer import Layer, LoadResult, Parameter, RemovableHandle, is_parameter
from .linear import Bilinear, Dropout, Embedding, Flatten, Identity, Linear
from .losses import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, KLDivLoss, L1Loss, MSELoss,
                     NLLLoss, SmoothL1Loss)
from .norm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RMSNorm
from .rnn import GRU, LSTM

F = functional
Module = Layer  # PyTorch's name
ModuleList = LayerList
ModuleDict = LayerDict
MultiheadAttention = MultiHeadAttention

__all__ = [
    "functional", "init", "F", "Layer", "Module", "Parameter", "RemovableHandle",
    "LoadResult", "is_parameter", "Sequential", "LayerList", "LayerDict", "ModuleList",
    "ModuleDict", "Linear", "Bilinear", "Embedding", "Identity", "Flatten", "Dropout",
    "Conv1d", "Conv2d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
    "BatchNorm1d", "BatchNorm2d", "LayerNorm", "RMSNorm", "GroupNorm", "ReLU", "LeakyReLU",
    "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "ELU", "Softplus",
    "MultiHeadAttention", "MultiheadAttention", "TransformerEncoderLayer",
    "TransformerDecoderBlock", "LSTM", "GRU", "CrossEntropyLoss", "NLLLoss", "MSELoss",
    "L1Loss", "SmoothL1Loss", "BCELoss", "BCEWithLogitsLoss", "KLDivLoss",
]
