"""MultiHeadAttention, TransformerEncoderLayer and a pre-norm GPT decoder block."""
from __future__ import annotations

import numpy as np

from ..errors import SampanValueError, ShapeError, op_error
from ..ops.elementwise import logical_not
from ..ops.reduce import mean
from ..ops.shape import permute, reshape, transpose
from ..tensor import Tensor
from . import functional as F
from .activation import GELU, ReLU
from .container import Sequential
from .layer import Layer
from .linear import Dropout, Linear
from .norm import LayerNorm


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(x)


class MultiHeadAttention(Layer):
    """Multi-head attention with separate q/k/v/out projections (`q_proj`, `k_proj`,
    `v_proj`, `out_proj`, each an `nn.Linear`).

    Masks follow PyTorch's `nn.MultiheadAttention`: `key_padding_mask` (B, S) and a bool
    `attn_mask` (L, S) or (B*heads, L, S) are True where attention is *not* allowed; a
    float mask is added to the scores. `is_causal=True` adds a causal mask. With
    `batch_first=False` (the default, as in PyTorch) inputs are (L, B, E).
    Returns ``(output, weights)``; weights are None unless `need_weights`.

    Example::

        >>> mha = nn.MultiHeadAttention(64, 4, batch_first=True)
        >>> x = sampan.randn(2, 10, 64)
        >>> out, _ = mha(x, x, x, is_causal=True)
        >>> out.shape
        (2, 10, 64)
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, kdim=None, vdim=None,
                 batch_first=False, dtype=None):
        super().__init__()
        if embed_dim % num_heads:
            raise op_error(SampanValueError, "MultiHeadAttention", f"embed_dim={embed_dim} "
                           f"and num_heads={num_heads}", "embed_dim divisible by num_heads")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        self.q_proj = Linear(embed_dim, embed_dim, bias, dtype=dtype)
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.k_proj = Linear(kdim or embed_dim, embed_dim, bias, dtype=dtype)
        self.v_proj = Linear(vdim or embed_dim, embed_dim, bias, dtype=dtype)
        self.out_proj = Linear(embed_dim, embed_dim, bias, dtype=dtype)

    def _check_inputs(self, query, key, value):
        """Shapes checked here, so a mistake names this layer and the user's line, not a
        reshape or matmul deep inside."""
        layout = "(B, L, E)" if self.batch_first else "(L, B, E)"
        if query.ndim != 3 or query.shape[-1] != self.embed_dim:
            raise op_error(ShapeError, "MultiHeadAttention", f"query of shape "
                           f"{tuple(query.shape)}", f"{layout} with E={self.embed_dim}")
        bdim = 0 if self.batch_first else 1
        for what, t, width in (("key", key, self.kdim), ("value", value, self.vdim)):
            if t.ndim != 3 or t.shape[-1] != width or t.shape[bdim] != query.shape[bdim]:
                raise op_error(ShapeError, "MultiHeadAttention", f"{what} of shape "
                               f"{tuple(t.shape)} for query {tuple(query.shape)}",
                               f"{layout} with the query's batch {query.shape[bdim]} and "
                               f"width {width}")
        if key.shape[1 - bdim] != value.shape[1 - bdim]:
            raise op_error(ShapeError, "MultiHeadAttention", f"key {tuple(key.shape)} and "
                           f"value {tuple(value.shape)}", "one source length for both")

    def _heads(self, x):
        b, n = x.shape[0], x.shape[1]
        return permute(reshape(x, (b, n, self.num_heads, self.head_dim)), (0, 2, 1, 3))

    def forward(self, query, key=None, value=None, key_padding_mask=None, attn_mask=None,
                is_causal=False, need_weights=False, average_attn_weights=True):
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        if not self.batch_first:
            query, key, value = (transpose(t, 0, 1) for t in (query, key, value))
        b, L = query.shape[0], query.shape[1]
        S = key.shape[1]
        q = self._heads(self.q_proj(query))
        k = self._heads(self.k_proj(key))
        v = self._heads(self.v_proj(value))
        allowed, additive = None, None
        if key_padding_mask is not None:
            m = _t(key_padding_mask)
            if tuple(m.shape) != (b, S):
                raise op_error(ShapeError, "MultiHeadAttention", f"key_padding_mask of shape "
                               f"{tuple(m.shape)}", f"(batch, source length) = {(b, S)}")
            m = reshape(m, (b, 1, 1, S))
            if m.dtype == np.bool_:
                allowed = logical_not(m)
            else:
                additive = m
        if attn_mask is not None:
            m = _t(attn_mask)
            if tuple(m.shape) not in ((L, S), (b * self.num_heads, L, S)):
                raise op_error(ShapeError, "MultiHeadAttention", f"attn_mask of shape "
                               f"{tuple(m.shape)}", f"(target length, source length) = "
                               f"{(L, S)} or (batch * num_heads, L, S) = "
                               f"{(b * self.num_heads, L, S)}")
            if m.ndim == 3:
                m = reshape(m, (b, self.num_heads, L, S))
            if m.dtype == np.bool_:
                m = logical_not(m)
                allowed = m if allowed is None else (allowed & m)
            else:
                additive = m if additive is None else additive + m
        p_drop = self.dropout if self.training else 0.0
        out, p = F.attention(q, k, v, allowed, additive, is_causal, p_drop)
        out = reshape(permute(out, (0, 2, 1, 3)), (b, L, self.embed_dim))
        out = self.out_proj(out)
        if not self.batch_first:
            out = transpose(out, 0, 1)
        if not need_weights:
            return out, None
        return out, (mean(p, 1) if average_attn_weights else p)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")


def _activation(name):
    if isinstance(name, Layer):
        return name
    table = {"relu": ReLU, "gelu": GELU}
    if name not in table:
        raise op_error(SampanValueError, "Transformer layer", f"activation {name!r}",
                       "'relu', 'gelu' or a Layer")
    return table[name]()


class TransformerEncoderLayer(Layer):
    """Self-attention + feed-forward block, post-norm by default (`norm_first=True` for
    pre-norm); sub-layer names follow PyTorch (self_attn, linear1, linear2, norm1, norm2).

    Example::

        >>> layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        >>> layer(sampan.randn(2, 10, 64)).shape
        (2, 10, 64)
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 dtype=None):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout, bias,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def _sa(self, x, mask, kpm, is_causal):
        out, _ = self.self_attn(x, x, x, key_padding_mask=kpm, attn_mask=mask,
                                is_causal=is_causal)
        return self.dropout1(out)

    def _ff(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff(x))


