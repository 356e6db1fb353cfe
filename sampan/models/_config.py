"""The config of a BERT-family encoder (`BertConfig`, read from a Hugging Face
`config.json`) and `ModelError`: what both `bert.py` (the layers) and `_hf.py` (the
checkpoint names) build on, so neither imports the other back."""
from __future__ import annotations

import dataclasses
import json
import os

from ..errors import SampanError


class ModelError(SampanError):
    """A model config or checkpoint that sampan cannot use (names the file and the key)."""


# ---------------------------------------------------------------------- config
_ACTIVATIONS = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh",
                "gelu_fast": "tanh", "relu": "relu", "silu": "silu", "swish": "silu"}


@dataclasses.dataclass
class BertConfig:
    """The fields of a Hugging Face BERT `config.json` that the encoder reads (the rest,
    such as dropout during fine-tuning bookkeeping or `architectures`, are ignored).

    Example: ``BertConfig.from_json("all-MiniLM-L6-v2/config.json").hidden_size`` is 384"""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    model_type: str = "bert"

    def __post_init__(self):
        where = "BertConfig"
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelError(f"{where}: {k} is {v!r}; expected a positive int")
        if self.hidden_size % self.num_attention_heads:
            raise ModelError(f"{where}: hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in _ACTIVATIONS:
            raise ModelError(f"{where}: hidden_act {self.hidden_act!r} is not supported; "
                             f"expected one of {sorted(_ACTIVATIONS)}")
        if self.position_embedding_type != "absolute":
            raise ModelError(f"{where}: position_embedding_type "
                             f"{self.position_embedding_type!r} is not supported; expected "
                             "'absolute'")
        if self.model_type != "bert":
            raise ModelError(f"{where}: model_type {self.model_type!r} is not supported; "
                             "expected 'bert' (RoBERTa-style models number positions "
                             "differently)")
        for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise ModelError(f"{where}: {k} is {v!r}; expected a number in [0, 1)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d: dict, where: str = "BertConfig.from_dict") -> "BertConfig":
        """The known fields of `d` (a parsed config.json); unknown keys are ignored."""
        if not isinstance(d, dict):
            raise ModelError(f"{where}: expected a JSON object; got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("model_type") is None:
            kw.pop("model_type", None)
        try:
            return cls(**kw)
        except ModelError as e:
            raise ModelError(f"{where}: {e}") from None

    @classmethod
    def from_json(cls, path) -> "BertConfig":
        """Read `config.json` (the file, or the checkpoint directory that holds it)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise ModelError(f"BertConfig.from_json: {path} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelError(f"BertConfig.from_json: {path} is not readable JSON: {e}") from None
        return cls.from_dict(d, f"BertConfig.from_json({path})")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
