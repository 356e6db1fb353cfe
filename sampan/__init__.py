"""sampan: a deep learning platform on numpy.

Write a model imperatively and train it eagerly (tape autograd), trace the same code
into a graph IR, deploy it, and train sparse recommendation models.

Example::

    >>> import sampan
    >>> x = sampan.randn(4, 3, requires_grad=True)
    >>> loss = (x.tanh() ** 2).mean()
    >>> loss.backward()
"""
from . import _alloc
from . import _threads as _threads_mod
# libgomp reads its wait policy once, when it loads, and every library that asks for
# libgomp.so.1 (oneDNN's, numba's omp layer, PyTorch's own copy) shares the first one
# loaded: sampan's passive policy is set now, before another import can load it spinning
_threads_mod.before_openmp()
from . import dtypes as _dtypes_mod
from .device import Device, cuda_is_available
from .dtypes import (bfloat16, bool_, finfo, float16, float32, float64, get_default_dtype, iinfo,
                     int8, int16, int32, int64, promote_types, set_default_dtype, uint8)
from .errors import (AutogradError, DeviceError, DTypeError, SampanError, SampanIndexError,
                     SampanValueError, ShapeError)
from .tensor import Tensor
from .ops import load_all as _load_ops

_load_ops()  # registers the op table
# the hand-written numba loops as the ops' numba kernels, where numba is installed (the
# op table itself is plain numpy; the providers sit on a floor above it)
from .backends.numba import loops as _nb_loops  # noqa: E402
_nb_loops.install()
# kernels measured against other backends (oneDNN) where installed; loads nothing yet.
# Here, not in ops.load_all: the providers sit on a floor above the op table.
from .backends import choice as _choice  # noqa: E402
_choice.install()
_alloc.tune()  # keep freed activations in the process (see sampan/_alloc.py)
from . import _tensor_methods  # noqa: F401  (binds operators and methods)
from .autograd import (enable_grad, grad, inference_mode, is_grad_enabled,
                       is_inference_mode_enabled, no_grad, set_grad_enabled)
from ._threads import get_num_threads, set_num_threads
from . import return_types
from .ops.composite import (batch_norm, cross_entropy, dropout, gelu, layer_norm, leaky_relu,
                            log_softmax, logsumexp, one_hot, rms_norm, silu, softmax, softplus,
                            std, std_mean, var, var_mean)
from .ops.conv import conv1d, conv2d
from .ops.conv_transpose import conv_transpose2d
from .ops.creation import (arange, empty, eye, from_numpy, full, full_like, linspace, ones,
                           ones_like, tensor, zeros, zeros_like)
from .ops.elementwise import (abs, add, cast, ceil, clamp, clip, cos, div, eq, erf, exp, expm1,
                              floor, floor_divide, ge, gt, le, log, log1p, logical_and,
                              logical_not, logical_or, logical_xor, lt, maximum, minimum, mod,
                              mul, ne, neg, pow, reciprocal, relu, round, rsqrt, sigmoid, sign,
                              sin, sqrt, square, sub, tanh, where)
from .ops.index import gather, index_add, index_select, scatter_add, take_along_axis
from .ops.linalg import matmul
from .ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from .ops.random import (Generator, default_generator, manual_seed, normal, rand, rand_like,
                         randint, randint_like, randn, randn_like, randperm, uniform)
from .ops.reduce import all, amax, amin, any, argmax, argmin, cumsum, max, mean, min, prod, sum
from .ops.shape import (broadcast_to, cat, chunk, clone, concat, expand, flatten, flip, narrow,
                        pad, permute, reshape, split, squeeze, stack, swapaxes, swapdims,
                        transpose, unsqueeze)
from .ops.sort import argsort, sort, topk
from .ops import decomp as _decomp, layout as _layout, mathops as _mathops  # noqa: E402
from .ops import scan as _scan, scatter as _scatter  # noqa: E402
from .ops.control import cond, scan, while_loop  # noqa: E402  (issue 34: control flow)

for _m in (_decomp, _layout, _mathops, _scan, _scatter):  # issue-17 families: EXPORTS
    globals().update({_n: getattr(_m, _n) for _n in _m.EXPORTS})

from . import nn  # noqa: E402  (layers need the op table loaded)
from . import data, io  # noqa: E402
from .io.checkpoint import CheckpointError, load, save  # noqa: E402
from . import optim  # noqa: E402
from . import train  # noqa: E402
from . import ir, jit, passes  # noqa: E402  (sampan.jit is callable: @sampan.jit)
from . import deploy, prune  # noqa: E402  (issue 19: standalone module, pruning)
from . import linalg  # noqa: E402
from . import utils  # noqa: E402  (sampan.utils.data: torch's import path for sampan.data)
from . import onnx  # noqa: E402  (its lowerings complete the op table's ONNX mappings; the
#                      onnx package itself is imported only when used)
from . import inference  # noqa: E402  (Config, create_predictor over saved programs)

