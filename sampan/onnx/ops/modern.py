"""Import handlers for the newer ONNX ops of language models: RMSNormalization and
RotaryEmbedding (opset 23), SwiGLU (28), CausalConvWithState (27) and
LinearAttention (27).

Each is a composition of sampan ops, so an imported model trains and traces. 16-bit
floats are computed in float32 where the spec's function body or reference does so
(RMSNormalization's stash_type, the recurrences of LinearAttention, the fused SiLU of
CausalConvWithState) and cast back to the input's type.
"""
from __future__ import annotations

import numpy as np

import sampan

from ... import dtypes as _dt
from . import onnx_op

def _is16(dtype):
    return _dt.is_floating(dtype) and np.dtype(dtype).itemsize == 2


def _up(t):
    """`t` in float32 when it is a 16-bit float (the precision the spec computes in)."""
    return sampan.cast(t, np.float32) if _is16(t.dtype) else t


# ---------------------------------------------------------------------- RMSNormalization
@onnx_op("RMSNormalization", since=23)
def rms_normalization(ctx, node, x, scale):
    axis = int(node.attr("axis", -1))
    eps = float(node.attr("epsilon", 1e-5))
    stash = int(node.attr("stash_type", 1))
    if stash != 1:
        raise ctx.error(f"stash_type {stash} is not supported (only 1, float32, as in the "
                        "ONNX reference)")
    r = x.ndim
    if not -r <= axis < r:
        raise ctx.error(f"axis {axis} is out of range for an input of rank {r}")
    axis %= r
    xs = _up(x)
    ms = sampan.mean(xs * xs, dim=tuple(range(axis, r)), keepdim=True)
    y = xs * sampan.rsqrt(ms + eps)
    if y.dtype != x.dtype:
        y = sampan.cast(y, x.dtype)
    return y * (scale if scale.dtype == x.dtype else sampan.cast(scale, x.dtype))