class TransformerDecoderBlock(Layer):
    """Pre-norm GPT block on (B, T, C) input:
    ``x + attn(ln_1(x))`` with causal self-attention, then ``x + mlp(ln_2(x))`` with a
    GELU MLP of width ``mlp_ratio * d_model``.

    Example::

        >>> block = nn.TransformerDecoderBlock(256, 4)
        >>> block(sampan.randn(8, 128, 256)).shape
        (8, 128, 256)
    """

    def __init__(self, d_model, n_head, mlp_ratio=4, dropout=0.0, bias=True, eps=1e-5,
                 activation="gelu", dtype=None):
        super().__init__()
        self.ln_1 = LayerNorm(d_model, eps, dtype=dtype)
        self.attn = MultiHeadAttention(d_model, n_head, dropout, bias, batch_first=True,
                                       dtype=dtype)
        self.ln_2 = LayerNorm(d_model, eps, dtype=dtype)
        hidden = int(mlp_ratio * d_model)
        self.mlp = Sequential(Linear(d_model, hidden, bias, dtype=dtype), _activation(activation),
                              Linear(hidden, d_model, bias, dtype=dtype))
        self.drop = Dropout(dropout)

    def forward(self, x, key_padding_mask=None):
        a, _ = self.attn(self.ln_1(x), key_padding_mask=key_padding_mask, is_causal=True)
        x = x + self.drop(a)
        return x + self.drop(self.mlp(self.ln_2(x)))


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["MultiHeadAttention", "TransformerEncoderLayer", "TransformerDecoderBlock"]
