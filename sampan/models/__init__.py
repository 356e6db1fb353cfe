"""`sampan.models`: pretrained model families that load checkpoints published elsewhere.

`sampan.models.bert`: a BERT-family encoder (`BertConfig`, `BertModel`) that reads a Hugging
Face checkpoint directory (`config.json` + `model.safetensors`, never a pickle) with
`load_hf`, and sentence embeddings (`SentenceEncoder`, `mean_pool`, `sentence_embeddings`)
as sentence-transformers computes them.

Example::

    >>> from sampan.models import bert
    >>> model = bert.load_hf("all-MiniLM-L6-v2/")
    >>> emb = bert.sentence_embeddings(model, ["a sentence"], tokenizer)
"""
from .bert import (BertConfig, BertModel, ModelError, SentenceEncoder, load_hf, mean_pool,
                   sentence_embeddings)

__all__ = ["BertConfig", "BertModel", "ModelError", "SentenceEncoder", "load_hf", "mean_pool",
           "sentence_embeddings"]
