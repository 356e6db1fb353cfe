"""Import handlers for ONNX's Attention (opsets 23-25) and FlexAttention (ai.onnx.preview).

Attention: MHA, GQA and MQA over 3-D or 4-D Q/K/V, with the KV cache (past_key/past_value
-> present_*), a boolean or additive mask, offset-aware causal masking, softcap, softmax
precision and the qk_matmul_output modes; from opset 24 `nonpad_kv_seqlen` (an external
cache: per-batch valid key counts, which also move the causal frontier) and from opset 25
sliding windows. FlexAttention runs its score_mod/prob_mod subgraphs with the import table.

Built from sampan ops (matmul, softmax, where), so it traces and differentiates. A query
row with every key masked gives a zero row, as the spec's errata asks (not NaN).
Q and K are scaled by sqrt(scale) before their matmul and the softmax is written out, in
the input's dtype, as the spec's function body does (float16 accumulates in float32).
"""
from __future__ import annotations

import math

import numpy as np

import sampan

from ... import dtypes as _dtypes
from . import onnx_op


def _heads(ctx, t, n, what):
    """(B, S, n*D) -> (B, n, S, D)."""
    b, s, hid = t.shape
    if not n or hid % n:
        raise ctx.error(f"{what} has shape {list(t.shape)}: its hidden size must be a "
                        f"multiple of the {what} head count ({n}); set q_num_heads and "
                        "kv_num_heads for 3-D inputs")
    return sampan.transpose(sampan.reshape(t, b, s, n, hid // n), 1, 2)


@onnx_op("Attention", since=23)
def attention(ctx, node, q, k, v, mask=None, past_k=None, past_v=None):
    return _attention(ctx, node, q, k, v, mask, past_k, past_v)


@onnx_op("Attention", since=24)
def attention_24(ctx, node, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
    """Opset 24 adds `nonpad_kv_seqlen`: per-batch counts of valid keys (an external,
    static KV cache), which mask the padded keys and move the causal frontier."""
    return _attention(ctx, node, q, k, v, mask, past_k, past_v, nonpad)


@onnx_op("Attention", since=25)
def attention_25(ctx, node, q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
    """Opset 25 adds sliding windows: `left_window_size` / `right_window_size` keys on
    each side of the query's absolute position (-1: unbounded)."""
    left = int(node.attr("left_window_size", -1))
    right = int(node.attr("right_window_size", -1))
    if left < -1 or right < -1:
        raise ctx.error(f"left_window_size {left} / right_window_size {right}: each must be "
                        "-1 (unbounded) or >= 0")
    return _attention(ctx, node, q, k, v, mask, past_k, past_v, nonpad, left, right)


def _attention(ctx, node, q, k, v, mask, past_k, past_v, nonpad=None, left=-1, right=-1):
    three = q.ndim == 3
    if three:
        q = _heads(ctx, q, int(node.attr("q_num_heads", 0)), "Q")
        kvh = int(node.attr("kv_num_heads", 0))
        k = _heads(ctx, k, kvh, "K")
        v = _heads(ctx, v, kvh, "V")
    elif q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ctx.error(f"Q, K, V have shapes {list(q.shape)}, {list(k.shape)}, "
                        f"{list(v.shape)}; expected all 3-D or all 4-D")
    if (past_k is None) != (past_v is None):
        raise ctx.error("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key/past_value (an "
                        "external cache and an internal one)")
    past = 0
    if past_k is not None:
        past = past_k.shape[2]
        k = sampan.cat([past_k, k], dim=2)
        v = sampan.cat([past_v, v], dim=2)
    present_k, present_v = k, v
    in_dtype = q.dtype
    if in_dtype == np.float16:                     # float16: accumulate in float32
        q, k, v = (sampan.cast(t, np.float32) for t in (q, k, v))
        if mask is not None and mask.dtype != np.bool_:
            mask = sampan.cast(mask, np.float32)
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        if hq % hkv:
            raise ctx.error(f"q heads {hq} is not a multiple of kv heads {hkv}")
        k = sampan.repeat_interleave(k, hq // hkv, dim=1)
        v = sampan.repeat_interleave(v, hq // hkv, dim=1)
    scale = node.attr("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    root = float(np.asarray(math.sqrt(scale), dtype=q.dtype))   # as the spec: Q, K by sqrt
    s = sampan.matmul(q * root, sampan.transpose(k * root, -2, -1))
    qk = [s]
    cap = float(node.attr("softcap", 0.0))
    if cap > 0:
        s = sampan.tanh(s / cap) * cap
    qk.append(s)
    sq, total = q.shape[2], k.shape[2]
    neg = sampan.full_like(s, -math.inf)
    allowed = _structural(ctx, bool(node.attr("is_causal", 0)), left, right, nonpad,
                          past, q.shape[0], sq, total)
    if allowed is not None:
        s = sampan.where(allowed, s, neg)
    if mask is not None:
        if mask.shape[-1] < total:     # a shorter mask leaves the tail keys masked out
            pad = total - mask.shape[-1]
            fill = False if mask.dtype == np.bool_ else -math.inf
            tail = sampan.full(list(mask.shape[:-1]) + [pad], fill, dtype=mask.dtype)
            mask = sampan.cat([mask, tail], dim=-1)
        if mask.dtype == np.bool_:
            s = sampan.where(mask, s, neg)
        else:
            s = s + mask
    qk.append(s)
    prec = node.attr("softmax_precision")
    if prec is not None:
        from onnx import helper
        want = _dtypes.as_dtype(helper.tensor_dtype_to_np_dtype(int(prec)))
        if want != in_dtype and want != s.dtype:
            s = sampan.cast(sampan.cast(s, in_dtype), want)
    mx = sampan.amax(s, dim=-1, keepdim=True)
    dead = mx == -math.inf
    e = sampan.exp(s - sampan.where(dead, sampan.zeros_like(mx), mx))
    tot = sampan.sum(e, dim=-1, keepdim=True)
    p = e / sampan.where(tot == 0, sampan.ones_like(tot), tot)
    qk.append(p)
    y = sampan.matmul(p if p.dtype == v.dtype else sampan.cast(p, v.dtype), v)
    if three:
        b, h, sq_, dv = y.shape
        y = sampan.reshape(sampan.transpose(y, 1, 2), b, sq_, h * dv)
    mode = int(node.attr("qk_matmul_output_mode", 0))
    if not 0 <= mode <= 3:
        raise ctx.error(f"qk_matmul_output_mode {mode} is not 0, 1, 2 or 3")
    out = qk[mode]
    if y.dtype != in_dtype:
        y = sampan.cast(y, in_dtype)
    if out.dtype != in_dtype:           # softmax_precision may have widened it
        out = sampan.cast(out, in_dtype)
    return y, present_k, present_v, out


def _structural(ctx, causal, left, right, nonpad, past, b, sq, total):
    """The keys each query may see by position: causal, sliding window and nonpad
    padding, as one boolean mask ((sq, total), or (b, 1, sq, total) with nonpad), or
    None. Query i's absolute position is i + offset: offset is the past length (internal
    cache) or nonpad_kv_seqlen[b] - sq (external cache), unclamped as in the reference
    (a negative offset masks whole rows, which give zeros)."""
    ctx.allow((sq, total), np.int64, "the attention mask")
    base = np.arange(sq)[:, None] - np.arange(total)[None, :]      # i - j
    windowed = left >= 0 or right >= 0
    if nonpad is None:
        if not (causal or windowed):
            return None
        diff = base + past
        ok = np.ones((sq, total), bool)
        if causal:
            ok &= diff >= 0
        if left >= 0:
            ok &= diff <= left
        if right >= 0:
            ok &= -diff <= right
        return sampan.Tensor(ok)
    if nonpad.ndim != 1 or nonpad.shape[0] != b:
        raise ctx.error(f"nonpad_kv_seqlen has shape {list(nonpad.shape)}; expected [{b}] "
                        "(one count per batch entry)")
    n = sampan.reshape(sampan.cast(nonpad, np.int64), b, 1, 1, 1)
    ok = sampan.Tensor(np.arange(total).reshape(1, 1, 1, total)) < n       # padding
    diff = sampan.Tensor(base.reshape(1, 1, sq, total)) + (n - sq)
    if causal:
        ok = sampan.logical_and(ok, diff >= 0)
    if left >= 0:
        ok = sampan.logical_and(ok, diff <= left)
    if right >= 0:
        ok = sampan.logical_and(ok, -diff <= right)
    return ok


# ---------------------------------------------------------------------- FlexAttention
_SOFTMAX_TYPES = {1: np.float32, 10: np.float16, 11: np.float64, 16: "bfloat16"}


@onnx_op("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(ctx, node, q, k, v):
    """Scaled dot-product attention over (B, H, L, E) inputs with the optional score_mod
    and prob_mod subgraphs (one tensor in, one out), run here with the import table, so
    they trace and differentiate like the rest of the model."""
    score_mod, prob_mod = node.attr("score_mod"), node.attr("prob_mod")
    prec = node.attr("softmax_precision")
    scale = node.attr("scale")
    known = {"score_mod", "prob_mod", "softmax_precision", "scale"}
    extra = sorted(set(dict.keys(node.attrs)) - known)
    if extra:        # the preview domain has no schema check: refuse what is unknown
        raise ctx.error(f"attribute(s) {extra} are not FlexAttention's ({sorted(known)})")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ctx.error(f"Q, K, V have shapes {list(q.shape)}, {list(k.shape)}, "
                        f"{list(v.shape)}; expected rank-4 (B, H, L, E) tensors")
    hq, hkv = q.shape[1], k.shape[1]
    if v.shape[1] != hkv or hq % hkv or k.shape[3] != q.shape[3] or v.shape[2] != k.shape[2]:
        raise ctx.error(f"Q {list(q.shape)}, K {list(k.shape)}, V {list(v.shape)}: K and V "
                        "need the same heads and length, Q's heads a multiple of theirs and "
                        "Q and K the same head size")
    if hq != hkv:
        k = sampan.repeat_interleave(k, hq // hkv, dim=1)
        v = sampan.repeat_interleave(v, hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    root = float(np.asarray(math.sqrt(np.float32(scale)), dtype=q.dtype))
    s = sampan.matmul(q * root, sampan.transpose(k * root, -2, -1))
    if prec is None:
        want = np.float32 if np.dtype(q.dtype).itemsize < 4 else q.dtype
    elif int(prec) in _SOFTMAX_TYPES:
        want = _dtypes.as_dtype(_SOFTMAX_TYPES[int(prec)])
    else:
        raise ctx.error(f"softmax_precision {prec} is not float, float16, bfloat16 or double")
    if s.dtype != want:
        s = sampan.cast(s, want)
    if score_mod is not None:
        s = _run_mod(ctx, node, score_mod, s, "score_mod")
    p = sampan.softmax(s, dim=-1)
    if prob_mod is not None:
        p = _run_mod(ctx, node, prob_mod, p, "prob_mod")
    y = sampan.matmul(p, v if v.dtype == p.dtype else sampan.cast(v, p.dtype))
    return y if y.dtype == v.dtype else sampan.cast(y, v.dtype)


def _run_mod(ctx, node, graph, x, what):
    """Run a one-input, one-output modifier subgraph on `x` through the import table."""
    from ..subgraph import run_subgraph, subgraph_attr
    graph = subgraph_attr(ctx, node, what)
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise ctx.error(f"{what} has {len(graph.inputs)} inputs and {len(graph.outputs)} "
                        "outputs; expected one of each")
    (y,) = run_subgraph(ctx, graph, [x], what)
    if not isinstance(y, sampan.Tensor) or tuple(y.shape) != tuple(x.shape):
        raise ctx.error(f"{what} gives {list(y.shape) if isinstance(y, sampan.Tensor) else y}; "
                        f"expected one tensor shaped like its input {list(x.shape)}")
    return y if y.dtype == x.dtype else sampan.cast(y, x.dtype)
