"""`TransformerEncoder`, `TransformerDecoderLayer`, `TransformerDecoder` and `Transformer`,
with PyTorch's constructor arguments, forward arguments and sub-layer names (``layers.0.
self_attn``, ``multihead_attn``, ``norm1..3``, ``encoder.norm`` …), so a state dict maps
across by name (Linear weights transposed: sampan's Linear is ``(in, out)``).

Example::

    >>> model = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2,
    ...                        num_decoder_layers=2, dim_feedforward=64, batch_first=True)
    >>> src, tgt = sampan.randn(2, 7, 32), sampan.randn(2, 5, 32)
    >>> mask = nn.Transformer.generate_square_subsequent_mask(5)
    >>> model(src, tgt, tgt_mask=mask).shape
    (2, 5, 32)
"""
from __future__ import annotations

import copy

import numpy as np

from ..errors import SampanValueError, ShapeError, op_error
from ..tensor import Tensor
from .attention import MultiHeadAttention, TransformerEncoderLayer, _activation
from .container import LayerList
from .layer import Layer
from .linear import Dropout, Linear
from .norm import LayerNorm


def _clones(layer, n, what):
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise op_error(SampanValueError, what, f"num_layers={n!r}", "a positive int")
    return LayerList([copy.deepcopy(layer) for _ in range(n)])


class _Stack(Layer):
    """`num_layers` deep copies of `layer` in `self.layers`, then `norm` if given."""

    def __init__(self, layer, num_layers, norm, what):
        super().__init__()
        self.layers = _clones(layer, num_layers, what)
        self.num_layers = num_layers
        self.norm = norm

    @property
    def layers(self):
        """The stack of layers (PyTorch's name; it shadows `Layer.layers()`, which lists
        sub-layers: use `Layer.layers(encoder)` or `named_layers()` for that)."""
        return self._layers["layers"]


class TransformerEncoder(_Stack):
    """`num_layers` copies of `encoder_layer` (a `TransformerEncoderLayer`), then `norm`
    if given. `enable_nested_tensor` and `mask_check` are accepted for PyTorch
    compatibility; sampan has no nested tensors, so they change nothing."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__(encoder_layer, num_layers, norm, "TransformerEncoder")

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


class TransformerDecoderLayer(Layer):
    """Self-attention, cross-attention over the encoder's `memory`, then feed-forward;
    post-norm by default (`norm_first=True` for pre-norm), as PyTorch's."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 dtype=None):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout, bias,
                                            batch_first=batch_first, dtype=dtype)
        self.multihead_attn = MultiHeadAttention(d_model, nhead, dropout, bias,
                                                 batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype)
        self.norm3 = LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)

    def _sa(self, x, mask, kpm, is_causal):
        out, _ = self.self_attn(x, x, x, key_padding_mask=kpm, attn_mask=mask,
                                is_causal=is_causal)
        return self.dropout1(out)

    def _mha(self, x, mem, mask, kpm, is_causal):
        out, _ = self.multihead_attn(x, mem, mem, key_padding_mask=kpm, attn_mask=mask,
                                     is_causal=is_causal)
        return self.dropout2(out)

    def _ff(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                              memory_is_causal)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha(x, memory, memory_mask, memory_key_padding_mask,
                                     memory_is_causal))
        return self.norm3(x + self._ff(x))


class TransformerDecoder(_Stack):
    """`num_layers` copies of `decoder_layer`, then `norm` if given."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__(decoder_layer, num_layers, norm, "TransformerDecoder")

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return self.norm(x) if self.norm is not None else x


class Transformer(Layer):
    """The encoder-decoder Transformer of "Attention is all you need", as
    `torch.nn.Transformer`: an encoder of `num_encoder_layers` layers and a decoder of
    `num_decoder_layers`, each ending in a LayerNorm."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=False,
                 norm_first=False, bias=True, dtype=None):
        super().__init__()
        kw = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                  layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                  norm_first=norm_first, bias=bias, dtype=dtype)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(
                TransformerEncoderLayer(d_model, nhead, **kw), num_encoder_layers,
                LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(
                TransformerDecoderLayer(d_model, nhead, **kw), num_decoder_layers,
                LayerNorm(d_model, layer_norm_eps, bias=bias, dtype=dtype))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        bdim = 0 if self.batch_first else 1
        if src.ndim == 3 and tgt.ndim == 3 and src.shape[bdim] != tgt.shape[bdim]:
            raise op_error(ShapeError, "Transformer", f"src {tuple(src.shape)} and tgt "
                           f"{tuple(tgt.shape)}", "one batch size for both")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise op_error(ShapeError, "Transformer", f"src {tuple(src.shape)} and tgt "
                           f"{tuple(tgt.shape)}", f"feature size d_model={self.d_model}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, device=None, dtype=None):
        """A float (sz, sz) mask: 0 on and below the diagonal, -inf above (future steps)."""
        from .. import dtypes as _dt
        d = _dt.as_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
        m = np.triu(np.full((sz, sz), -np.inf), 1).astype(d)
        return Tensor(m)


# the names sampan.nn exports from this module (not __all__: the module itself is not API)
EXPORTS = ["TransformerEncoder", "TransformerDecoderLayer", "TransformerDecoder",
           "Transformer"]
