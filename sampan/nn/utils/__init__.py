"""`sampan.nn.utils`: gradient clipping, parameter vectors and `rnn` (padded and packed
sequences), at PyTorch's import paths.

The clipping functions are those of `sampan.optim` (one implementation); here they also
take PyTorch's `foreach=` keyword (accepted and ignored: sampan has one code path).

Example::

    >>> loss.backward()
    >>> nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    >>> flat = nn.utils.parameters_to_vector(model.parameters())
"""
from __future__ import annotations

import numpy as np

from ...errors import DTypeError, ShapeError
from ...optim import clip as _clip
from ...tensor import Tensor
from . import rnn


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scale all gradients together so their joint `norm_type` norm (inf allowed) is at
    most `max_norm`; returns the norm before clipping. See `sampan.optim.clip_grad_norm_`.

    Example: ``nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type="inf")``"""
    return _clip.clip_grad_norm_(parameters, max_norm, float(norm_type), error_if_nonfinite)


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element into [-clip_value, clip_value] in place.

    Example: ``nn.utils.clip_grad_value_(model.parameters(), 0.5)``"""
    return _clip.clip_grad_value_(parameters, clip_value)


def _params(parameters):
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def parameters_to_vector(parameters):
    """All parameters flattened and joined into one 1-d tensor (differentiable).

    Example: ``nn.utils.parameters_to_vector(nn.Linear(3, 2).parameters()).shape`` is (8,)"""
    from ...ops.shape import concat, reshape
    ps = _params(parameters)
    return concat([reshape(p, (-1,)) for p in ps], 0)


def vector_to_parameters(vec, parameters):
    """Copy consecutive slices of the 1-d `vec` into `parameters` (in place, not recorded
    by autograd, as PyTorch's ``param.data = ...``).

    Example: ``nn.utils.vector_to_parameters(v, model.parameters())``"""
    if not isinstance(vec, Tensor):
        raise DTypeError(f"vector_to_parameters: got {type(vec).__name__}; expected a "
                         "sampan Tensor")
    ps = _params(parameters)
    need = sum(p.numel() for p in ps)
    if vec.ndim != 1 or vec.numel() != need:
        raise ShapeError(f"vector_to_parameters: got a vector of shape {tuple(vec.shape)}; "
                         f"expected shape ({need},), the parameters' total size")
    from ...autograd.tape import bump_version
    a = np.asarray(vec._data)
    start = 0
    for p in ps:
        n = p.numel()
        p._data[...] = a[start:start + n].reshape(p.shape).astype(p.dtype, copy=False)
        bump_version(p)
        start += n


__all__ = ["rnn", "clip_grad_norm_", "clip_grad_value_", "parameters_to_vector",
           "vector_to_parameters"]
