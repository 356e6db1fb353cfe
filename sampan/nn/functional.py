"""`sampan.nn.functional`: the stateless functions under every layer.

Everything here is written with ops from the op table (composites where they
exist), so autograd and tracing handle it with no rules of their own. Linear
weights use sampan's layout ``(in_features, out_features)``: ``y = x @ W + b``.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, SampanIndexError, ShapeError, op_error
from ..ops import composite as _C
from ..ops.composite import (batch_norm, gelu, layer_norm, log_softmax, logsumexp, one_hot,
                             rms_norm, silu, softmax, softplus)
from ..ops.elementwise import add, eq, mul, relu, rsqrt, sigmoid, sub, tanh, where
from ..ops._util import lead_size
from ..ops.index import index_select
from ..ops.linalg import MATMUL, matmul
from ..ops.modes import as_inputs_of
from ..ops.reduce import mean, sum
from ..ops.shape import reshape, transpose, unsqueeze
from ..tensor import Tensor
from ._losses import (binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy,
                      huber_loss, kl_div, l1_loss, mse_loss, nll_loss, smooth_l1_loss)


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


# ---------------------------------------------------------------------- linear layers
def linear(x, weight, bias=None):
    """``x @ weight + bias`` with weight of shape (in_features, out_features).

    Example::

        >>> F.linear(sampan.randn(2, 3), sampan.randn(3, 4)).shape
        (2, 4)
    """
    x = _t(x)
    if x.shape[-1] != weight.shape[0]:
        raise op_error(ShapeError, "linear", f"input {tuple(x.shape)} and weight "
                       f"{tuple(weight.shape)}", "input.shape[-1] == weight.shape[0] "
                       "(weight layout is (in_features, out_features))")
    if x.ndim > 2:  # one 2-d GEMM instead of a batched one (also a 2-d weight gradient)
        lead = tuple(x.shape[:-1])
        y = matmul(reshape(x, (lead_size(lead), x.shape[-1])), weight)
        if bias is not None:
            y = add(y, _amp_bias(y, bias))
        return reshape(y, lead + (weight.shape[1],))
    y = matmul(x, weight)
    return y if bias is None else add(y, _amp_bias(y, bias))


def _amp_bias(y, bias):
    """linear is one op in PyTorch, its bias an input of it: under autocast the bias is
    cast as matmul's own inputs are (the op table's policy), so y keeps the GEMM's dtype
    instead of being promoted back to float32."""
    (bias,) = as_inputs_of(MATMUL, _t(bias))
    return bias


def bilinear(x1, x2, weight, bias=None):
    """``y[..., k] = x1 @ weight[k] @ x2 + bias[k]`` with weight (out, in1, in2).

    Example::

        >>> F.bilinear(sampan.randn(2, 3), sampan.randn(2, 5), sampan.randn(4, 3, 5)).shape
        (2, 4)
    """
    x1, x2 = _t(x1), _t(x2)
    out, in1, in2 = weight.shape
    if x1.shape[-1] != in1 or x2.shape[-1] != in2 or x1.shape[:-1] != x2.shape[:-1]:
        raise op_error(ShapeError, "bilinear", f"inputs {tuple(x1.shape)}, {tuple(x2.shape)} "
                       f"and weight {tuple(weight.shape)}", f"inputs (..., {in1}) and "
                       f"(..., {in2}) with equal leading dims")
    lead = tuple(x1.shape[:-1])
    a = reshape(x1, (-1, in1))
    b = reshape(x2, (-1, in2))
    w = reshape(transpose(weight, 0, 1), (in1, out * in2))
    t = reshape(matmul(a, w), (-1, out, in2))
    y = sum(mul(t, unsqueeze(b, 1)), -1)
    if bias is not None:
        y = add(y, bias)
    return reshape(y, lead + (out,))


def embedding(ids, weight, padding_idx=None):
    """Rows of `weight` picked by integer `ids`; rows at `padding_idx` get no gradient.

    Example::

        >>> F.embedding(sampan.tensor([[0, 2]]), sampan.randn(5, 3)).shape
        (1, 2, 3)
    """
    ids = _t(ids)
    if not _dt.is_integer(ids.dtype):
        raise op_error(DTypeError, "embedding", f"ids of dtype {ids.dtype}", "integer ids")
    n = weight.shape[0]
    a = ids._data
    # negative ids are refused, as in PyTorch (index_select would read -1 as the last row)
    if a.size and isinstance(a, np.ndarray) and (a.min() < 0 or a.max() >= n):
        raise op_error(SampanIndexError, "embedding", f"ids in [{a.min()}, {a.max()}]",
                       f"ids in [0, {n}) for a table of {n} rows")
    out = reshape(index_select(weight, reshape(ids, (-1,)), 0),
                  tuple(ids.shape) + (weight.shape[1],))
    if padding_idx is not None:
        pad = unsqueeze(eq(ids, padding_idx % n), -1)
        out = where(pad, out.detach(), out)
    return out


# activations and dropout: in _f_basic.py (PyTorch's signatures, inplace=)


# ---------------------------------------------------------------------- normalisation
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalise each group of channels (dim 1) per sample, then scale and shift.

    Example: ``F.group_norm(sampan.randn(2, 6, 4), 3).shape`` is (2, 6, 4)"""
    x = _t(x)
    n, c = x.shape[0], x.shape[1]
    if c % num_groups:
        raise op_error(ShapeError, "group_norm", f"{c} channels and {num_groups} groups",
                       "a channel count divisible by the group count")
    g = reshape(x, (n, num_groups, -1))
    m = mean(g, 2, keepdims=True)
    d = sub(g, m)
    v = mean(mul(d, d), 2, keepdims=True)
    y = reshape(mul(d, rsqrt(add(v, eps))), tuple(x.shape))
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = mul(y, reshape(weight, shape))
    if bias is not None:
        y = add(y, reshape(bias, shape))
    return y


