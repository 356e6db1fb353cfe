"""Issue 17 resampling against PyTorch (forward and gradients, float64, tiny shapes):
interpolate / Upsample in every mode, PixelShuffle, Unfold/Fold, grid_sample and
affine_grid; eager == jit; bad input."""
import numpy as np
import pytest
import torch

import sampan
from sampan import nn
from sampan.nn import functional as F

from ._ref import close, compare_layer, rand

TF = torch.nn.functional


def _r(seed=0):
    return np.random.default_rng(seed)


def _both(fs, ft, *arrays):
    s_in = [sampan.tensor(a.copy(), requires_grad=True) for a in arrays]
    t_in = [torch.tensor(a.copy(), requires_grad=True) for a in arrays]
    ys, yt = fs(*s_in), ft(*t_in)
    close(ys.numpy(), yt, what="forward")
    g = _r(9).standard_normal(tuple(yt.shape))
    ys.backward(sampan.tensor(g))
    yt.backward(torch.tensor(g))
    for i, (a, b) in enumerate(zip(s_in, t_in)):
        close(a.grad.numpy(), b.grad, what=f"grad of input {i}")


@pytest.mark.parametrize("shape,kw", [
    ((1, 2, 5), dict(scale_factor=2.5)), ((1, 2, 5), dict(size=3, mode="nearest-exact")),
    ((1, 2, 3, 4), dict(scale_factor=(1.5, 0.75))), ((1, 1, 3, 3), dict(size=(6, 6))),
    ((1, 2, 3, 5), dict(size=(4, 7), mode="nearest-exact")),
    ((2, 1, 6), dict(size=4, mode="linear")),
    ((1, 2, 4), dict(scale_factor=1.7, mode="linear", align_corners=True)),
    ((1, 2, 3, 4), dict(size=(5, 7), mode="bilinear")),
    ((1, 2, 4, 3), dict(scale_factor=0.6, mode="bilinear", recompute_scale_factor=True)),
    ((1, 1, 3, 4), dict(scale_factor=(2.2, 1.3), mode="bilinear", align_corners=True)),
    ((1, 2, 3, 4), dict(size=(6, 5), mode="bicubic")),
    ((1, 1, 4, 4), dict(scale_factor=0.75, mode="bicubic", align_corners=True)),
    ((1, 1, 2, 3, 2), dict(scale_factor=1.5, mode="trilinear")),
    ((1, 1, 2, 2, 3), dict(size=(3, 3, 2), mode="trilinear", align_corners=True)),
    ((1, 2, 2, 3, 2), dict(scale_factor=2, mode="nearest")),
    ((1, 2, 7, 5), dict(size=(3, 2), mode="area")),
])
def test_upsample_vs_torch(shape, kw):
    x = rand(_r(1), *shape)
    compare_layer(nn.Upsample(**kw), torch.nn.Upsample(**kw), {}, [x])


def test_fixed_upsampling_layers_and_pixel_shuffle():
    x = rand(_r(2), 1, 2, 3, 4)
    for name, kw in (("UpsamplingNearest2d", dict(scale_factor=2)),
                     ("UpsamplingBilinear2d", dict(size=(5, 6)))):
        compare_layer(getattr(nn, name)(**kw), getattr(torch.nn, name)(**kw), {}, [x])
    y = rand(_r(3), 2, 1, 8, 2, 3)       # an extra leading dim, as PyTorch allows
    compare_layer(nn.PixelShuffle(2), torch.nn.PixelShuffle(2), {}, [y])
    compare_layer(nn.PixelUnshuffle(2), torch.nn.PixelUnshuffle(2), {}, [rand(_r(4), 3, 4, 6)])


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=(2, 3), dilation=(1, 2),
                                                          padding=1, stride=(2, 1))])
def test_unfold_fold_layers(kw):
    x = rand(_r(5), 2, 2, 5, 6)
    compare_layer(nn.Unfold(**kw), torch.nn.Unfold(**kw), {}, [x])
    cols = torch.nn.Unfold(**kw)(torch.tensor(x))
    compare_layer(nn.Fold((5, 6), **kw), torch.nn.Fold((5, 6), **kw), {},
                  [rand(_r(6), *cols.shape)])
    np.testing.assert_allclose(F.unfold(sampan.tensor(x[0]), **kw).numpy(),
                               TF.unfold(torch.tensor(x[0]), **kw).numpy())


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_vs_torch(mode, padding_mode, align):
    x = rand(_r(7), 2, 2, 3, 4)
    grid = rand(_r(8), 2, 3, 2, 2, low=-2.2, high=2.2)
    if mode == "bilinear":
        _both(lambda a, g: F.grid_sample(a, g, mode, padding_mode, align),
              lambda a, g: TF.grid_sample(a, g, mode, padding_mode, align), x, grid)
    else:   # the nearest gradient with respect to the grid is 0 in both
        _both(lambda a: F.grid_sample(a, sampan.tensor(grid), mode, padding_mode, align),
              lambda a: TF.grid_sample(a, torch.tensor(grid), mode, padding_mode, align), x)


@pytest.mark.parametrize("align", [False, True])
def test_affine_grid_then_sample(align):
    theta = rand(_r(10), 2, 2, 3)
    x = rand(_r(11), 2, 1, 4, 3)
    _both(lambda t, a: F.grid_sample(a, F.affine_grid(t, (2, 1, 3, 5), align), align_corners=align),
          lambda t, a: TF.grid_sample(a, TF.affine_grid(t, (2, 1, 3, 5), align),
                                      align_corners=align), theta, x)
    _both(lambda t: F.affine_grid(t, (1, 2, 2, 3, 4), align),
          lambda t: TF.affine_grid(t, (1, 2, 2, 3, 4), align), rand(_r(12), 1, 3, 4))


