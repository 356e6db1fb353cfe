"""A small character-level GPT trained on text that ships with Python (the Zen of Python
and the docstrings of a few standard-library modules), then sampled.
Run: python examples/char_gpt.py [--steps N]"""
from __future__ import annotations

import argparse
import codecs
import time

import numpy as np

import sampan
from sampan import nn


def corpus() -> str:
    """Text from Python itself: the Zen of Python plus a few stdlib module docstrings."""
    import argparse as a
    import contextlib
    import io
    import textwrap
    import unittest
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the Zen
        import this
    zen = codecs.decode(this.s, "rot13")
    return "\n\n".join([zen, a.__doc__ or "", textwrap.__doc__ or "", unittest.__doc__ or ""])


class CharGPT(nn.Layer):
    """Token + position embedding, pre-norm decoder blocks, tied output projection."""

    def __init__(self, vocab, d_model=64, n_head=4, n_layer=2, block=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(block, d_model)
        self.blocks = nn.LayerList([nn.TransformerDecoderBlock(d_model, n_head)
                                    for _ in range(n_layer)])
        self.ln = nn.LayerNorm(d_model)
        for p in (self.tok.weight, self.pos.weight):   # GPT-style small init (tied output)
            nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(sampan.arange(t))
        for b in self.blocks:
            x = b(x)
        return self.ln(x) @ self.tok.weight.transpose(0, 1)


def sample(model, stoi, itos, prompt, n=200, block=32, temperature=0.8, seed=0):
    """Generate `n` characters after `prompt`."""
    rng = np.random.default_rng(seed)
    ids = [stoi[c] for c in prompt]
    model.eval()
    with sampan.no_grad():
        for _ in range(n):
            x = sampan.tensor(np.array([ids[-block:]]))
            logits = model(x).numpy()[0, -1] / temperature
            p = np.exp(logits - logits.max())
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
    model.train()
    return "".join(itos[i] for i in ids)


def main(steps=300, block=32, batch=32, seed=0):
    sampan.manual_seed(seed)
    text = corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = dict(enumerate(chars))
    data = np.array([stoi[c] for c in text], np.int64)
    model = CharGPT(len(chars), block=block)
    opt = sampan.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    print(f"corpus: {len(text)} characters, vocabulary {len(chars)}; "
          f"model: {model.num_parameters()} parameters")
    t = time.perf_counter()
    first = None
    for step in range(steps):
        starts = rng.integers(0, len(data) - block - 1, batch)
        x = sampan.tensor(np.stack([data[s:s + block] for s in starts]))
        y = sampan.tensor(np.stack([data[s + 1:s + block + 1] for s in starts]))
        logits = model(x)
        loss = sampan.cross_entropy(logits.reshape(-1, len(chars)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else float(loss)
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {float(loss):.3f}  ({time.perf_counter() - t:.1f} s)")
    print("\nsample:\n" + sample(model, stoi, itos, "Beautiful is ", block=block))
    return first, float(loss)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    main(ap.parse_args().steps)
