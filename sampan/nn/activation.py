"""Activation layers: thin wrappers over `sampan.nn.functional`."""
from __future__ import annotations

from ..errors import SampanValueError, ShapeError
from ..ops.creation import full
from . import functional as F
from .layer import Layer, Parameter


class _Inplace(Layer):
    """An activation with PyTorch's `inplace=` flag (the result is written into x)."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


def _inplace_str(layer):
    return ", inplace=True" if layer.inplace else ""


class ReLU(_Inplace):
    """max(x, 0). Example: ``nn.ReLU()(x)``; ``nn.ReLU(inplace=True)`` writes into x."""

    def forward(self, x):
        return F.relu(x, self.inplace)


class LeakyReLU(Layer):
    """x if x > 0 else negative_slope * x. Example: ``nn.LeakyReLU(0.2)``."""

    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope, self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}{_inplace_str(self)}"


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


class SiLU(_Inplace):
    """x * sigmoid(x). Example: ``nn.SiLU()(x)``."""

    def forward(self, x):
        return F.silu(x, self.inplace)


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
        self.dim = self.axis   # PyTorch's attribute name

    def forward(self, x):
        return F.softmax(x, self.axis)

    def extra_repr(self):
        return f"dim={self.axis}"   # as PyTorch prints it


class LogSoftmax(Softmax):
    """log(softmax(x)) along `axis`. Example: ``nn.LogSoftmax(-1)``."""

    def forward(self, x):
        return F.log_softmax(x, self.axis)


class ELU(Layer):
    """x if x > 0 else alpha (e^x - 1). Example: ``nn.ELU()``."""

    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, x):
        return F.elu(x, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}{_inplace_str(self)}"


class Softplus(Layer):
    """log(1 + e^(beta x)) / beta. Example: ``nn.Softplus()``."""

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return F.softplus(x, self.beta)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class CELU(ELU):
    """max(0, x) + min(0, alpha (e^(x/alpha) - 1)). Example: ``nn.CELU(2.0)``."""

    def forward(self, x):
        return F.celu(x, self.alpha, self.inplace)


class SELU(_Inplace):
    """scale * elu(x, alpha) with the self-normalising constants. Example: ``nn.SELU()``."""

    def forward(self, x):
        return F.selu(x, self.inplace)


class Hardtanh(Layer):
    """Clamp to [min_val, max_val] (no gradient at the bounds). Example:
    ``nn.Hardtanh(-2.0, 2.0)``."""

    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        if max_val <= min_val:
            raise SampanValueError(f"Hardtanh: got min_val={min_val}, max_val={max_val}; "
                                   "expected min_val < max_val")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, x):
        return F.hardtanh(x, self.min_val, self.max_val, self.inplace)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace_str(self)}"


class ReLU6(Hardtanh):
    """min(max(x, 0), 6). Example: ``nn.ReLU6()``."""

    def __init__(self, inplace=False):
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Hardswish(_Inplace):
    """x * relu6(x + 3) / 6. Example: ``nn.Hardswish()``."""

    def forward(self, x):
        return F.hardswish(x, self.inplace)

    def extra_repr(self):
        return ""


class Hardsigmoid(_Inplace):
    """relu6(x + 3) / 6. Example: ``nn.Hardsigmoid()``."""

    def forward(self, x):
        return F.hardsigmoid(x, self.inplace)

    def extra_repr(self):
        return ""


class Mish(_Inplace):
    """x * tanh(softplus(x)). Example: ``nn.Mish()``."""

    def forward(self, x):
        return F.mish(x, self.inplace)

    def extra_repr(self):
        return ""


class LogSigmoid(Layer):
    """log(sigmoid(x)), stable. Example: ``nn.LogSigmoid()``."""

    def forward(self, x):
        return F.logsigmoid(x)


class Softsign(Layer):
    """x / (1 + |x|). Example: ``nn.Softsign()``."""

    def forward(self, x):
        return F.softsign(x)


class Tanhshrink(Layer):
    """x - tanh(x). Example: ``nn.Tanhshrink()``."""

    def forward(self, x):
        return F.tanhshrink(x)


class Threshold(Layer):
    """x if x > threshold else value. Example: ``nn.Threshold(0.1, 20.0)``."""

    def __init__(self, threshold, value, inplace=False):
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, x):
        return F.threshold(x, self.threshold, self.value, self.inplace)

    def extra_repr(self):
        return f"threshold={self.threshold}, value={self.value}{_inplace_str(self)}"


class Hardshrink(Layer):
    """x where |x| > lambd, else 0. Example: ``nn.Hardshrink(0.5)``."""

    def __init__(self, lambd=0.5):
        super().__init__()
        self.lambd = lambd

    def forward(self, x):
        return F.hardshrink(x, self.lambd)

    def extra_repr(self):
        return f"{self.lambd}"


class Softshrink(Hardshrink):
    """Shrink towards 0 by lambd (0 inside [-lambd, lambd]). Example: ``nn.Softshrink()``."""

    def forward(self, x):
        return F.softshrink(x, self.lambd)


class GLU(Layer):
    """a * sigmoid(b) for the halves of x along `dim`. Example: ``nn.GLU(dim=1)``."""

    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.glu(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmin(Layer):
    """softmax(-x) along `dim`. Example: ``nn.Softmin(dim=1)``."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmin(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmax2d(Layer):
    """softmax over the channels of (N, C, H, W) or (C, H, W). Example: ``nn.Softmax2d()``."""

    def forward(self, x):
        if x.ndim not in (3, 4):
            raise ShapeError(f"Softmax2d: got an input of shape {tuple(x.shape)}; expected "
                             "(N, C, H, W) or (C, H, W)")
        return F.softmax(x, -3)


class PReLU(Layer):
    """x if x > 0 else a * x with a learnt slope `a` (one, or one per channel of dim 1).
    Example: ``nn.PReLU(num_parameters=16, init=0.25)``."""

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        if not isinstance(num_parameters, int) or num_parameters <= 0:
            raise SampanValueError(f"PReLU: got num_parameters={num_parameters!r}; expected "
                                   "a positive int")
        self.num_parameters, self.init = num_parameters, init
        self.weight = Parameter(full((num_parameters,), float(init)))

    def reset_parameters(self):
        self.weight._data[...] = self.init

    def forward(self, x):
        return F.prelu(x, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["ReLU", "LeakyReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax",
           "ELU", "Softplus", "CELU", "SELU", "Hardtanh", "ReLU6", "Hardswish", "Hardsigmoid",
           "Mish", "LogSigmoid", "Softsign", "Tanhshrink", "Threshold", "Hardshrink",
           "Softshrink", "GLU", "Softmin", "Softmax2d", "PReLU"]