# issues 20-23: each package lists the names it binds on `sampan` in its EXPORTS
from . import amp, distributed, profiler, serving  # noqa: E402
for _m in (amp, distributed, profiler, serving):
    globals().update({_n: getattr(_m, _n) for _n in _m.EXPORTS})

__version__ = "0.1.0"


def device(spec="cpu"):
    """A Device value: ``sampan.device("cpu")``."""
    from .device import as_device
    return as_device(spec)


def is_tensor(obj) -> bool:
    """Whether `obj` is a sampan Tensor (a Parameter is one)."""
    return isinstance(obj, Tensor)


def numel(input) -> int:
    """The number of elements of a tensor. Example: ``sampan.numel(sampan.zeros(2, 3))``."""
    return input.numel()


def empty_like(input, dtype=None, requires_grad=False, device=None):
    """A tensor of `input`'s shape and dtype (zeros, as `sampan.empty`)."""
    return zeros(tuple(input.shape), dtype=dtype or input.dtype, requires_grad=requires_grad,
                 device=device)


def as_tensor(data, dtype=None, device=None):
    """`data` as a tensor without copying when possible: a tensor of the dtype is returned
    itself, a numpy array of a sampan dtype is shared (writes show through both ways).
    Example: ``t = sampan.as_tensor(np.zeros(3))`` (float64, sharing the array)."""
    from .tensor import as_tensor as _as_tensor
    if device is not None:
        from .device import as_device
        as_device(device)
    return _as_tensor(data, dtype)


__all__ = [
    "Tensor", "Device", "device", "cuda_is_available", "Generator", "default_generator",
    "manual_seed",
    # dtypes
    "bool_", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
    "float64", "get_default_dtype", "set_default_dtype", "promote_types", "finfo", "iinfo",
    "long", "int", "short", "half", "float", "double", "bool",
    # errors
    "SampanError", "ShapeError", "DTypeError", "DeviceError", "SampanValueError",
    "SampanIndexError", "AutogradError",
    # autograd
    "grad", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "inference_mode",
    "is_inference_mode_enabled", "set_num_threads", "get_num_threads", "return_types",
    "is_tensor", "numel", "empty_like", "as_tensor",
    # creation
    "tensor", "from_numpy", "zeros", "ones", "full", "empty", "zeros_like", "ones_like",
    "full_like", "arange", "linspace", "eye", "rand", "randn", "randint", "rand_like",
    "randn_like", "randint_like", "randperm", "normal", "uniform",
    # elementwise
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "floor_divide", "mod", "eq", "ne",
    "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "neg",
    "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "erf",
    "reciprocal", "log1p", "expm1", "sign", "floor", "ceil", "round", "square", "clamp", "clip",
    "where", "cast",
    # reductions
    "sum", "mean", "amax", "amin", "max", "min", "prod", "argmax", "argmin", "all", "any",
    "cumsum",
    # shape & index
    "reshape", "permute", "transpose", "expand", "broadcast_to", "squeeze", "unsqueeze",
    "flatten", "concat", "cat", "stack", "split", "chunk", "narrow", "pad", "flip", "clone",
    "swapaxes", "swapdims", "std_mean", "var_mean",
    "index_select", "index_add", "gather", "take_along_axis", "scatter_add", "matmul",
    # composites
    "softmax", "log_softmax", "logsumexp", "var", "std", "layer_norm", "rms_norm", "batch_norm",
    "gelu", "silu", "leaky_relu", "softplus", "one_hot", "dropout", "cross_entropy",
    # convolution, pooling, sorting
    "conv1d", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "sort", "argsort", "topk",
    "nn",
    "optim",
    "train",
    "ir", "jit", "passes",
]
__all__ += ["linalg", "onnx"]
__all__ += ["utils"]
__all__ += ["inference"]
__all__ += ["deploy", "prune"]
from . import quant  # noqa: E402  (issue 19: int8 quantisation)
__all__ += ["quant"]
__all__ += ["amp", "distributed", "profiler", "serving"]
__all__ += [n for m in (amp, distributed, profiler, serving) for n in m.EXPORTS]
__all__ += [n for m in (_decomp, _layout, _mathops, _scan, _scatter) for n in m.EXPORTS]
__all__ += ["cond", "while_loop", "scan"]

# PyTorch's dtype names (torch.float is float32, torch.int int32, torch.long int64 ...).
# Bound last: `float`, `int` and `bool` shadow the builtins in this module's namespace.
long, short, half, double = int64, int16, float16, float64
float, int, bool = float32, int32, bool_  # noqa: A001
