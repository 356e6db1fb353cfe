"""Import handlers for ONNX's activation functions (Relu, LeakyRelu, PRelu, Elu, Selu, Celu,
HardSigmoid, HardSwish, ThresholdedRelu, Softplus, Softsign, Gelu, Mish, Shrink).

Each is written with sampan ops so an imported model trains; attribute defaults are the
ONNX spec's. Where ONNX and PyTorch put the gradient at a kink differently (x == 0 for
Relu, the bounds of HardSigmoid), sampan's functional forms decide.
"""
from __future__ import annotations

import sampan
import sampan.nn.functional as F

from ... import dtypes as _dt
from . import onnx_op

# the spec's float32 defaults, exactly
_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _float(ctx, x):
    if not _dt.is_floating(x.dtype):
        raise ctx.error(f"input of type {x.dtype}; expected a floating type")
    return x


@onnx_op("Relu", since=1)
def relu(ctx, node, x):
    return sampan.relu(x)


@onnx_op("LeakyRelu", since=1)
def leaky_relu(ctx, node, x):
    return F.leaky_relu(_float(ctx, x), node.attr("alpha", 0.01))


@onnx_op("PRelu", since=1)
def prelu(ctx, node, x, slope):
    # slope broadcasts to x (unidirectionally, as numpy from the trailing dims)
    return sampan.where(sampan.lt(x, 0), sampan.mul(x, slope), x)


@onnx_op("Elu", since=1)
def elu(ctx, node, x):
    return F.elu(_float(ctx, x), node.attr("alpha", 1.0))


@onnx_op("Selu", since=1)
def selu(ctx, node, x):
    y = F.elu(_float(ctx, x), node.attr("alpha", _SELU_ALPHA))
    return sampan.mul(y, node.attr("gamma", _SELU_GAMMA))


@onnx_op("Celu", since=12)
def celu(ctx, node, x):
    alpha = node.attr("alpha", 1.0)
    if alpha == 0:
        raise ctx.error("alpha=0; expected a non-zero alpha")
    return F.celu(_float(ctx, x), alpha)


@onnx_op("HardSigmoid", since=1)
def hard_sigmoid(ctx, node, x):
    y = sampan.add(sampan.mul(_float(ctx, x), node.attr("alpha", 0.2)), node.attr("beta", 0.5))
    return sampan.clamp(y, 0.0, 1.0)


@onnx_op("HardSwish", since=14)
def hard_swish(ctx, node, x):
    return F.hardswish(_float(ctx, x))


@onnx_op("ThresholdedRelu", since=10)
def thresholded_relu(ctx, node, x):
    x = _float(ctx, x)
    return sampan.where(sampan.gt(x, node.attr("alpha", 1.0)), x, sampan.zeros_like(x))


@onnx_op("Softplus", since=1)
def softplus(ctx, node, x):
    return F.softplus(_float(ctx, x))


@onnx_op("Softsign", since=1)
def softsign(ctx, node, x):
    x = _float(ctx, x)
    return sampan.div(x, sampan.add(sampan.abs(x), 1.0))


@onnx_op("Gelu", since=20)
def gelu(ctx, node, x):
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.error(f"approximate={approximate!r}; expected 'none' or 'tanh'")
    return F.gelu(_float(ctx, x), approximate=approximate)


@onnx_op("Mish", since=18)
def mish(ctx, node, x):
    return F.mish(_float(ctx, x))


@onnx_op("Shrink", since=9)
def shrink(ctx, node, x):
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    if _dt.is_integer(x.dtype):
        # integer inputs compare and shift by the attributes as integers (ONNX's kernels
        # cast the float attributes to the input type)
        lambd, bias = int(lambd), int(bias)
    zero = sampan.zeros_like(x)
    low = sampan.where(sampan.lt(x, -lambd), sampan.add(x, bias), zero)
    return sampan.where(sampan.gt(x, lambd), sampan.sub(x, bias), low)