# ---------------------------------------------------------------------- attention
_CAUSAL = {}


def causal_mask(q_len, k_len):
    """Bool (q_len, k_len) mask, True where query i may attend key j (j <= i; top-left
    aligned, as in PyTorch). Cached per size. Example: ``F.causal_mask(3, 3)``."""
    key = (q_len, k_len)
    m = _CAUSAL.get(key)
    if m is None:
        m = Tensor(np.tril(np.ones((q_len, k_len), bool)))
        if len(_CAUSAL) < 64:
            _CAUSAL[key] = m
    return m


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, training=True, generator=None):
    """softmax(q @ k^T * scale + mask) @ v over (..., L, E) queries and (..., S, E) keys.

    `attn_mask` is a bool mask (True = may attend, as in PyTorch's function) or an
    additive float mask, broadcast to (..., L, S). `is_causal` adds a causal mask.

    Example::

        >>> q = sampan.randn(2, 4, 5, 8)
        >>> F.scaled_dot_product_attention(q, q, q, is_causal=True).shape
        (2, 4, 5, 8)
    """
    allowed, additive = None, None
    if attn_mask is not None:
        attn_mask = _t(attn_mask)
        if attn_mask.dtype == np.bool_:
            allowed = attn_mask
        else:
            additive = attn_mask
    return attention(q, k, v, allowed, additive, is_causal, dropout_p if training else 0.0,
                     scale, generator)[0]


def attention(q, k, v, allowed=None, additive=None, is_causal=False, dropout_p=0.0,
              scale=None, generator=None):
    """The attention kernel behind `scaled_dot_product_attention` and MultiHeadAttention:
    returns (output, probabilities). `allowed`: bool mask, True = may attend;
    `additive`: float mask added to the scores. Example: ``out, p = F.attention(q, k, v)``."""
    q, k, v = _t(q), _t(k), _t(v)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise op_error(ShapeError, "scaled_dot_product_attention",
                       f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}",
                       "q (..., L, E), k (..., S, E), v (..., S, Ev)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    # scale q (L x E) rather than the scores (L x S): fewer multiplications
    s = matmul(mul(q, scale), transpose(k, -2, -1))
    if is_causal and allowed is None and additive is None:
        # causal alone: one add of a cached 0 / "-inf" matrix; no row is fully masked
        return _softmax_av(add(s, _causal_bias(q.shape[-2], k.shape[-2], s.dtype)), v,
                           dropout_p, generator)
    if is_causal:
        c = causal_mask(q.shape[-2], k.shape[-2])
        allowed = c if allowed is None else (c & allowed)
    if additive is not None:
        s = add(s, additive)
    if allowed is not None:  # a finite "minus infinity": fully masked rows stay NaN-free
        s = where(allowed, s, _neg_big(s.dtype))
    p = softmax(s, -1)
    if allowed is not None:  # fully masked rows give zeros
        p = where(allowed, p, 0.0)
    if dropout_p > 0.0:
        p = _C.dropout(p, dropout_p, True, generator)
    return matmul(p, v), p


def _softmax_av(s, v, dropout_p, generator):
    p = softmax(s, -1)
    if dropout_p > 0.0:
        p = _C.dropout(p, dropout_p, True, generator)
    return matmul(p, v), p


def _neg_big(dtype):
    return -65504.0 if dtype == np.float16 else -1e30


def _causal_bias(q_len, k_len, dtype):
    key = (q_len, k_len, np.dtype(dtype).name)
    m = _CAUSAL.get(key)
    if m is None:
        a = np.where(np.tril(np.ones((q_len, k_len), bool)), 0.0, _neg_big(dtype))
        m = Tensor(a.astype(dtype))
        if len(_CAUSAL) < 64:
            _CAUSAL[key] = m
    return m


# ---------------------------------------------------------------------- conv & pooling
try:  # the conv and pool op families (absent from builds without them)
    from ..ops.conv import conv1d, conv2d
    from ..ops.conv_transpose import conv_transpose2d
    from ..ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
except ImportError:  # pragma: no cover
    pass

__all__ = [
    "linear", "bilinear", "embedding", "relu", "relu6", "leaky_relu", "elu", "gelu", "silu",
    "mish", "glu", "hardtanh", "tanh", "sigmoid", "softplus", "softmax", "log_softmax",
    "logsumexp", "one_hot", "dropout", "layer_norm", "rms_norm", "batch_norm", "group_norm",
    "normalize", "scaled_dot_product_attention", "attention", "causal_mask", "cross_entropy",
    "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div",
    "conv1d", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
]

# issue 17: the functional forms of each area live in their own module
from ._f_basic import *  # noqa: E402,F401,F403
from ._f_linalg import *  # noqa: E402,F401,F403
from ._f_rnn import *  # noqa: E402,F401,F403
from ._f_spatial import *  # noqa: E402,F401,F403
from . import _f_basic, _f_linalg, _f_rnn, _f_spatial  # noqa: E402

__all__ += _f_basic.__all__ + _f_linalg.__all__ + _f_spatial.__all__ + _f_rnn.__all__
