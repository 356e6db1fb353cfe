"""sampan.models.bert on a tiny random BERT: every layer against a PyTorch encoder written
out with explicit matmuls (torch_ref.py) over the same weights, the HF name mapping both
ways, loading errors, mean pooling, and serving through jit.save + a Predictor."""
import json

import numpy as np
import pytest
import torch

import sampan
from sampan import inference
from sampan.models import bert

from . import torch_ref

CFG = {"model_type": "bert", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2,
       "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
       "max_position_embeddings": 24, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
       "architectures": ["BertModel"], "pad_token_id": 0}


def hf_state(cfg=CFG, seed=0, pooler=True):
    """Random weights under HF names, Linear weights (out, in) as HF stores them."""
    r = np.random.default_rng(seed)
    h, f = cfg["hidden_size"], cfg["intermediate_size"]

    def w(*s, scale=0.3):
        return (r.standard_normal(s) * scale).astype(np.float32)
    s = {"embeddings.word_embeddings.weight": w(cfg["vocab_size"], h, scale=1.0),
         "embeddings.position_embeddings.weight": w(cfg["max_position_embeddings"], h),
         "embeddings.token_type_embeddings.weight": w(cfg["type_vocab_size"], h),
         "embeddings.LayerNorm.weight": 1 + w(h, scale=0.1),
         "embeddings.LayerNorm.bias": w(h, scale=0.1),
         "embeddings.position_ids": np.arange(cfg["max_position_embeddings"])[None]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for n, (o, k) in {"attention.self.query": (h, h), "attention.self.key": (h, h),
                          "attention.self.value": (h, h), "attention.output.dense": (h, h),
                          "intermediate.dense": (f, h), "output.dense": (h, f)}.items():
            s[p + n + ".weight"] = w(o, k, scale=1 / np.sqrt(k))
            s[p + n + ".bias"] = w(o, scale=0.1)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            s[p + n + ".weight"] = 1 + w(h, scale=0.1)
            s[p + n + ".bias"] = w(h, scale=0.1)
    if pooler:
        s["pooler.dense.weight"] = w(h, h)
        s["pooler.dense.bias"] = w(h)
    return s


def write_ckpt(d, state, cfg=CFG):
    from safetensors.numpy import save_file
    d.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def batch(seed=1, b=3, s=11):
    r = np.random.default_rng(seed)
    ids = r.integers(1, CFG["vocab_size"], (b, s)).astype(np.int64)
    mask = np.ones((b, s), np.int64)
    for row in range(1, b):        # padded rows, as a tokeniser pads to the longest
        mask[row, max(1, s - 4 * row):] = 0
    ids[mask == 0] = 0
    types = np.zeros((b, s), np.int64)
    types[:, 5:] = 1
    return ids, mask, types


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    state = hf_state()
    return write_ckpt(tmp_path_factory.mktemp("bert") / "tiny", state), state


def test_every_layer_matches_pytorch(ckpt):
    d, state = ckpt
    model = bert.load_hf(d)
    assert model.pooler is not None and model.hf_unused == [] and not model.training
    ids, mask, types = batch()
    ref = torch_ref.hidden_states(state, CFG, ids, mask, types)
    with sampan.no_grad():
        x = model.embeddings(sampan.tensor(ids), sampan.tensor(types))
        np.testing.assert_allclose(x.numpy(), ref[0].numpy(), rtol=0, atol=1e-5)
        bias = bert.mask_bias(sampan.tensor(mask))
        for i, layer in enumerate(model.encoder):
            x = layer(x, bias)
            np.testing.assert_allclose(x.numpy(), ref[i + 1].numpy(), rtol=0, atol=1e-5,
                                       err_msg=f"layer {i}")
        full = model(ids, mask, types).numpy()
        np.testing.assert_array_equal(full, x.numpy())
        # no mask and no token types: HF's defaults (all kept, all type 0)
        ref0 = torch_ref.hidden_states(state, CFG, ids)[-1].numpy()
        np.testing.assert_allclose(model(ids).numpy(), ref0, rtol=0, atol=1e-5)
        pooled = model.pooler_output(model(ids, mask, types)).numpy()
    s = {k: torch.from_numpy(v) for k, v in state.items()}
    want = torch.tanh(ref[-1][:, 0] @ s["pooler.dense.weight"].T + s["pooler.dense.bias"])
    np.testing.assert_allclose(pooled, want.numpy(), rtol=0, atol=1e-5)


def test_sentence_embeddings_match_pytorch(ckpt):
    d, state = ckpt
    model = bert.load_hf(d)
    ids, mask, _ = batch()
    want = torch_ref.sentence_embeddings(state, CFG, ids, mask)
    with sampan.no_grad():
        got = bert.SentenceEncoder(model)(sampan.tensor(ids), sampan.tensor(mask)).numpy()
        raw = bert.SentenceEncoder(model, normalize=False)(sampan.tensor(ids),
                                                            sampan.tensor(mask)).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), got,
                               atol=1e-6)


def test_name_mapping_round_trip(ckpt, tmp_path):
    d, state = ckpt
    model = bert.load_hf(d)
    back = bert.to_hf_state(model)
    assert set(back) == set(state) - {"embeddings.position_ids"}
    for k, v in back.items():
        np.testing.assert_array_equal(v, state[k], err_msg=k)
    # sampan's Linear is (in, out): HF's (out, in) transposed
    np.testing.assert_array_equal(model.encoder[0].ffn_in.weight.numpy(),
                                  state["encoder.layer.0.intermediate.dense.weight"].T)
    # a task checkpoint (`bert.` prefix, a head) with TF-era LayerNorm gamma/beta names
    task = {}
    for k, v in state.items():
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                      "LayerNorm.beta")
        task["bert." + k] = v
    task["cls.predictions.bias"] = np.zeros(CFG["vocab_size"], np.float32)
    m2 = bert.load_hf(write_ckpt(tmp_path / "task", task) / "model.safetensors")
    assert m2.hf_unused == ["cls.predictions.bias"]
    for k, v in bert.to_hf_state(m2).items():
        np.testing.assert_array_equal(v, back[k], err_msg=k)
    m3 = bert.load_hf(d, add_pooling_layer=False)
    assert m3.pooler is None and m3.hf_unused == ["pooler.dense.bias", "pooler.dense.weight"]


