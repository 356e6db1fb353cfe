"""W1–W3 models written once per framework from the same numpy initial weights
(WORKLOADS.md "Definitions fixed for side-by-side runs"): linear weights are (in, out),
conv weights (out, in, kh, kw)."""
from __future__ import annotations

import math

import numpy as np


# ---------------------------------------------------------------------- initial weights
def w1_weights(seed=0):
    r = np.random.default_rng(seed)
    dims = [784, 512, 512, 10]
    w = {}
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        k = 1 / math.sqrt(a)
        w[f"w{i}"] = r.uniform(-k, k, (a, b)).astype(np.float32)
        w[f"b{i}"] = np.zeros(b, np.float32)
    return w


def w1_batch(seed=1, batch=128):
    r = np.random.default_rng(seed)
    return r.standard_normal((batch, 784)).astype(np.float32), r.integers(0, 10, batch)


def w2_weights(seed=0):
    r = np.random.default_rng(seed)

    def u(shape, fan_in):
        k = 1 / math.sqrt(fan_in)
        return r.uniform(-k, k, shape).astype(np.float32)
    return {"c1": u((6, 1, 5, 5), 25), "c1b": np.zeros(6, np.float32),
            "c2": u((16, 6, 5, 5), 150), "c2b": np.zeros(16, np.float32),
            "f1": u((400, 120), 400), "f1b": np.zeros(120, np.float32),
            "f2": u((120, 84), 120), "f2b": np.zeros(84, np.float32),
            "f3": u((84, 10), 84), "f3b": np.zeros(10, np.float32)}


def w2_batch(seed=1, batch=64):
    r = np.random.default_rng(seed)
    return r.standard_normal((batch, 1, 28, 28)).astype(np.float32), r.integers(0, 10, batch)


W3 = dict(vocab=1000, d=256, heads=4, seq=128, batch=8, blocks=2)


def w3_weights(seed=0):
    r = np.random.default_rng(seed)
    d, v, t = W3["d"], W3["vocab"], W3["seq"]

    def n(*shape):
        return (r.standard_normal(shape) * 0.02).astype(np.float32)
    w = {"tok": n(v, d), "pos": n(t, d), "lnf_g": np.ones(d, np.float32),
         "lnf_b": np.zeros(d, np.float32)}
    for i in range(W3["blocks"]):
        w.update({f"{i}.ln1_g": np.ones(d, np.float32), f"{i}.ln1_b": np.zeros(d, np.float32),
                  f"{i}.qkv": n(d, 3 * d), f"{i}.qkv_b": np.zeros(3 * d, np.float32),
                  f"{i}.proj": n(d, d), f"{i}.proj_b": np.zeros(d, np.float32),
                  f"{i}.ln2_g": np.ones(d, np.float32), f"{i}.ln2_b": np.zeros(d, np.float32),
                  f"{i}.fc": n(d, 4 * d), f"{i}.fc_b": np.zeros(4 * d, np.float32),
                  f"{i}.out": n(4 * d, d), f"{i}.out_b": np.zeros(d, np.float32)})
    return w


def w3_batch(seed=1):
    r = np.random.default_rng(seed)
    toks = r.integers(0, W3["vocab"], (W3["batch"], W3["seq"] + 1))
    return toks[:, :-1], toks[:, 1:]


# ---------------------------------------------------------------------- forward functions
def w1_forward(F, p, x):
    """F: a namespace with relu and matmul-capable tensors (sampan or torch)."""
    h = F.relu(x @ p["w0"] + p["b0"])
    h = F.relu(h @ p["w1"] + p["b1"])
    return h @ p["w2"] + p["b2"]


def w2_forward(F, p, x):
    h = F.max_pool2d(F.relu(F.conv2d(x, p["c1"], p["c1b"], padding=2)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, p["c2"], p["c2b"])), 2)
    h = h.reshape(h.shape[0], 400)
    h = F.relu(h @ p["f1"] + p["f1b"])
    h = F.relu(h @ p["f2"] + p["f2b"])
    return h @ p["f3"] + p["f3b"]


