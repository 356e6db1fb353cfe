"""A small character-level GPT trained on text that ships with Python (the Zen of Python
and the docstrings of a few standard-library modules), then sampled.
Run: python examples/char_gpt.py [--steps N] [--decode]

With --decode it also decodes greedily and by beam search to the end of a line, each
decode one `sampan.jit`-compiled `sampan.while_loop` over fixed-size buffers
(`GreedyDecoder`, `BeamDecoder`), checked against the Python-loop decode."""
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

    def __init__(self, vocab, d_model=64, n_head=4, n_layer=2, block=32, activation="gelu"):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(block, d_model)
        self.blocks = nn.LayerList([nn.TransformerDecoderBlock(d_model, n_head,
                                                               activation=activation)
                                    for _ in range(n_layer)])
        self.ln = nn.LayerNorm(d_model)
        for p in (self.tok.weight, self.pos.weight):   # GPT-style small init (tied output)
            nn.init.normal_(p, 0.0, 0.02)

    def features(self, idx):
        """The last block's output (B, T, d_model), before the final norm."""
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(sampan.arange(t))
        for b in self.blocks:
            x = b(x)
        return x

    def head(self, x):
        """Logits over the vocabulary of features `x` (..., d_model)."""
        return self.ln(x) @ self.tok.weight.transpose(0, 1)

    def forward(self, idx):
        return self.head(self.features(idx))


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


# ---- decoding: fixed-size buffers so one jitted `while_loop` holds the whole decode ----

def _next_logits(model, window, n, block):
    """Logits (B, V) of the token after the first `n` tokens of each row of `window`
    (B, block): the model is causal, so the padding after position n-1 is never seen;
    the features at n-1 are picked before the output projection (one row, not block)."""
    x = model.features(window)                                   # (B, block, C)
    at = sampan.cast(sampan.eq(sampan.arange(block), n - 1), x.dtype)
    return model.head((x * at.reshape(1, block, 1)).sum(1))


def _append(window, n, out, i, tok, block, max_new):
    """Put `tok` (B,) after the `n` tokens of `window` (sliding left once it is full) and at
    position `i` of the output buffer `out` (B, max_new)."""
    col = tok.reshape(-1, 1)
    placed = sampan.where(sampan.eq(sampan.arange(block).reshape(1, block), n), col, window)
    shifted = sampan.concat([window[:, 1:], col], 1)
    window = sampan.where(sampan.ge(n, block), shifted, placed)
    out = sampan.where(sampan.eq(sampan.arange(max_new).reshape(1, max_new), i), col, out)
    return window, sampan.minimum(n + 1, block), out, i + 1


class GreedyDecoder(nn.Layer):
    """``decoder(window, n) -> (tokens, steps)``: greedy decoding of up to `max_new` tokens
    after the prompt held in `window` (1, block) (its first `n` entries; the rest padding),
    stopping early after emitting `eot`, as one `sampan.while_loop`. Carried: the context
    window, its fill `n`, the output buffer (1, max_new), the step counter and a done flag;
    `tokens[0, :steps]` is the decode."""

    def __init__(self, model, block, max_new, eot):
        super().__init__()
        self.model, self.block, self.max_new, self.eot = model, block, max_new, eot

    def forward(self, window, n):
        block, max_new = self.block, self.max_new

        def more(window, n, out, i, done):
            return sampan.logical_and(sampan.lt(i, max_new), sampan.logical_not(done))

        def step(window, n, out, i, done):
            tok = _next_logits(self.model, window, n, block).argmax(-1)      # (1,)
            window, n, out, i = _append(window, n, out, i, tok, block, max_new)
            return window, n, out, i, sampan.eq(tok.reshape(()), self.eot)

        out = sampan.zeros((1, max_new), dtype=sampan.int64)
        init = (window, n, out, sampan.tensor(0), sampan.tensor(False))
        _, _, out, i, _ = sampan.while_loop(more, step, init, max_iterations=max_new)
        return out, i