def test_half_precision_checkpoints(ckpt, tmp_path):
    import ml_dtypes
    d, state = ckpt
    for dt in (np.float16, ml_dtypes.bfloat16):
        low = {k: (v.astype(dt) if v.dtype == np.float32 else v) for k, v in state.items()}
        m = bert.load_hf(write_ckpt(tmp_path / np.dtype(dt).name, low))
        w = m.encoder[1].value.weight.numpy()
        assert w.dtype == np.float32
        np.testing.assert_array_equal(
            w, low["encoder.layer.1.attention.self.value.weight"].astype(np.float32).T)


def test_loading_errors(ckpt, tmp_path):
    d, state = ckpt
    missing = dict(state)
    del missing["encoder.layer.1.output.dense.bias"]
    with pytest.raises(bert.ModelError, match=r"encoder\.layer\.1\.output\.dense\.bias"):
        bert.load_hf(write_ckpt(tmp_path / "missing", missing))
    wrong = dict(state)
    wrong["encoder.layer.0.attention.self.key.weight"] = np.zeros((32, 31), np.float32)
    with pytest.raises(bert.ModelError, match=r"shape \[32, 31\].*expects \[32, 32\]"):
        bert.load_hf(write_ckpt(tmp_path / "wrong", wrong))
    nan = dict(state)
    nan["embeddings.LayerNorm.bias"] = np.full(32, np.nan, np.float32)
    with pytest.raises(bert.ModelError, match="NaN"):
        bert.load_hf(write_ckpt(tmp_path / "nan", nan))
    cut = write_ckpt(tmp_path / "cut", state)
    blob = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(blob[:len(blob) // 2])
    with pytest.raises(bert.ModelError, match="not a readable safetensors"):
        bert.load_hf(cut)
    (cut / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(bert.ModelError, match="not a readable safetensors"):
        bert.load_hf(cut)
    pkl = tmp_path / "pickled"
    pkl.mkdir()
    (pkl / "pytorch_model.bin").write_bytes(b"not read")
    (pkl / "config.json").write_text(json.dumps(CFG))
    with pytest.raises(bert.ModelError, match="pickle, which sampan never loads"):
        bert.load_hf(pkl)
    bad = write_ckpt(tmp_path / "badcfg", state, dict(CFG, num_attention_heads=5))
    with pytest.raises(bert.ModelError, match="not a multiple of num_attention_heads 5"):
        bert.load_hf(bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(bert.ModelError, match="not readable JSON"):
        bert.load_hf(bad)
    with pytest.raises(bert.ModelError, match="hidden_act 'tanh'"):
        bert.BertConfig.from_dict(dict(CFG, hidden_act="tanh"))
    with pytest.raises(bert.ModelError, match="model_type 'roberta'"):
        bert.BertConfig.from_dict(dict(CFG, model_type="roberta"))


def test_bad_inputs(ckpt):
    model = bert.load_hf(ckpt[0])
    with pytest.raises(bert.ModelError, match="integer token ids; got dtype float32"):
        model(np.zeros((1, 3), np.float32))
    with pytest.raises(bert.ModelError, match=r"attention_mask has shape \(1, 2\)"):
        model(np.zeros((1, 3), np.int64), np.ones((1, 2), np.int64))
    with pytest.raises(bert.ModelError, match="25 tokens a row; this model has 24"):
        model(np.zeros((1, 25), np.int64))
    with pytest.raises(bert.ModelError, match="must be a BertModel"):
        bert.sentence_embeddings(object(), ["a"], None)


def test_predictor_dynamic_batch_and_sequence(ckpt, tmp_path):
    model = bert.load_hf(ckpt[0])
    enc = bert.SentenceEncoder(model)
    ids, mask, _ = batch(b=2, s=6)
    path = sampan.jit.save(enc, str(tmp_path / "enc.sampan"),
                           (sampan.tensor(ids), sampan.tensor(mask)), dynamic=enc.dynamic)
    p = inference.create_predictor(inference.Config(path))
    assert p.get_input_names() == ["input_ids", "attention_mask"]
    for b, s in ((3, 11), (1, 4), (5, 24)):
        ids, mask, _ = batch(seed=b, b=b, s=s)
        got = p.run([ids, mask])[0]
        with sampan.no_grad():
            want = enc(sampan.tensor(ids), sampan.tensor(mask)).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=f"{b}x{s}")
    assert len(p.compiled_sizes()) == 3


def test_tokenize_and_sentence_embeddings(ckpt):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "a", "b", "c", "d"])}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    ids, mask = bert.tokenize(tok, ["a b c", "d", "a zz"])
    np.testing.assert_array_equal(ids, [[2, 3, 4], [5, 0, 0], [2, 1, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    model = bert.load_hf(ckpt[0])
    e = bert.sentence_embeddings(model, ["a b c", "d", "a zz"], tok, batch_size=2)
    want = torch_ref.sentence_embeddings(ckpt[1], CFG, ids, mask)
    np.testing.assert_allclose(e, want, rtol=0, atol=1e-5)
    with pytest.raises(bert.ModelError, match="text 0 is 30 tokens; the model takes at most 24"):
        bert.sentence_embeddings(model, ["a " * 30], tok)
