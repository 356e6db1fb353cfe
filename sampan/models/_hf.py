"""Hugging Face BERT checkpoints: their parameter names onto `BertModel`'s, and back.

A checkpoint directory holds `config.json` and `model.safetensors`; the weights are read
with the `safetensors` package (a header of names, dtypes and offsets, then raw bytes), so
nothing in the file is executed. `pytorch_model.bin` (a pickle) is never read. HF stores a
Linear's weight as (out, in) for ``y = x @ W.T + b``; sampan's Linear is (in, out), so
those are transposed on the way in and out. Checkpoints of task models (`BertForMaskedLM`
and friends) keep the encoder under a `bert.` prefix, which is stripped; their heads are
not part of the encoder and are reported as unused.

`bert.load_hf` reads a checkpoint through these (this module knows the names, not the
layers, so it imports nothing of `bert.py`).

Example::

    >>> model = bert.load_hf("all-MiniLM-L6-v2")      # a directory, or its model.safetensors
    >>> sorted(to_hf_state(model))[:2]
    ['embeddings.LayerNorm.bias', 'embeddings.LayerNorm.weight']
"""
from __future__ import annotations

import os

import numpy as np

from ._config import BertConfig, ModelError

WEIGHTS = "model.safetensors"
CONFIG = "config.json"

# HF sub-name of each encoder layer -> BertLayer attribute, and whether it is a Linear
_LAYER = [("attention.self.query", "query", True), ("attention.self.key", "key", True),
          ("attention.self.value", "value", True),
          ("attention.output.dense", "attn_out", True),
          ("attention.output.LayerNorm", "attn_norm", False),
          ("intermediate.dense", "ffn_in", True), ("output.dense", "ffn_out", True),
          ("output.LayerNorm", "ffn_norm", False)]
_EMB = [("embeddings.word_embeddings", "embeddings.word"),
        ("embeddings.position_embeddings", "embeddings.position"),
        ("embeddings.token_type_embeddings", "embeddings.token_type"),
        ("embeddings.LayerNorm", "embeddings.norm")]
_IGNORED = {"embeddings.position_ids"}          # a buffer holding arange(max positions)
_LEGACY = {"gamma": "weight", "beta": "bias"}   # TF-converted LayerNorm names


def name_map(config: BertConfig, pooler: bool) -> dict:
    """{sampan parameter name: (HF name, transposed)} for a BertModel of `config`.
    Example: ``name_map(cfg, False)["encoder.0.query.weight"]`` is
    ``("encoder.layer.0.attention.self.query.weight", True)``"""
    m = {}
    for hf, ours in _EMB:
        m[f"{ours}.weight"] = (f"{hf}.weight", False)
    m["embeddings.norm.bias"] = ("embeddings.LayerNorm.bias", False)
    for i in range(config.num_hidden_layers):
        for hf, ours, linear in _LAYER:
            m[f"encoder.{i}.{ours}.weight"] = (f"encoder.layer.{i}.{hf}.weight", linear)
            m[f"encoder.{i}.{ours}.bias"] = (f"encoder.layer.{i}.{hf}.bias", False)
    if pooler:
        m["pooler.weight"] = ("pooler.dense.weight", True)
        m["pooler.bias"] = ("pooler.dense.bias", False)
    return m


def _canonical(names):
    """{HF canonical name: name in the file}: `bert.` prefix stripped when the encoder
    sits under it, legacy LayerNorm gamma/beta renamed."""
    prefixed = any(n.startswith("bert.embeddings.") for n in names)
    out = {}
    for n in names:
        c = n[5:] if prefixed and n.startswith("bert.") else n
        head, _, leaf = c.rpartition(".")
        if head.endswith("LayerNorm") and leaf in _LEGACY:
            c = f"{head}.{_LEGACY[leaf]}"
        out[c] = n
    return out


def from_hf_state(model: BertModel, state: dict,  # noqa: F821  (bert.py's, not imported)
                  where: str = "from_hf_state") -> list:
    """Copy HF-named arrays `state` into `model` (Linear weights transposed); every
    encoder parameter must be there with its shape. Returns the names left unused.
    Example: ``unused = from_hf_state(model, safetensors.numpy.load_file(f))``"""
    names = _canonical(list(state))
    mapping = name_map(model.config, model.pooler is not None)
    params = dict(model.named_parameters())
    used = set()
    for ours, (hf, transposed) in mapping.items():
        p = params[ours]
        key = names.get(hf)
        if key is None:
            raise ModelError(f"{where}: the checkpoint has no {hf!r} (for {ours}); a BERT "
                             f"checkpoint of {model.config.num_hidden_layers} layers holds it")
        a = np.asarray(state[key])
        if a.dtype.kind != "f" and a.dtype.name != "bfloat16":   # ml_dtypes' kind is "V"
            raise ModelError(f"{where}: {key!r} has dtype {a.dtype}; expected floating point")
        a = a.astype(np.float32, copy=False)      # float16 / bfloat16 checkpoints too
        want = tuple(p.shape[::-1]) if transposed else tuple(p.shape)
        if tuple(a.shape) != want:
            raise ModelError(f"{where}: {key!r} has shape {list(a.shape)}; the config "
                             f"expects {list(want)}")
        if not np.isfinite(a).all():
            raise ModelError(f"{where}: {key!r} holds NaN or infinite values")
        p._data[...] = a.T if transposed else a
        used.add(key)
    return sorted(k for c, k in names.items() if k not in used and c not in _IGNORED)


def to_hf_state(model: BertModel) -> dict:  # noqa: F821  (bert.py's, not imported)
    """The model's parameters under HF names, Linear weights transposed back to (out, in)
    (what `from_hf_state` reads). Example: ``to_hf_state(model)["pooler.dense.bias"]``"""
    params = dict(model.named_parameters())
    return {hf: np.ascontiguousarray(params[ours].numpy().T if t else params[ours].numpy())
            for ours, (hf, t) in name_map(model.config, model.pooler is not None).items()}


def _paths(path):
    path = os.fspath(path)
    if os.path.isdir(path):
        d, w = path, os.path.join(path, WEIGHTS)
    else:
        d, w = os.path.dirname(path) or ".", path
    if not os.path.exists(w):
        pickled = [n for n in ("pytorch_model.bin", "model.pt") if os.path.exists(
            os.path.join(d, n))]
        note = (f"; {pickled[0]} is a pickle, which sampan never loads (convert it to "
                "safetensors)") if pickled else ""
        raise ModelError(f"load_hf: {w} does not exist{note}")
    return d, w


def read_safetensors(path) -> dict:
    """{name: numpy array} of a safetensors file; a truncated or malformed file fails here
    with ModelError. Example: ``read_safetensors("model.safetensors")``"""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ModelError("load_hf: reading model.safetensors needs the safetensors package "
                         "(pip install 'sampan[io]')") from None
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for bf16 checkpoints)
    try:
        with safe_open(path, framework="np") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise ModelError(f"load_hf: {path} is not a readable safetensors file: {e}") from None