# ---------------------------------------------------------------------- RotaryEmbedding
@onnx_op("RotaryEmbedding", since=23)
def rotary_embedding(ctx, node, x, cos, sin, position_ids=None):
    interleaved = bool(node.attr("interleaved", 0))
    rot = int(node.attr("rotary_embedding_dim", 0))
    heads = int(node.attr("num_heads", 0) or 0)
    shape = list(x.shape)
    if x.ndim == 4:                        # (B, H, S, D) -> (B, S, H, D)
        t = sampan.transpose(x, 1, 2)
    elif x.ndim == 3:
        if not heads or shape[2] % heads:
            raise ctx.error(f"input has shape {shape}: a 3-D input needs num_heads set to "
                            f"a divisor of its hidden size (got num_heads={heads})")
        t = sampan.reshape(x, shape[0], shape[1], heads, shape[2] // heads)
    else:
        raise ctx.error(f"input has shape {shape}; expected (B, H, S, D) or (B, S, H*D)")
    d = t.shape[3]
    rot = rot or d
    if rot % 2 or rot > d:
        raise ctx.error(f"rotary_embedding_dim {rot} must be even and at most the head size "
                        f"{d}")
    half = rot // 2
    if position_ids is not None:           # caches (max_pos, half) gathered per token
        flat = sampan.reshape(position_ids, -1)
        b, s = position_ids.shape
        cos = sampan.reshape(sampan.index_select(cos, 0, flat), b, s, cos.shape[-1])
        sin = sampan.reshape(sampan.index_select(sin, 0, flat), b, s, sin.shape[-1])
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ctx.error(f"cos_cache/sin_cache end in {cos.shape[-1]}/{sin.shape[-1]}; "
                        f"expected rotary_embedding_dim / 2 = {half}")
    cos, sin = sampan.unsqueeze(cos, -2), sampan.unsqueeze(sin, -2)   # over heads
    xr = t[..., :rot] if rot < d else t
    if interleaved:
        pairs = sampan.reshape(xr, *xr.shape[:3], half, 2)
        x1, x2 = pairs[..., 0], pairs[..., 1]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        out = sampan.reshape(sampan.stack([real, imag], dim=-1), *xr.shape)
    else:
        out = sampan.cat([real, imag], dim=-1)
    if rot < d:
        out = sampan.cat([out, t[..., rot:]], dim=-1)
    if x.ndim == 4:
        return sampan.transpose(out, 1, 2)
    return sampan.reshape(out, *shape)


# ---------------------------------------------------------------------- SwiGLU
def _swish(x, alpha):
    # the Swish op itself is misc.py's (fix/onnx-signal); SwiGLU's gate is the same function
    return x * sampan.sigmoid(x * alpha) if alpha != 1.0 else sampan.silu(x)


@onnx_op("SwiGLU", since=28)
def swiglu(ctx, node, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise ctx.error(f"A has shape {list(a.shape)} and B {list(b.shape)}; SwiGLU does "
                        "not broadcast: expected equal shapes")
    return _swish(a, float(node.attr("alpha", 1.0))) * b


# ---------------------------------------------------------------------- CausalConvWithState
@onnx_op("CausalConvWithState", since=27)
def causal_conv_with_state(ctx, node, x, w, bias=None, past=None):
    act = node.attr("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise ctx.error(f"activation {act!r} is not one of 'none', 'silu', 'swish'")
    if x.ndim != 3 or w.ndim != 3 or w.shape[0] != x.shape[1] or w.shape[1] != 1:
        raise ctx.error(f"input {list(x.shape)} and weight {list(w.shape)}: expected "
                        "(B, C, L) and a depthwise (C, 1, k) kernel")
    b, c, _ = x.shape
    k = w.shape[2]
    if past is None:
        past = sampan.zeros((b, c, k - 1), dtype=x.dtype)
    elif list(past.shape) != [b, c, k - 1]:
        raise ctx.error(f"past_state has shape {list(past.shape)}; expected {[b, c, k - 1]}")
    padded = sampan.cat([past, x], dim=2)
    y = sampan.conv1d(_up(padded), _up(w), None if bias is None else _up(bias), groups=c)
    if act != "none":
        y = sampan.silu(y)
    if y.dtype != x.dtype:
        y = sampan.cast(y, x.dtype)
    return y, padded[:, :, padded.shape[2] - (k - 1):]


# ---------------------------------------------------------------------- LinearAttention
_RULES = ("linear", "gated", "delta", "gated_delta")


def _unpack(ctx, t, heads, what):
    """(B, T, H*D) -> (B, H, T, D); 16-bit floats in float32."""
    if t.ndim != 3 or t.shape[2] % heads:
        raise ctx.error(f"{what} has shape {list(t.shape)}; expected (B, T, {heads}*D)")
    b, n, hd = t.shape
    return _up(sampan.transpose(sampan.reshape(t, b, n, heads, hd // heads), 1, 2))


@onnx_op("LinearAttention", since=27)
def linear_attention(ctx, node, q, k, v, past=None, decay=None, beta=None):
    """The recurrence run token by token (chunk_size is a tuning hint with no effect on
    the result, so it is read and ignored). The reference runs it in float32 for every
    input type; here 16-bit inputs run in float32 and float32/float64 in their own type
    (a double model keeps double gradients)."""
    rule = node.attr("update_rule", "gated_delta")
    node.attr("chunk_size", 64)
    hq, hkv = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
    if rule not in _RULES:
        raise ctx.error(f"update_rule {rule!r} is not one of {', '.join(_RULES)}")
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.error(f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise ctx.error(f"update_rule {rule!r} takes {'a' if gating else 'no'} decay input "
                        f"and {'a' if delta else 'no'} beta input; got decay "
                        f"{'given' if decay is not None else 'omitted'}, beta "
                        f"{'given' if beta is not None else 'omitted'}")
    q4, k4, v4 = _unpack(ctx, q, hq, "query"), _unpack(ctx, k, hkv, "key"), \
        _unpack(ctx, v, hkv, "value")
    b, _, n, dk = q4.shape
    dv = v4.shape[3]
    if decay is not None:
        last = decay.shape[-1] if decay.ndim == 3 else None
        if last not in (hkv, hkv * dk):
            raise ctx.error(f"decay has shape {list(decay.shape)}; expected (B, T, {hkv}) or "
                            f"(B, T, {hkv * dk})")
        decay = _unpack(ctx, decay, hkv, "decay")           # (B, Hkv, T, 1 or dk)
    if beta is not None:
        last = beta.shape[-1] if beta.ndim == 3 else None
        if last not in (hkv, 1):
            raise ctx.error(f"beta has shape {list(beta.shape)}; expected (B, T, {hkv}) or "
                            "(B, T, 1)")
        beta = _unpack(ctx, beta, last, "beta")             # (B, Hkv or 1, T, 1)
    want = [b, hkv, dk, dv]
    if past is not None:
        if list(past.shape) != want:
            raise ctx.error(f"past_state has shape {list(past.shape)}; expected {want}")
        state_dtype = past.dtype
        state = _up(past)
        if state.dtype != q4.dtype:
            state = sampan.cast(state, q4.dtype)
    else:
        state_dtype = q.dtype
        state = sampan.zeros(want, dtype=q4.dtype)
    scale = float(node.attr("scale", 0.0) or 0.0) or 1.0 / float(np.sqrt(dk))
    group = hq // hkv
    outs = []
    for i in range(n):
        k_t, v_t = k4[:, :, i, :], v4[:, :, i, :]
        if gating:
            state = state * sampan.unsqueeze(sampan.exp(decay[:, :, i, :]), -1)
        if delta:
            got = sampan.sum(state * sampan.unsqueeze(k_t, -1), dim=2)     # S^T k
            v_t = beta[:, :, i, :] * (v_t - got)
        state = state + sampan.unsqueeze(k_t, -1) * sampan.unsqueeze(v_t, -2)
        read = state if group == 1 else sampan.repeat_interleave(state, group, dim=1)
        outs.append(sampan.sum(sampan.unsqueeze(q4[:, :, i, :], -1) * read, dim=2) * scale)
    y = sampan.stack(outs, dim=2) if outs else sampan.zeros((b, hq, 0, dv), dtype=q4.dtype)
    y = sampan.reshape(sampan.transpose(y, 1, 2), b, n, hq * dv)
    if y.dtype != q.dtype:
        y = sampan.cast(y, q.dtype)
    if state.dtype != state_dtype:
        state = sampan.cast(state, state_dtype)
    return y, state
