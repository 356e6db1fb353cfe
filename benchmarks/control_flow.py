"""C1 (control flow, issue 34), JSON lines in WORKLOADS.md's format, measured in one run:

* char-GPT greedy decode of 256 tokens (`examples/char_gpt.py`'s CharGPT at its default size:
  vocabulary of its corpus, d_model 64, 4 heads, 2 blocks, context 32; weights N(0, 0.02) from
  seed 0, the same in every system; no end-of-text token, so all 256 steps run):
  sampan jit (`GreedyDecoder`: the whole decode is one `sampan.while_loop` node),
  sampan eager (the same decoder run eagerly: a Python loop of eager ops),
  PyTorch eager (the same weights in a Python loop, the context sliced each step) and
  PyTorch with `torch.compile` of the fixed-shape step (skipped, with the reason, where it
  does not compile here); PyTorch on one thread (--torch-threads), its faster setting for
  this batch-1 model here. Metric: tokens/s; every system must give sampan eager's tokens.
  Targets: jit >= 1.5x sampan eager and >= 1.2x PyTorch eager.
* a scan RNN (h = tanh(x_t Wx + h Wh + b), batch 8, input 32, hidden 64): compile time
  (trace + passes + codegen, `JitFunction.compile`) and run time of `sampan.scan` over 512
  steps against the unrolled trace of the same Python loop, and the scan's compile time at
  16 vs 512 steps (the best of 41+ compiles each, taken in turns: one takes ~1 ms, whose
  median on a shared machine is the load's). Targets: compile time at 512 <= 1.2x that at
  16; run time <= 1.1x the unrolled trace's.

    PYTHONPATH=. .venv/bin/python benchmarks/control_flow.py [--tokens N] [--reps N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from statistics import median

from _blas_env import rerun_without_overrides

rerun_without_overrides()

import numpy as np  # noqa: E402

from common import ROOT, blas_info, emit, timeit  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "examples"))

import char_gpt  # noqa: E402

import sampan  # noqa: E402

WL = "C1"


def first_line(e):
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def gpt(block=32):
    sampan.manual_seed(0)
    vocab = len(set(char_gpt.corpus()))
    model = char_gpt.CharGPT(vocab, block=block)
    model.eval()
    return model, vocab


def torch_gpt(model, n_head=4):
    """The same CharGPT in PyTorch, from sampan's weights (Linear weights are (in, out))."""
    import torch
    import torch.nn.functional as F
    w = {k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()}
    layers = len(model.blocks)

    def forward(idx):
        t = idx.shape[1]
        x = w["tok.weight"][idx] + w["pos.weight"][:t]
        for i in range(layers):
            p = f"blocks.{i}."
            h = F.layer_norm(x, x.shape[-1:], w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
            b, n, c = h.shape

            def heads(name):
                y = h @ w[p + f"attn.{name}.weight"] + w[p + f"attn.{name}.bias"]
                return y.reshape(b, n, n_head, c // n_head).transpose(1, 2)
            a = F.scaled_dot_product_attention(heads("q_proj"), heads("k_proj"),
                                               heads("v_proj"), is_causal=True)
            a = a.transpose(1, 2).reshape(b, n, c)
            x = x + a @ w[p + "attn.out_proj.weight"] + w[p + "attn.out_proj.bias"]
            h = F.layer_norm(x, x.shape[-1:], w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
            h = F.gelu(h @ w[p + "mlp.0.weight"] + w[p + "mlp.0.bias"])
            x = x + h @ w[p + "mlp.2.weight"] + w[p + "mlp.2.bias"]
        x = F.layer_norm(x, x.shape[-1:], w["ln.weight"], w["ln.bias"], 1e-5)
        return x @ w["tok.weight"].T
    return forward


def decode_lines(tokens, reps, compile_torch, torch_threads):
    import torch
    torch.set_grad_enabled(False)
    # one thread: at batch 1 this model's ops are tiny, and PyTorch's default pool made a
    # step 6x slower on the shared 2-core machine (2.0 vs 12 ms); the line records it
    torch.set_num_threads(torch_threads)
    block = 32
    model, vocab = gpt(block)
    prompt = [1, 2, 3, 4]
    eot = vocab                                   # never emitted: every step runs
    dec = char_gpt.GreedyDecoder(model, block, tokens, eot)
    window, n = char_gpt.prompt_window(prompt, block)
    jdec = sampan.jit(dec, pipeline="inference")

    def run_sampan(f):
        with sampan.no_grad():
            out, i = f(window, n)
        return [int(t) for t in out.numpy()[0, :int(i.numpy())]]

    tf = torch_gpt(model)

    def run_torch():
        ids = torch.tensor([prompt])
        new = []
        for _ in range(tokens):
            tok = tf(ids[:, -block:])[0, -1].argmax()
            new.append(int(tok))
            ids = torch.cat([ids, tok.reshape(1, 1)], 1)
        return new

    ref = run_sampan(dec)
    t0 = time.perf_counter()
    got = run_sampan(jdec)
    info = dict(tokens=tokens, block=block, vocab=vocab, **blas_info(),
                torch_threads=torch.get_num_threads())
    systems = {("sampan", "jit"): lambda: run_sampan(jdec), ("pytorch", "eager"): run_torch}
    notes = {("sampan", "jit"): dict(first_call_s=round(time.perf_counter() - t0, 3))}
    checks = {("sampan", "jit"): got, ("pytorch", "eager"): run_torch()}
    if compile_torch:
        try:
            step = torch.compile(_torch_step(tf, block))
            t0 = time.perf_counter()
            checks[("pytorch", "compile")] = _torch_fixed_decode(step, prompt, block, tokens)
            notes[("pytorch", "compile")] = dict(
                first_call_s=round(time.perf_counter() - t0, 3))
            systems[("pytorch", "compile")] = lambda: _torch_fixed_decode(
                step, prompt, block, tokens)
        except Exception as e:   # no C compiler, unsupported Python … : say so, go on
            print(f"# {WL}: torch.compile of the decode step failed ({first_line(e)}); "
                  "skipped", file=sys.stderr)
    for k, toks in checks.items():
        if toks != ref:
            raise SystemExit(f"{WL}: {k} decoded other tokens than sampan eager: "
                             f"{toks[:8]}... vs {ref[:8]}...")
    systems[("sampan", "eager")] = lambda: run_sampan(dec)
    rates = {k: [tokens / t for t in ts] for k, ts in interleaved(systems, reps).items()}
    for k, r in rates.items():
        emit(WL, k[0], k[1], "tokens_per_s", r, task="greedy decode", **notes.get(k, {}),
             **info)
    for peer in (("sampan", "eager"), ("pytorch", "eager"), ("pytorch", "compile")):
        if peer in rates:      # per round: the systems of one round saw the same load
            emit(WL, f"sampan_jit/{peer[0]}_{peer[1]}", "jit", "speed_ratio",
                 [a / b for a, b in zip(rates[("sampan", "jit")], rates[peer])],
                 task="greedy decode")


def interleaved(systems, reps):
    """Seconds per decode of each system, `reps` rounds of one decode each in turn (the
    load on a shared machine moves within minutes: a round sees it for all systems)."""
    ts = {k: [] for k in systems}
    for _ in range(reps):
        for k, f in systems.items():
            t = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t)
    return ts


def _torch_step(tf, block):
    import torch

    def step(window, n):
        """The fixed-shape step: the window (1, block) and its fill n, as GreedyDecoder."""
        logits = tf(window)[0]
        tok = logits[n - 1].argmax()
        full = n >= block
        pos = torch.arange(block)
        placed = torch.where(pos == n, tok, window[0])
        shifted = torch.cat([window[0, 1:], tok.reshape(1)])
        return torch.where(full, shifted, placed).reshape(1, block), torch.clamp(n + 1,
                                                                                  max=block), tok
    return step


def _torch_fixed_decode(step, prompt, block, tokens):
    import torch
    window = torch.zeros(1, block, dtype=torch.int64)
    window[0, :len(prompt)] = torch.tensor(prompt)
    n = torch.tensor(len(prompt))
    new = []
    for _ in range(tokens):
        window, n, tok = step(window, n)
        new.append(int(tok))
    return new


def rnn(steps, batch=8, d_in=32, hidden=64):
    rng = np.random.default_rng(0)
    wx = sampan.tensor(rng.standard_normal((d_in, hidden)).astype(np.float32) * 0.2)
    wh = sampan.tensor(rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.1)
    b = sampan.tensor(np.zeros(hidden, np.float32))
    xs = sampan.tensor(rng.standard_normal((steps, batch, d_in)).astype(np.float32))
    h0 = sampan.tensor(np.zeros((batch, hidden), np.float32))

    def cell(h, x):
        h = sampan.tanh(x @ wx + h @ wh + b)
        return h, h

    def scanned(h0, xs):
        return sampan.scan(cell, h0, xs)

    def unrolled(h0, xs):
        h, ys = h0, []
        for t in range(steps):
            h, y = cell(h, xs[t])
            ys.append(y)
        return h, sampan.stack(ys)
    return scanned, unrolled, (h0, xs)


def compile_s(fn, args, reps):
    """Seconds to trace, optimise and generate code for `fn` (a fresh jit each time)."""
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        sampan.jit(fn, pipeline="inference").compile(*args)
        ts.append(time.perf_counter() - t)
    return ts


def scan_lines(steps, short, reps):
    with sampan.no_grad():
        scanned, unrolled, args = rnn(steps)
        js, ju = sampan.jit(scanned, pipeline="inference"), sampan.jit(unrolled,
                                                                      pipeline="inference")
        hs, ys = js(*args)
        hu, yu = ju(*args)
        err = float(np.abs(ys.numpy() - yu.numpy()).max())
        if err > 1e-4:
            raise SystemExit(f"{WL}: the scan RNN and its unrolled trace differ by {err}")
        info = dict(task="scan RNN", steps=steps, batch=8, hidden=64, **blas_info())
        s_scan, _, s_args = rnn(short)
        c_long, c_short = [], []
        for _ in range(max(reps, 41)):   # ~1 ms each: many, in turns (the same load)
            c_long += compile_s(scanned, args, 1)
            c_short += compile_s(s_scan, s_args, 1)
        c = {"scan": c_long, "unrolled": compile_s(unrolled, args, max(2, reps // 2))}
        r = {"scan": timeit(lambda: js(*args), reps=reps),
             "unrolled": timeit(lambda: ju(*args), reps=reps)}
        for mode in ("scan", "unrolled"):
            emit(WL, "sampan", mode, "compile_s", c[mode], **info)
            emit(WL, "sampan", mode, "run_ms", [t * 1e3 for t in r[mode]], **info)
        emit(WL, "sampan", "scan", "compile_s", c_short, **dict(info, steps=short))
    emit(WL, "sampan_scan/unrolled", "scan", "run_time_ratio",
         [median(r["scan"]) / median(r["unrolled"])], **info)
    emit(WL, "sampan_scan/unrolled", "scan", "compile_time_ratio",
         [median(c["scan"]) / median(c["unrolled"])], **info)
    # best of 41+ each: a ~1 ms compile's median is the load's (0.1x-14x per pair here)
    emit(WL, f"sampan_scan_{steps}/scan_{short}", "scan", "compile_time_ratio",
         [min(c_long) / min(c_short)], statistic="min over rounds", **info)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--only", choices=("decode", "scan"))
    args = ap.parse_args()
    if args.only != "scan":
        decode_lines(args.tokens, args.reps, not args.no_compile, args.torch_threads)
    if args.only != "decode":
        scan_lines(args.steps, 16, args.reps)


if __name__ == "__main__":
    main()