class BeamDecoder(nn.Layer):
    """``decoder(window, n) -> (tokens, steps, scores)``: beam search with `k` beams over
    the prompt in `window` (1, block), as one `sampan.while_loop`. Each beam carries its
    window, output buffer row and log-probability score; a beam that emitted `eot` is
    finished (it continues only with `eot` at no cost); the loop stops when every beam is
    finished or after `max_new` tokens. `tokens` (k, max_new) is sorted best first."""

    def __init__(self, model, block, max_new, eot, k, vocab):
        super().__init__()
        self.model, self.block, self.max_new, self.eot = model, block, max_new, eot
        self.k, self.vocab = k, vocab

    def forward(self, window, n):
        block, max_new, k, vocab = self.block, self.max_new, self.k, self.vocab
        only_eot = sampan.where(sampan.eq(sampan.arange(vocab), self.eot), 0.0, NEG)

        def more(window, n, out, i, scores, finished):
            return sampan.logical_and(sampan.lt(i, max_new),
                                      sampan.logical_not(sampan.all(finished)))

        def step(window, n, out, i, scores, finished):
            logp = sampan.log_softmax(_next_logits(self.model, window, n, block), -1)
            logp = sampan.where(finished.reshape(k, 1), only_eot.reshape(1, vocab), logp)
            total = (scores.reshape(k, 1) + logp).reshape(k * vocab)
            scores, idx = sampan.topk(total, k)
            beam, tok = sampan.floor_divide(idx, vocab), sampan.mod(idx, vocab)
            window = sampan.index_select(window, 0, beam)
            out = sampan.index_select(out, 0, beam)
            finished = sampan.logical_or(sampan.index_select(finished, 0, beam),
                                         sampan.eq(tok, self.eot))
            window, n, out, i = _append(window, n, out, i, tok, block, max_new)
            return window, n, out, i, scores, finished

        window = sampan.concat([window] * k, 0)
        out = sampan.zeros((k, max_new), dtype=sampan.int64)
        scores = sampan.where(sampan.eq(sampan.arange(k), 0), 0.0, NEG)   # beam 0 starts
        init = (window, n, out, sampan.tensor(0), scores, sampan.zeros(k, dtype=sampan.bool_))
        _, _, out, i, scores, _ = sampan.while_loop(more, step, init, max_iterations=max_new)
        return out, i, scores


NEG = -1e9     # "impossible" log-probability: finite, so sums stay ordered and NaN-free


def prompt_window(ids, block):
    """(window (1, block) int64, n int64 scalar) for the prompt token ids `ids`."""
    ids = list(ids)[-block:]
    w = np.zeros((1, block), np.int64)
    w[0, :len(ids)] = ids
    return sampan.tensor(w), sampan.tensor(np.int64(len(ids)))


def greedy_eager(model, ids, block, max_new, eot):
    """The plain Python-loop greedy decode (eager, the model on `ids[-block:]` each step):
    the reference the jitted `GreedyDecoder` must equal."""
    ids, new = list(ids), []
    with sampan.no_grad():
        while len(new) < max_new and (not new or new[-1] != eot):
            logits = model(sampan.tensor(np.array([ids[-block:]]))).numpy()[0, -1]
            new.append(int(np.argmax(logits)))
            ids.append(new[-1])
    return new


def beam_eager(model, ids, block, max_new, eot, k):
    """A plain Python beam search (lists of beams, numpy scores summed in float32 as the
    program's are) with the same rules as `BeamDecoder`: the reference it must equal.
    Returns [(tokens, score)] best first."""
    beams = [(list(ids), [], 0.0, False)]
    with sampan.no_grad():
        while len(beams[0][1]) < max_new and not all(b[3] for b in beams):
            cands = []
            for seq, new, score, done in beams:
                if done:
                    cands.append((score, seq, new, eot))
                    continue
                logits = model(sampan.tensor(np.array([seq[-block:]]))).numpy()[0, -1]
                logp = logits - logits.max()
                logp = logp - np.log(np.exp(logp).sum())
                cands += [(np.float32(score) + logp[t], seq, new, t) for t in range(len(logp))]
            cands.sort(key=lambda c: -c[0])
            beams = [(seq + [t], new + [t], s, t == eot) for s, seq, new, t in cands[:k]]
    return [(new, float(s)) for _, new, s, _ in beams]


