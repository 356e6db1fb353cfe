"""Import handlers for ONNX's recurrent ops: LSTM, GRU, RNN.

The recurrence is unrolled over the (static) sequence length with sampan ops, in ONNX's
own gate order (LSTM i, o, f, c; GRU z, r, h), so ONNX weights are used as they are
(no reordering into PyTorch's i, f, g, o): the imported weights stay the model's
Parameters and train. The input projection of every step is one matmul up front;
`sequence_lens` masks steps past each sequence's end (the state is carried, the output
is zero), which also makes the reverse direction start at each sequence's own end.
"""
from __future__ import annotations

import numpy as np

import sampan
import sampan.nn.functional as F

from . import onnx_op


def _act(ctx, name, alpha, beta):
    n = name.lower()
    if n == "sigmoid":
        return sampan.sigmoid
    if n == "tanh":
        return sampan.tanh
    if n == "relu":
        return sampan.relu
    if n == "affine":
        return lambda x: x * (1.0 if alpha is None else alpha) + (0.0 if beta is None else beta)
    if n == "leakyrelu":
        return lambda x: F.leaky_relu(x, 0.01 if alpha is None else alpha)
    if n == "thresholdedrelu":
        a = 1.0 if alpha is None else alpha
        return lambda x: sampan.where(x > a, x, sampan.zeros_like(x))
    if n == "scaledtanh":
        return lambda x: sampan.tanh(x * (1.0 if beta is None else beta)) * \
            (1.0 if alpha is None else alpha)
    if n == "hardsigmoid":
        a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        return lambda x: sampan.clamp(x * a + b, 0.0, 1.0)
    if n == "elu":
        return lambda x: F.elu(x, 1.0 if alpha is None else alpha)
    if n == "softsign":
        return lambda x: x / (sampan.abs(x) + 1.0)
    if n == "softplus":
        return F.softplus
    raise ctx.error(f"activation {name!r} is not one of Sigmoid, Tanh, Relu, Affine, "
                    "LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, "
                    "Softplus")


def _acts(ctx, node, defaults, num_dir):
    names = node.attr("activations")
    names = list(defaults) * num_dir if names is None else list(names)
    if len(names) != len(defaults) * num_dir:
        raise ctx.error(f"activations {names} must list {len(defaults)} per direction "
                        f"({num_dir} direction(s))")
    alphas = list(node.attr("activation_alpha") or [])
    betas = list(node.attr("activation_beta") or [])
    out = []
    for k, name in enumerate(names):     # alpha/beta are listed per activation, in order
        a = alphas[k] if k < len(alphas) else None
        b = betas[k] if k < len(betas) else None
        out.append(_act(ctx, name, a, b))
    n = len(defaults)
    return [out[d * n:(d + 1) * n] for d in range(num_dir)]