def w3_forward(F, p, tokens, mask):
    """Pre-LN GPT with tied embeddings; `mask` is a bool (T, T) causal mask."""
    d, nh = W3["d"], W3["heads"]
    hd = d // nh
    b, t = tokens.shape
    x = F.embed(p["tok"], tokens) + p["pos"]
    for i in range(W3["blocks"]):
        h = F.layer_norm(x, (d,), p[f"{i}.ln1_g"], p[f"{i}.ln1_b"], 1e-5)
        qkv = (h @ p[f"{i}.qkv"] + p[f"{i}.qkv_b"]).reshape(b, t, 3, nh, hd)
        qkv = F.permute(qkv, (2, 0, 3, 1, 4))
        q, k, v = qkv[0], qkv[1], qkv[2]
        s = (q @ F.permute(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(hd))
        s = F.masked(s, mask)
        a = F.softmax(s, -1) @ v
        a = F.permute(a, (0, 2, 1, 3)).reshape(b, t, d)
        x = x + (a @ p[f"{i}.proj"] + p[f"{i}.proj_b"])
        h = F.layer_norm(x, (d,), p[f"{i}.ln2_g"], p[f"{i}.ln2_b"], 1e-5)
        h = F.gelu(h @ p[f"{i}.fc"] + p[f"{i}.fc_b"])
        x = x + (h @ p[f"{i}.out"] + p[f"{i}.out_b"])
    x = F.layer_norm(x, (d,), p["lnf_g"], p["lnf_b"], 1e-5)
    return x @ F.permute(p["tok"], (1, 0))


class SampanF:
    """The functions the models need, from sampan."""

    def __init__(self):
        import sampan
        import sampan.nn.functional as NF
        self.s = sampan
        self.relu, self.conv2d, self.max_pool2d = sampan.relu, NF.conv2d, NF.max_pool2d
        self.layer_norm, self.softmax, self.gelu = sampan.layer_norm, sampan.softmax, \
            sampan.gelu

    def embed(self, table, idx):
        return self.s.index_select(table, idx.reshape(-1), 0).reshape(
            tuple(idx.shape) + (table.shape[1],))

    def masked(self, s, mask):
        return self.s.where(mask, s, float("-inf"))

    @staticmethod
    def permute(x, dims):
        return x.permute(*dims)

    def ce(self, logits, y):
        return self.s.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class TorchF:
    def __init__(self):
        import torch
        import torch.nn.functional as TF
        self.t = torch
        self.relu, self.conv2d, self.max_pool2d = torch.relu, TF.conv2d, TF.max_pool2d
        self.layer_norm, self.gelu = TF.layer_norm, TF.gelu
        self.softmax = lambda x, dim: torch.softmax(x, dim)

    def embed(self, table, idx):
        return table[idx]

    def masked(self, s, mask):
        return s.masked_fill(~mask, float("-inf"))

    @staticmethod
    def permute(x, dims):
        return x.permute(*dims)

    def ce(self, logits, y):
        return self.t.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                  y.reshape(-1))


class JaxF:
    """The same functions in jax.numpy / lax, pure so that they trace under jax.jit. Relu is
    jax.nn.relu (gradient 0 at 0, as in torch), layer norm uses the biased variance, conv is
    cross-correlation with (out, in, kh, kw) weights, as in torch and sampan."""

    def __init__(self):
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp, self.lax = jax, jnp, jax.lax
        self.relu = jax.nn.relu

    def conv2d(self, x, w, b, padding=0):
        y = self.lax.conv_general_dilated(x, w, (1, 1), [(padding, padding)] * 2,
                                          dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + b[None, :, None, None]

    def max_pool2d(self, x, k):
        return self.lax.reduce_window(x, -self.jnp.inf, self.lax.max, (1, 1, k, k),
                                      (1, 1, k, k), "VALID")

    def layer_norm(self, x, shape, g, b, eps):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * self.lax.rsqrt(var + eps) * g + b

    def softmax(self, x, dim):
        return self.jax.nn.softmax(x, axis=dim)

    def gelu(self, x):
        return self.jax.nn.gelu(x, approximate=False)  # exact erf GELU

    def embed(self, table, idx):
        return self.jnp.take(table, idx, axis=0)

    def masked(self, s, mask):
        return self.jnp.where(mask, s, -self.jnp.inf)

    def permute(self, x, dims):
        return self.jnp.transpose(x, dims)

    def ce(self, logits, y):
        lp = self.jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
        return -self.jnp.take_along_axis(lp, y.reshape(-1, 1), axis=1).mean()
