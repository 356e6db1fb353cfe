"""A PyTorch BERT encoder written out with explicit matmuls, as Hugging Face's eager
attention computes it, over HF-named weights: the reference the sampan encoder is checked
against (no transformers, no nn.MultiheadAttention)."""
import math

import numpy as np
import torch


def _lin(x, s, name):
    return x @ s[name + ".weight"].T + s[name + ".bias"]


def _ln(x, s, name, eps):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], s[name + ".weight"],
                                          s[name + ".bias"], eps)


def hidden_states(state, cfg, ids, mask=None, token_types=None):
    """[embeddings output, layer 1 output, ...] for int64 ids (B, S); `state` holds numpy
    arrays under HF names, `cfg` a config.json dict."""
    s = {k: torch.from_numpy(np.asarray(v)) for k, v in state.items()}
    eps = cfg["layer_norm_eps"]
    ids = torch.from_numpy(ids)
    b, n = ids.shape
    tt = torch.zeros_like(ids) if token_types is None else torch.from_numpy(token_types)
    x = (s["embeddings.word_embeddings.weight"][ids]
         + s["embeddings.position_embeddings.weight"][torch.arange(n)][None]
         + s["embeddings.token_type_embeddings.weight"][tt])
    x = _ln(x, s, "embeddings.LayerNorm", eps)
    out = [x]
    heads = cfg["num_attention_heads"]
    d = x.shape[-1] // heads
    bias = 0.0
    if mask is not None:
        m = torch.from_numpy(mask).to(torch.float32)[:, None, None, :]
        bias = (1.0 - m) * torch.finfo(torch.float32).min
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def split(t):
            return t.view(b, n, heads, d).transpose(1, 2)
        q = split(_lin(x, s, p + "attention.self.query"))
        k = split(_lin(x, s, p + "attention.self.key"))
        v = split(_lin(x, s, p + "attention.self.value"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias
        ctx = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, n, heads * d)
        x = _ln(_lin(ctx, s, p + "attention.output.dense") + x, s,
                p + "attention.output.LayerNorm", eps)
        h = torch.nn.functional.gelu(_lin(x, s, p + "intermediate.dense"))
        x = _ln(_lin(h, s, p + "output.dense") + x, s, p + "output.LayerNorm", eps)
        out.append(x)
    return out


def sentence_embeddings(state, cfg, ids, mask):
    """Mean pooling over the mask, then L2 normalisation (sentence-transformers' way)."""
    with torch.no_grad():
        h = hidden_states(state, cfg, ids, mask)[-1]
        m = torch.from_numpy(mask).to(h.dtype).unsqueeze(-1)
        e = (h * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
        return torch.nn.functional.normalize(e, p=2, dim=1).numpy()