class _Setup:
    """What every recurrent op reads the same way."""

    def __init__(self, ctx, node, x, w, gates):
        self.layout = int(node.attr("layout", 0))
        direction = node.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.error(f"direction {direction!r} is not forward, reverse or "
                            "bidirectional")
        self.dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        if x.ndim != 3:
            raise ctx.error(f"X has shape {list(x.shape)}; expected 3 dims")
        self.x = sampan.transpose(x, 0, 1) if self.layout else x      # (seq, batch, in)
        self.seq, self.batch = self.x.shape[0], self.x.shape[1]
        self.hidden = int(node.attr("hidden_size", w.shape[1] // gates))
        if w.shape[0] != len(self.dirs) or w.shape[1] != gates * self.hidden:
            raise ctx.error(f"W has shape {list(w.shape)}; expected [{len(self.dirs)}, "
                            f"{gates * self.hidden}, input_size]")
        self.clip = node.attr("clip")

    def state(self, t, d):
        """initial_h/c for direction d as (batch, hidden), zeros when omitted."""
        if t is None:
            return sampan.zeros(self.batch, self.hidden, dtype=self.x.dtype)
        if self.layout:
            t = sampan.transpose(t, 0, 1)
        return t[d]

    def masks(self, lens):
        if lens is None:
            return None
        lens = sampan.cast(lens, np.int64)
        return [sampan.unsqueeze(lens > t, -1) for t in range(self.seq)]

    def clipped(self, g):
        return g if self.clip is None else sampan.clamp(g, -float(self.clip), float(self.clip))

    def outputs(self, ys, finals):
        """ys[d]: per-step (batch, hidden) lists; finals: per-state lists over directions."""
        y = sampan.stack([sampan.stack(yd, dim=0) for yd in ys], dim=1)  # (seq, nd, b, h)
        outs = [y]
        for f in finals:
            outs.append(sampan.stack(f, dim=0))                        # (nd, batch, hidden)
        if self.layout:
            outs[0] = sampan.permute(y, 2, 0, 1, 3)
            outs[1:] = [sampan.transpose(o, 0, 1) for o in outs[1:]]
        return tuple(outs)


def _steps(s, d):
    return range(s.seq - 1, -1, -1) if s.dirs[d] == "reverse" else range(s.seq)


def _keep(mask, new, old):
    return new if mask is None else sampan.where(mask, new, old)


def _proj(s, w, b, d, gates):
    """X @ W^T (+ Wb) for every step at once: (seq, batch, gates*hidden)."""
    xw = sampan.matmul(s.x, sampan.transpose(w[d], 0, 1))
    if b is not None:
        xw = xw + b[d][:gates * s.hidden]
    return xw


def _rb(s, b, d, gates):
    return None if b is None else b[d][gates * s.hidden:]


@onnx_op("LSTM", since=1)
def lstm(ctx, node, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    s = _Setup(ctx, node, x, w, 4)
    acts = _acts(ctx, node, ("Sigmoid", "Tanh", "Tanh"), len(s.dirs))
    couple = bool(node.attr("input_forget", 0))
    masks = s.masks(lens)
    hdim = s.hidden
    ys, hs, cs = [], [], []
    for d in range(len(s.dirs)):
        f, g, hact = acts[d]
        xw = _proj(s, w, b, d, 4)
        rt = sampan.transpose(r[d], 0, 1)
        rb = _rb(s, b, d, 4)
        pi = po = pf = None
        if p is not None:
            pi, po, pf = p[d][:hdim], p[d][hdim:2 * hdim], p[d][2 * hdim:]
        h, c = s.state(h0, d), s.state(c0, d)
        out = [None] * s.seq
        for t in _steps(s, d):
            gt = xw[t] + sampan.matmul(h, rt)
            if rb is not None:
                gt = gt + rb
            gi, go = gt[:, :hdim], gt[:, hdim:2 * hdim]
            gf, gc = gt[:, 2 * hdim:3 * hdim], gt[:, 3 * hdim:]
            if pi is not None:
                gi, gf = gi + pi * c, gf + pf * c
            i = f(s.clipped(gi))
            ft = (1.0 - i) if couple else f(s.clipped(gf))
            cn = ft * c + i * g(s.clipped(gc))
            if po is not None:
                go = go + po * cn
            hn = f(s.clipped(go)) * hact(cn)
            m = masks[t] if masks else None
            out[t] = _keep(m, hn, sampan.zeros_like(hn))
            h, c = _keep(m, hn, h), _keep(m, cn, c)
        ys.append(out)
        hs.append(h)
        cs.append(c)
    return s.outputs(ys, [hs, cs])


@onnx_op("GRU", since=1)
def gru(ctx, node, x, w, r, b=None, lens=None, h0=None):
    s = _Setup(ctx, node, x, w, 3)
    acts = _acts(ctx, node, ("Sigmoid", "Tanh"), len(s.dirs))
    lbr = bool(node.attr("linear_before_reset", 0))
    masks = s.masks(lens)
    hdim = s.hidden
    ys, hs = [], []
    for d in range(len(s.dirs)):
        f, g = acts[d]
        xw = _proj(s, w, b, d, 3)
        rd = r[d]
        rzr = sampan.transpose(rd[:2 * hdim], 0, 1)     # z and r recurrent weights
        rh = sampan.transpose(rd[2 * hdim:], 0, 1)
        rb = _rb(s, b, d, 3)
        h = s.state(h0, d)
        out = [None] * s.seq
        for t in _steps(s, d):
            zr = xw[t][:, :2 * hdim] + sampan.matmul(h, rzr)
            if rb is not None:
                zr = zr + rb[:2 * hdim]
            z, rr = f(s.clipped(zr[:, :hdim])), f(s.clipped(zr[:, hdim:]))
            if lbr:
                hr = sampan.matmul(h, rh)
                if rb is not None:
                    hr = hr + rb[2 * hdim:]
                pre = xw[t][:, 2 * hdim:] + rr * hr
            else:
                pre = xw[t][:, 2 * hdim:] + sampan.matmul(rr * h, rh)
                if rb is not None:
                    pre = pre + rb[2 * hdim:]
            hh = g(s.clipped(pre))
            hn = (1.0 - z) * hh + z * h
            m = masks[t] if masks else None
            out[t] = _keep(m, hn, sampan.zeros_like(hn))
            h = _keep(m, hn, h)
        ys.append(out)
        hs.append(h)
    return s.outputs(ys, [hs])


@onnx_op("RNN", since=1)
def rnn(ctx, node, x, w, r, b=None, lens=None, h0=None):
    s = _Setup(ctx, node, x, w, 1)
    acts = _acts(ctx, node, ("Tanh",), len(s.dirs))
    masks = s.masks(lens)
    ys, hs = [], []
    for d in range(len(s.dirs)):
        (f,) = acts[d]
        xw = _proj(s, w, b, d, 1)
        rt = sampan.transpose(r[d], 0, 1)
        rb = _rb(s, b, d, 1)
        h = s.state(h0, d)
        out = [None] * s.seq
        for t in _steps(s, d):
            pre = xw[t] + sampan.matmul(h, rt)
            if rb is not None:
                pre = pre + rb
            hn = f(s.clipped(pre))
            m = masks[t] if masks else None
            out[t] = _keep(m, hn, sampan.zeros_like(hn))
            h = _keep(m, hn, h)
        ys.append(out)
        hs.append(h)
    return s.outputs(ys, [hs])