def train(steps=300, block=32, batch=32, seed=0, log=print, **size):
    """Train a CharGPT (`size`: its d_model, n_head, n_layer) on `corpus()` for `steps`
    AdamW steps; returns (model, stoi, itos, first loss, last loss)."""
    sampan.manual_seed(seed)
    text = corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = dict(enumerate(chars))
    data = np.array([stoi[c] for c in text], np.int64)
    model = CharGPT(len(chars), block=block, **size)
    opt = sampan.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    log(f"corpus: {len(text)} characters, vocabulary {len(chars)}; "
        f"model: {model.num_parameters()} parameters")
    t = time.perf_counter()
    first = loss = None
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
            log(f"step {step:4d}  loss {float(loss):.3f}  ({time.perf_counter() - t:.1f} s)")
    return model, stoi, itos, first, float(loss)


def decode(model, stoi, itos, prompt, max_new=60, k=4, block=32, log=print):
    """Greedy and beam-search decodes of `prompt` (to the end of the line: "\\n" is the
    end-of-text token), each run as one jitted `while_loop` and checked against the
    Python-loop decode of the same model. Returns (greedy text, beam text)."""
    eot = stoi["\n"]
    ids = [stoi[c] for c in prompt]
    window, n = prompt_window(ids, block)
    model.eval()
    with sampan.no_grad():
        t = time.perf_counter()
        out, steps = sampan.jit(GreedyDecoder(model, block, max_new, eot))(window, n)
        greedy = [int(i) for i in out.numpy()[0, :int(steps)]]
        t_greedy = time.perf_counter() - t
        assert greedy == greedy_eager(model, ids, block, max_new, eot), "greedy: jit != eager"
        t = time.perf_counter()
        beam_fn = sampan.jit(BeamDecoder(model, block, max_new, eot, k, len(stoi)))
        out, steps, scores = beam_fn(window, n)
        t_beam = time.perf_counter() - t
        beams = [[int(i) for i in row[:int(steps)]] for row in out.numpy()]
        ref = beam_eager(model, ids, block, max_new, eot, k)
        assert beams == [b for b, _ in ref], "beam search: jit != eager"
    model.train()
    nodes = [nd.op for nd in beam_fn.graph.nodes]

    def text(toks):
        return prompt + "".join(itos[i] for i in toks if i != eot)
    log(f"greedy ({len(greedy)} tokens, jit incl. compile {t_greedy:.1f} s): {text(greedy)!r}")
    log(f"beam search, {k} beams ({t_beam:.1f} s; the program's {len(nodes)} nodes hold "
        f"{nodes.count('while_loop')} while_loop): {text(beams[0])!r} "
        f"(log-probability {float(scores.numpy()[0]):.2f}); equal to the Python loops")
    return text(greedy), text(beams[0])


def main(steps=300, block=32, batch=32, seed=0, decode_too=False):
    model, stoi, itos, first, last = train(steps, block, batch, seed)
    print("\nsample:\n" + sample(model, stoi, itos, "Beautiful is ", block=block))
    if decode_too:
        print("\ndecode (sampan.jit + sampan.while_loop):")
        decode(model, stoi, itos, "Beautiful is ", block=block)
    return first, last


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--decode", action="store_true",
                    help="also decode greedily and by beam search under sampan.jit")
    a = ap.parse_args()
    main(a.steps, decode_too=a.decode)