def test_resample_eager_equals_jit():
    def f(x, g):
        y = F.interpolate(x, scale_factor=2, mode="bicubic")
        y = F.pixel_unshuffle(y, 2) + F.fold(F.unfold(x, 2, padding=1), (3, 4), 2, padding=1)
        return F.grid_sample(y, g, padding_mode="reflection")
    x, g = sampan.randn(1, 1, 3, 4), sampan.rand(1, 2, 2, 2) * 2 - 1
    np.testing.assert_allclose(sampan.jit(f)(x, g).numpy(), f(x, g).numpy(), rtol=1e-5,
                               atol=1e-6)


def test_resample_bad_input():
    x = sampan.zeros(1, 1, 3, 3)
    with pytest.raises(sampan.SampanValueError, match="interpolate.*exactly one"):
        F.interpolate(x)
    with pytest.raises(sampan.ShapeError, match="interpolate.*4-d input for that mode"):
        F.interpolate(sampan.zeros(1, 1, 3), size=4, mode="bilinear")
    with pytest.raises(sampan.SampanValueError, match="interpolate.*align_corners only"):
        F.interpolate(x, size=4, align_corners=True)
    with pytest.raises(sampan.SampanValueError, match="interpolate.*mode"):
        F.interpolate(x, size=4, mode="cubic")
    with pytest.raises(sampan.ShapeError, match="interpolate.*output sizes >= 1"):
        F.interpolate(x, scale_factor=0.2)
    with pytest.raises(sampan.ShapeError, match="pixel_shuffle.*C\\*r\\*r"):
        F.pixel_shuffle(sampan.zeros(1, 3, 2, 2), 2)
    with pytest.raises(sampan.ShapeError, match="fold.*number of blocks"):
        F.fold(sampan.zeros(1, 4, 5), (3, 3), 2)
    with pytest.raises(sampan.ShapeError, match="grid_sample.*grid \\(N, Ho, Wo, 2\\)"):
        F.grid_sample(x, sampan.zeros(1, 2, 2, 3))
    with pytest.raises(sampan.ShapeError, match="affine_grid.*theta"):
        F.affine_grid(sampan.zeros(1, 2, 2), (1, 1, 3, 3))


@pytest.mark.filterwarnings("ignore:invalid value")
def test_grid_sample_non_finite_grid_reads_nothing_outside():
    # PyTorch gives NaN or 0 at such points; sampan gives 0 and never indexes with them
    x = rand(_r(13), 1, 1, 3, 3)
    grid = np.array([[[[np.nan, 0.1], [np.inf, 0.2]], [[-np.inf, -np.inf], [0.3, 0.4]]]])
    for mode in ("bilinear", "nearest"):
        s = F.grid_sample(sampan.tensor(x), sampan.tensor(grid), mode, align_corners=False)
        t = TF.grid_sample(torch.tensor(x), torch.tensor(grid), mode, align_corners=False)
        ok = np.isfinite(t.numpy())
        close(s.numpy()[ok], t.numpy()[ok])
        assert np.all(s.numpy()[~ok] == 0)
    with pytest.raises(sampan.ShapeError, match="interpolate.*input and output sizes"):
        F.interpolate(sampan.zeros(1, 1, 0, 2), size=3, mode="bilinear")


@pytest.mark.parametrize("name,padding,shape", [
    ("ZeroPad2d", (1, 0, 2, 1), (1, 2, 3, 3)), ("ConstantPad1d", 2, (2, 3)),
    ("ConstantPad3d", (1, 0, 0, 1, 2, 0), (1, 2, 2, 2)), ("ReflectionPad1d", (2, 1), (1, 2, 4)),
    ("ReflectionPad2d", 1, (2, 3, 3)), ("ReflectionPad3d", (1, 1, 0, 1, 1, 0), (1, 1, 2, 3, 2)),
    ("ReplicationPad2d", (2, 0, 1, 3), (1, 1, 2, 3)), ("ReplicationPad3d", 1, (1, 1, 2, 2, 2)),
    ("CircularPad1d", (1, 2), (1, 2, 3)), ("CircularPad2d", (1, 1, 2, 0), (1, 1, 3, 3)),
])
def test_padding_layers(name, padding, shape):
    args = (padding, 1.5) if name.startswith("Constant") else (padding,)
    compare_layer(getattr(nn, name)(*args), getattr(torch.nn, name)(*args), {},
                  [rand(_r(30), *shape)])


def test_channel_shuffle_and_lp_pool():
    compare_layer(nn.ChannelShuffle(3), torch.nn.ChannelShuffle(3), {},
                  [rand(_r(31), 2, 6, 2, 1)])
    x = rand(_r(32), 1, 2, 5, 6, low=0.1, high=2.0)
    for p, k, s, ceil in ((2, 2, None, False), (3, (2, 3), (1, 2), True)):
        compare_layer(nn.LPPool2d(p, k, s, ceil), torch.nn.LPPool2d(p, k, s, ceil), {}, [x])
    compare_layer(nn.LPPool1d(2, 3, 2), torch.nn.LPPool1d(2, 3, 2), {}, [x[0]])
    with pytest.raises(sampan.ShapeError, match="channel_shuffle.*divisible"):
        F.channel_shuffle(sampan.zeros(1, 4, 2), 3)
    with pytest.raises(sampan.SampanValueError, match="ReflectionPad2d.*4 amounts"):
        nn.ReflectionPad2d((1, 2))
