"""Import handlers for the signal-processing ops: DFT, STFT, HannWindow, HammingWindow,
BlackmanWindow and MelWeightMatrix.

sampan has no complex dtype, so complex values are ONNX's own spelling of them: a
trailing dimension of 2 (real, imaginary; 1 for a real signal). A DFT is two matmuls of
the real and imaginary parts with cos/sin matrices built (with numpy) from the static
transform length, so it stays differentiable and traceable. Window and mel matrices
depend only on static sizes: they are computed when the graph is built.
"""
from __future__ import annotations

import numpy as np

import sampan
from . import onnx_op
from .cast import onnx_dtype
from .shape import norm_axis


def _scalar(ctx, t, what):
    a = np.asarray(ctx.static(t, what)).reshape(-1)
    if a.size != 1:
        raise ctx.error(f"{what} holds {a.size} values (expected one)")
    return a[0]


def _parts(ctx, x):
    """(real, imaginary or None) of a signal whose last dim is 1 or 2."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ctx.error(f"input has shape {list(x.shape)}; expected [..., 1] (real) or "
                        "[..., 2] (complex as real, imaginary)")
    if np.dtype(x.dtype).kind != "f":
        raise ctx.error(f"input is {x.dtype} (expected a floating type)")
    re = sampan.narrow(x, -1, 0, 1).squeeze(-1)
    im = sampan.narrow(x, -1, 1, 1).squeeze(-1) if x.shape[-1] == 2 else None
    return re, im


def _mm_last(a, m):
    """`a` (signal along its last dim) @ a static matrix."""
    return sampan.matmul(a, sampan.tensor(m.astype(a.dtype)))


def _fit(a, n):
    """`a` cut or zero-padded to length n along its last dim."""
    k = a.shape[-1]
    if k > n:
        return sampan.narrow(a, -1, 0, n)
    if k < n:
        return sampan.pad(a, ((0, 0),) * (a.ndim - 1) + ((0, n - k),), value=0.0)
    return a


def dft(ctx, x, n, axis, inverse, onesided):
    """ONNX DFT of `x` ([..., 1|2]) along `axis` with transform length n: [..., 2] (or
    [..., 1] for the inverse of a one-sided spectrum)."""
    re, im = _parts(ctx, x)
    # in float64: an exact zero (the imaginary part of a real signal's inverse) stays
    # within the cases' atol of 1e-7 where float32 sums of ~n terms would not
    re = sampan.cast(re, sampan.float64)
    im = None if im is None else sampan.cast(im, sampan.float64)
    last = re.ndim - 1
    if axis != last:
        re = sampan.movedim(re, axis, last)
        im = None if im is None else sampan.movedim(im, axis, last)
    ctx.allow((n, n // 2 + 1 if onesided else n), np.float64, "the transform matrix")
    if inverse and onesided:
        # irfft: the Hermitian half spectrum (bins 0 .. n//2) gives a real signal
        m = n // 2 + 1
        re, im = _fit(re, m), None if im is None else _fit(im, m)
        k = np.arange(m)[:, None]
        t = np.arange(n)[None, :]
        w = np.full((m, 1), 2.0)
        w[0] = 1.0
        if n % 2 == 0:
            w[-1] = 1.0
        ang = 2 * np.pi * k * t / n
        y = _mm_last(re, w * np.cos(ang) / n)
        if im is not None:
            y = y - _mm_last(im, w * np.sin(ang) / n)
        y = y.unsqueeze(-1)
    else:
        re = _fit(re, n)
        im = None if im is None else _fit(im, n)
        nbins = n // 2 + 1 if onesided else n
        ang = 2 * np.pi * np.arange(n)[:, None] * np.arange(nbins)[None, :] / n
        c, s = np.cos(ang), np.sin(ang)
        if inverse:
            c, s = c / n, -s / n
        # (re + i im)(c - i s) = (re c + im s) + i (im c - re s)
        yr, yi = _mm_last(re, c), -_mm_last(re, s)
        if im is not None:
            yr, yi = yr + _mm_last(im, s), yi + _mm_last(im, c)
        y = sampan.stack([yr, yi], -1)
    if axis != last:
        y = sampan.movedim(y, last, axis)
    return y if y.dtype == x.dtype else sampan.cast(y, x.dtype)


def _dft_common(ctx, node, x, dft_length, axis):
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if not 0 <= axis < x.ndim - 1:
        raise ctx.error(f"axis {axis} for a {x.ndim}-d input (the last dim holds the "
                        "real/imaginary parts)")
    if dft_length is not None:
        n = int(_scalar(ctx, dft_length, "dft_length"))
        if n < 1:
            raise ctx.error(f"dft_length={n} (expected >= 1)")
    else:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    if inverse and onesided and x.shape[-1] != 2:
        raise ctx.error("an inverse one-sided DFT takes a complex ([..., 2]) input")
    return dft(ctx, x, n, axis, inverse, onesided)


@onnx_op("DFT", since=17)
def dft_v17(ctx, node, x, dft_length=None):
    axis = norm_axis(ctx, node.attr("axis", 1), x.ndim)
    return _dft_common(ctx, node, x, dft_length, axis)


@onnx_op("DFT", since=20)
def dft_v20(ctx, node, x, dft_length=None, axis=None):
    a = -2 if axis is None else int(_scalar(ctx, axis, "axis"))
    return _dft_common(ctx, node, x, dft_length, norm_axis(ctx, a, x.ndim))


# ---------------------------------------------------------------------- STFT
@onnx_op("STFT", since=17)
def stft(ctx, node, signal, frame_step, window=None, frame_length=None):
    onesided = bool(node.attr("onesided", 1))
    if signal.ndim != 3:
        raise ctx.error(f"signal has shape {list(signal.shape)}; expected [batch, length, "
                        "1 or 2]")
    step = int(_scalar(ctx, frame_step, "frame_step"))
    if frame_length is not None:
        flen = int(_scalar(ctx, frame_length, "frame_length"))
    elif window is not None:
        flen = window.shape[0]
    else:
        flen = signal.shape[1]
    if window is not None and (window.ndim != 1 or window.shape[0] != flen):
        raise ctx.error(f"window has shape {list(window.shape)}; expected [{flen}] "
                        "(frame_length)")
    length = signal.shape[1]
    if step < 1 or not 1 <= flen <= length:
        raise ctx.error(f"frame_step={step}, frame_length={flen} for a signal of length "
                        f"{length}")
    frames = 1 + (length - flen) // step
    idx = (np.arange(frames)[:, None] * step + np.arange(flen)[None, :]).reshape(-1)
    x = sampan.index_select(signal, 1, sampan.tensor(idx))
    x = x.reshape((signal.shape[0], frames, flen, signal.shape[2]))
    if window is not None:
        w = window if window.dtype == x.dtype else sampan.cast(window, x.dtype)
        x = x * w.reshape((1, 1, flen, 1))
    return dft(ctx, x, flen, 2, False, onesided)


# ---------------------------------------------------------------------- windows
def _window(ctx, node, size, a0, a1, a2):
    n = int(_scalar(ctx, size, "size"))
    if n < 0:
        raise ctx.error(f"size={n} (expected >= 0)")
    dtype = onnx_dtype(ctx, node.attr("output_datatype", 1), "output_datatype")
    periodic = bool(node.attr("periodic", 1))
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    if denom <= 0:    # a symmetric window of one point: 1, as numpy's and torch's are
        return ctx.make_static(np.ones(n, dtype))
    ang = 2 * np.pi * k / denom
    w = a0 - a1 * np.cos(ang) + a2 * np.cos(2 * ang)
    return ctx.make_static(w.astype(dtype))


@onnx_op("HannWindow", since=17)
def hann_window(ctx, node, size):
    return _window(ctx, node, size, 0.5, 0.5, 0.0)


@onnx_op("HammingWindow", since=17)
def hamming_window(ctx, node, size):
    return _window(ctx, node, size, 25 / 46, 21 / 46, 0.0)


@onnx_op("BlackmanWindow", since=17)
def blackman_window(ctx, node, size):
    return _window(ctx, node, size, 0.42, 0.5, 0.08)


# ---------------------------------------------------------------------- MelWeightMatrix
@onnx_op("MelWeightMatrix", since=17)
def mel_weight_matrix(ctx, node, num_mel_bins, dft_length, sample_rate, lower, upper):
    mels = int(_scalar(ctx, num_mel_bins, "num_mel_bins"))
    n = int(_scalar(ctx, dft_length, "dft_length"))
    rate = _scalar(ctx, sample_rate, "sample_rate")
    lo, hi = float(_scalar(ctx, lower, "lower_edge_hertz")), \
        float(_scalar(ctx, upper, "upper_edge_hertz"))
    dtype = onnx_dtype(ctx, node.attr("output_datatype", 1), "output_datatype")
    if mels < 1 or n < 1 or rate <= 0 or not 0 <= lo < hi:
        raise ctx.error(f"num_mel_bins={mels}, dft_length={n}, sample_rate={rate}, edges "
                        f"[{lo}, {hi}] (expected positive counts and 0 <= lower < upper)")
    # mel = 2595 log10(1 + f / 700); num_mel_bins + 2 edges evenly spaced in mel, mapped
    # to DFT bins (the ONNX reference's rounding: floor((n + 1) f / rate))
    to_mel = 2595 * np.log10(1 + np.array([lo, hi]) / 700)
    step = (to_mel[1] - to_mel[0]) / (mels + 2)
    hz = 700 * (10 ** ((np.arange(mels + 2) * step + to_mel[0]) / 2595) - 1)
    edges = ((n + 1) * hz // rate).astype(np.int64)
    bins = n // 2 + 1
    if edges.max() >= bins:
        raise ctx.error(f"upper_edge_hertz={hi} maps past the {bins} spectrogram bins")
    out = np.zeros((bins, mels))
    for i in range(mels):
        left, mid, right = edges[i], edges[i + 1], edges[i + 2]
        if mid == left:
            out[mid, i] = 1.0
        else:
            j = np.arange(left, mid + 1)
            out[j, i] = (j - left) / (mid - left)
        if right > mid:
            j = np.arange(mid, right)
            out[j, i] = (right - j) / (right - mid)
    return ctx.make_static(out.astype(dtype))
