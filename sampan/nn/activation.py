"""Activation layers: thin wrappers over `sampan.nn.functional`."""
from __future__ import annotations

from . import functional as F
from .layer import Layer


class ReLU(Layer):
    """max(x, 0). Example: ``nn.ReLU()(x)``."""

    def forward(self, x):
        return F.relu(x)


class LeakyReLU(Layer):
    """x if x > 0 else negative_slope * x. Example: ``nn.LeakyReLU(0.2)``."""

    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"


class GELU(Layer):
    """Gaussian error linear unit, exact (erf) or approximate="tanh".
    Example: ``nn.GELU()``."""

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}" if self.approximate != "none" else ""


class SiLU(Layer):
    """x * sigmoid(x). Example: ``nn.SiLU()(x)``."""

    def forward(self, x):
        return F.silu(x)


class Tanh(Layer):
    """tanh(x). Example: ``nn.Tanh()(x)``."""

    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Layer):
    """1 / (1 + e^-x). Example: ``nn.Sigmoid()(x)``."""

    def forward(self, x):
        return F.sigmoid(x)


class Softmax(Layer):
    """softmax along `axis` (PyTorch's `dim` is accepted too). Example: ``nn.Softmax(-1)``."""

    def __init__(self, axis=-1, dim=None):
        super().__init__()
        self.axis = axis if dim is None else dim

    def forward(self, x):
        return F.softmax(x, self.axis)

    def extra_repr(self):
        return f"axis={self.axis}"


class LogSoftmax(Softmax):
    """log(softmax(x)) along `axis`. Example: ``nn.LogSoftmax(-1)``."""

    def forward(self, x):
        return F.log_softmax(x, self.axis)


class ELU(Layer):
    """x if x > 0 else alpha (e^x - 1). Example: ``nn.ELU()``."""

    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return F.elu(x, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}"


class Softplus(Layer):
    """log(1 + e^(beta x)) / beta. Example: ``nn.Softplus()``."""

    def __init__(self, beta=1.0):
        super().__init__()
        self.beta = beta

    def forward(self, x):
        return F.softplus(x, self.beta)


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["ReLU", "LeakyReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "ELU", "Softplus"]
