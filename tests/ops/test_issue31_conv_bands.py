"""Issue 31: one image whose im2col columns pass conv._CHUNK_ABOVE runs conv2d in bands of
output rows (conv._conv2d_bands); every stride, padding, dilation and grouping gives
PyTorch's numbers, band edges included (the limit is lowered so small images band)."""
import numpy as np
import pytest

from sampan.ops import conv

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", [
    ((1, 6, 20, 19), (4, 6, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 6, 17, 13), (4, 6, 3, 3), (2, 1), (1, 2), (1, 1), 1),
    ((1, 6, 18, 15), (4, 3, 3, 5), (1, 2), (2, 0), (2, 1), 2),
    ((1, 3, 21, 21), (8, 3, 7, 7), (2, 2), (3, 3), (1, 1), 1)])
def test_bands_match_torch(monkeypatch, xs, ws, stride, padding, dilation, groups):
    r = np.random.default_rng(0)
    x = r.standard_normal(xs).astype(np.float32)
    w = r.standard_normal(ws).astype(np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride,
                                      padding=padding, dilation=dilation, groups=groups).numpy()
    monkeypatch.setattr(conv, "_CHUNK_ABOVE", 1 << 10)
    monkeypatch.setattr(conv, "_BAND_BYTES", 1 << 10)     # a few rows a band
    calls = []
    real = conv._conv2d_bands
    monkeypatch.setattr(conv, "_conv2d_bands", lambda *a: calls.append(a[7]) or real(*a))   # a[7]: rows a band
    got = conv._conv2d_numpy(x, w, stride, padding, dilation, groups)
    assert calls and calls[0] < want.shape[2]              # banded, more than one band
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
