"""Issue 17 spatial layers against PyTorch with identical weights (forward, input and
weight gradients): pooling with ceil_mode/indices, unpooling, conv padding modes and
strings, ConvTranspose2d(output_size=), F.pad in every mode. Tiny shapes, float64."""
import numpy as np
import pytest
import torch

import sampan
from sampan import nn
from sampan.nn import functional as F

from ._ref import close, compare_layer, rand, same

TF = torch.nn.functional
W = {"weight": same("weight"), "bias": same("bias")}


def _r(seed=0):
    return np.random.default_rng(seed)


def _both(fs, ft, *arrays):
    """Run a sampan and a torch function on copies of `arrays`; compare the outputs and
    the gradients of the float inputs for one random upstream gradient."""
    s_in = [sampan.tensor(a.copy(), requires_grad=a.dtype.kind == "f") for a in arrays]
    t_in = [torch.tensor(a.copy(), requires_grad=a.dtype.kind == "f") for a in arrays]
    ys, yt = fs(*s_in), ft(*t_in)
    close(ys.numpy(), yt, what="forward")
    g = _r(9).standard_normal(tuple(yt.shape))
    ys.backward(sampan.tensor(g))
    yt.backward(torch.tensor(g))
    for a, b in zip(s_in, t_in):
        if b.requires_grad:
            close(a.grad.numpy(), b.grad, what="input grad")


# ---------------------------------------------------------------------- pooling
@pytest.mark.parametrize("cfg", [dict(kernel_size=2, ceil_mode=True),
                                 dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                 dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1))])
def test_max_pool2d_ceil_mode_and_indices(cfg):
    x = rand(_r(1), 2, 3, 7, 6)
    s, t = nn.MaxPool2d(**cfg, return_indices=True), torch.nn.MaxPool2d(**cfg,
                                                                       return_indices=True)
    (ys, i_s), (yt, it) = s(sampan.tensor(x)), t(torch.tensor(x))
    close(ys.numpy(), yt)
    assert i_s.dtype == np.int64 and np.array_equal(i_s.numpy(), it.numpy())
    compare_layer(nn.MaxPool2d(**cfg), torch.nn.MaxPool2d(**cfg), {}, [x])
    if "dilation" in cfg:
        return
    # unpooling at those indices, with and without output_size
    k = cfg["kernel_size"]
    st = cfg.get("stride")
    u_s, u_t = nn.MaxUnpool2d(k, st, cfg.get("padding", 0)), torch.nn.MaxUnpool2d(
        k, st, cfg.get("padding", 0))
    size = tuple(x.shape[2:])
    _both(lambda y: u_s(y, i_s, output_size=size), lambda y: u_t(y, it, output_size=size),
          yt.detach().numpy())
    _both(lambda y: F.max_unpool2d(y, i_s, k, st, cfg.get("padding", 0)),
          lambda y: TF.max_unpool2d(y, it, k, st, cfg.get("padding", 0)), yt.detach().numpy())


def test_max_pool2d_functional_3d_input_and_jit():
    x = rand(_r(2), 2, 5, 5)
    ys, i_s = F.max_pool2d(sampan.tensor(x), 2, ceil_mode=True, return_indices=True)
    yt, it = TF.max_pool2d(torch.tensor(x), 2, ceil_mode=True, return_indices=True)
    close(ys.numpy(), yt)
    assert np.array_equal(i_s.numpy(), it.numpy())

    def f(v):
        y, i = F.max_pool2d(v, 3, 2, 1, ceil_mode=True, return_indices=True)
        return F.max_unpool2d(y, i, 3, 2, 1, output_size=v.shape[-2:]) * 2.0
    a = sampan.tensor(rand(_r(3), 1, 2, 6, 5))
    np.testing.assert_array_equal(sampan.jit(f)(a).numpy(), f(a).numpy())


@pytest.mark.parametrize("cfg", [dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                 dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                      count_include_pad=False),
                                 dict(kernel_size=2, ceil_mode=True, divisor_override=3),
                                 dict(kernel_size=(3, 2), padding=(1, 0), divisor_override=5)])
def test_avg_pool2d_options(cfg):
    x = rand(_r(4), 2, 2, 7, 6)
    compare_layer(nn.AvgPool2d(**cfg), torch.nn.AvgPool2d(**cfg), {}, [x])


def test_pool_bad_input():
    with pytest.raises(sampan.ShapeError, match="avg_pool2d.*divisor_override"):
        F.avg_pool2d(sampan.zeros(1, 1, 4, 4), 2, divisor_override=0)
    y, i = F.max_pool2d(sampan.zeros(1, 1, 4, 4), 2, return_indices=True)
    with pytest.raises(sampan.ShapeError, match="max_unpool2d.*output_size"):
        F.max_unpool2d(y, i, 2, output_size=(9, 9))
    with pytest.raises(sampan.SampanIndexError, match="max_unpool2d.*index 20"):
        F.max_unpool2d(y, sampan.tensor(np.full((1, 1, 2, 2), 20)), 2)
    with pytest.raises(sampan.ShapeError, match="max_unpool2d.*indices shaped like"):
        F.max_unpool2d(y, sampan.zeros(1, 1, 2, 3, dtype="int64"), 2)


# ---------------------------------------------------------------------- conv
@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding,kernel,dil", [(1, 3, 1), ((2, 1), (3, 2), 1),
                                                ("same", (4, 3), (1, 2)), ("valid", 3, 1)])
def test_conv2d_padding_modes(mode, padding, kernel, dil):
    s = nn.Conv2d(2, 3, kernel, padding=padding, dilation=dil, padding_mode=mode).double()
    t = torch.nn.Conv2d(2, 3, kernel, padding=padding, dilation=dil,
                        padding_mode=mode).double()
    compare_layer(s, t, W, [rand(_r(5), 2, 2, 6, 7)])


@pytest.mark.parametrize("mode", ["zeros", "reflect", "circular"])
@pytest.mark.parametrize("padding", [2, "same", "valid"])
def test_conv1d_padding_modes(mode, padding):
    s = nn.Conv1d(2, 3, 4, padding=padding, padding_mode=mode).double()
    t = torch.nn.Conv1d(2, 3, 4, padding=padding, padding_mode=mode).double()
    compare_layer(s, t, W, [rand(_r(6), 2, 2, 9)])


def test_conv_bad_arguments():
    with pytest.raises(sampan.SampanValueError, match="padding_mode"):
        nn.Conv2d(2, 3, 3, padding_mode="mirror")
    with pytest.raises(sampan.SampanValueError, match="'same' with stride 1"):
        nn.Conv2d(2, 3, 3, stride=2, padding="same")
    with pytest.raises(sampan.SampanValueError, match="padding_mode"):
        nn.ConvTranspose2d(2, 3, 3, padding_mode="reflect")


@pytest.mark.parametrize("size", [(9, 10), (1, 2, 10, 9)])
def test_conv_transpose2d_output_size(size):
    s = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1).double()
    t = torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1).double()
    compare_layer(s, t, W, [rand(_r(7), 1, 3, 5, 5)], s_kwargs={"output_size": size},
                  t_kwargs={"output_size": size})
    with pytest.raises(sampan.SampanValueError, match="output_size"):
        s(sampan.zeros(1, 3, 5, 5, dtype="float64"), output_size=(11, 9))


def test_conv2d_reflect_eager_equals_jit():
    conv = nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")
    x = sampan.randn(1, 2, 5, 5)
    np.testing.assert_allclose(sampan.jit(conv)(x).numpy(), conv(x).numpy(), rtol=1e-6)


# ---------------------------------------------------------------------- F.pad
@pytest.mark.parametrize("mode,shape,pad", [
    ("constant", (2, 3), (1, 2)), ("constant", (2, 3, 4), (-1, 2, 0, 1, 1, -1)),
    ("constant", (5,), (2, 0)),
    ("reflect", (2, 5), (2, 3)), ("reflect", (1, 2, 4, 5), (1, 2, -1, 3)),
    ("reflect", (1, 4), (-2, 3)),
    ("reflect", (1, 1, 3, 3, 4), (1, 1, 2, 0, 1, 2)),
    ("replicate", (2, 3, 4), (2, -1, 3, 1)), ("replicate", (1, 2, 2, 3, 3), (1, 0, 2, 2, 0, 1)),
    ("circular", (2, 4), (3, -1)), ("circular", (1, 2, 3, 4), (4, 2, 1, 3)),
])
def test_pad_modes_vs_torch(mode, shape, pad):
    x = rand(_r(8), *shape)
    value = 1.5 if mode == "constant" else None
    kw = {"value": value} if value is not None else {}
    _both(lambda a: F.pad(a, pad, mode=mode, **kw), lambda a: TF.pad(a, pad, mode=mode, **kw),
          x)
    np.testing.assert_array_equal(
        sampan.jit(lambda a: sampan.pad(a, pad, mode, value))(sampan.tensor(x)).numpy(),
        TF.pad(torch.tensor(x), pad, mode=mode, **kw).numpy())


def test_pad_old_positional_value_and_errors():
    np.testing.assert_array_equal(sampan.pad(sampan.zeros(1, 2), (1, 0), 3.0).numpy(),
                                  [[3.0, 0.0, 0.0]])
    with pytest.raises(sampan.ShapeError, match="pad.*reflect.*smaller than the dim"):
        F.pad(sampan.zeros(1, 2, 3), (3, 0), mode="reflect")
    with pytest.raises(sampan.ShapeError, match="pad.*circular.*at most"):
        F.pad(sampan.zeros(1, 2, 3), (0, 4), mode="circular")
    with pytest.raises(sampan.ShapeError, match="pad.*PyTorch's combinations"):
        F.pad(sampan.zeros(3), (1, 1), mode="replicate")
    with pytest.raises(sampan.ShapeError, match="pad.*even number"):
        F.pad(sampan.zeros(2, 3), (1, 1, 1))
    with pytest.raises(sampan.SampanValueError, match="pad.*mode"):
        F.pad(sampan.zeros(2, 3), (1, 1), mode="wrap")
    with pytest.raises(sampan.ShapeError, match="pad.*size >= 0"):
        F.pad(sampan.zeros(2, 3), (-2, -2))


# ---------------------------------------------------------------------- 1-d and 3-d layers
def _indices_match(s_layer, t_layer, x):
    (ys, i_s), (yt, it) = s_layer(sampan.tensor(x)), t_layer(torch.tensor(x))
    close(ys.numpy(), yt)
    assert i_s.dtype == np.int64 and np.array_equal(i_s.numpy(), it.numpy())
    return i_s, it, yt


@pytest.mark.parametrize("name,args,shape", [
    ("MaxPool1d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), (2, 3, 8)),
    ("MaxPool1d", dict(kernel_size=2, dilation=2), (3, 9)),
    ("AvgPool1d", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False), (2, 3, 8)),
    ("AvgPool1d", dict(kernel_size=2, ceil_mode=True), (2, 2, 7)),
    ("AdaptiveAvgPool1d", dict(output_size=3), (2, 3, 7)),
    ("AdaptiveMaxPool1d", dict(output_size=4), (2, 3, 7)),
    ("AdaptiveMaxPool2d", dict(output_size=(3, 2)), (2, 2, 7, 5)),
    ("AdaptiveMaxPool2d", dict(output_size=(None, 2)), (1, 2, 4, 5)),
    ("MaxPool3d", dict(kernel_size=2, ceil_mode=True), (1, 2, 3, 5, 4)),
    ("MaxPool3d", dict(kernel_size=(3, 2, 2), stride=(2, 1, 2), padding=(1, 0, 1)),
     (2, 1, 5, 4, 4)),
    ("AvgPool3d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                       count_include_pad=False), (1, 2, 5, 4, 6)),
    ("AvgPool3d", dict(kernel_size=2, divisor_override=3), (1, 1, 4, 4, 5)),
    ("AdaptiveAvgPool3d", dict(output_size=(2, 3, 1)), (1, 2, 5, 4, 3)),
])
def test_pool_layers_1d_3d(name, args, shape):
    x = rand(_r(10), *shape)
    compare_layer(getattr(nn, name)(**args), getattr(torch.nn, name)(**args), {}, [x])


@pytest.mark.parametrize("name,args,shape", [
    ("MaxPool1d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), (2, 3, 8)),
    ("AdaptiveMaxPool1d", dict(output_size=3), (2, 3, 7)),
    ("AdaptiveMaxPool2d", dict(output_size=(2, 3)), (2, 2, 5, 7)),
    ("MaxPool3d", dict(kernel_size=2, stride=(1, 2, 2), padding=1, ceil_mode=True),
     (1, 2, 3, 5, 4)),
])
def test_pool_layers_indices(name, args, shape):
    i_s, it, yt = _indices_match(getattr(nn, name)(**args, return_indices=True),
                                 getattr(torch.nn, name)(**args, return_indices=True),
                                 rand(_r(11), *shape))
    if name == "MaxPool1d":
        _both(lambda y: nn.MaxUnpool1d(3, 2, 1)(y, i_s, output_size=shape[-1:]),
              lambda y: torch.nn.MaxUnpool1d(3, 2, 1)(y, it, output_size=shape[-1:]),
              yt.detach().numpy())


def test_conv_transpose1d():
    s = nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2,
                           dilation=1).double()
    t = torch.nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                 groups=2).double()
    compare_layer(s, t, W, [rand(_r(12), 2, 4, 5)])
    s = nn.ConvTranspose1d(3, 2, 3, stride=3, dilation=2).double()
    t = torch.nn.ConvTranspose1d(3, 2, 3, stride=3, dilation=2).double()
    compare_layer(s, t, W, [rand(_r(13), 1, 3, 4)], s_kwargs={"output_size": (15,)},
                  t_kwargs={"output_size": (15,)})
    _both(lambda x: F.conv_transpose1d(x, s.weight, None, 2, 1, 1, 1, 2),
          lambda x: TF.conv_transpose1d(x, t.weight, None, 2, 1, 1, 1, 2),
          rand(_r(14), 1, 3, 4))


@pytest.mark.parametrize("args", [dict(kernel_size=2), dict(kernel_size=(3, 2, 1),
                                                             stride=(2, 1, 1), padding=1,
                                                             groups=2),
                                  dict(kernel_size=(2, 3, 3), padding="same", dilation=(1, 2, 1),
                                       padding_mode="reflect"),
                                  dict(kernel_size=3, padding=1, padding_mode="circular",
                                       bias=False)])
def test_conv3d(args):
    s, t = nn.Conv3d(2, 4, **args).double(), torch.nn.Conv3d(2, 4, **args).double()
    compare_layer(s, t, W if args.get("bias", True) else {"weight": same("weight")},
                  [rand(_r(15), 2, 2, 4, 5, 4)])


def test_3d_eager_equals_jit_and_errors():
    conv, pool = nn.Conv3d(2, 2, 2), nn.MaxPool3d(2, ceil_mode=True)
    x = sampan.randn(1, 2, 3, 4, 5)

    def f(v):
        return F.avg_pool3d(pool(conv(v)), 1) + F.adaptive_avg_pool3d(v, 1).sum()
    np.testing.assert_allclose(sampan.jit(f)(x).numpy(), f(x).numpy(), rtol=1e-6)
    with pytest.raises(sampan.ShapeError, match="conv3d.*5-d weight"):
        F.conv3d(x, sampan.zeros(2, 2, 2, 2))
    with pytest.raises(sampan.ShapeError, match="max_pool3d.*large enough"):
        F.max_pool3d(x, 4)
    with pytest.raises(sampan.ShapeError, match="avg_pool3d.*half the kernel"):
        F.avg_pool3d(x, 2, padding=2)
    with pytest.raises(sampan.ShapeError, match="max_pool1d.*\\(C, L\\)"):
        F.max_pool1d(sampan.zeros(1, 1, 2, 3), 2)
    with pytest.raises(sampan.SampanValueError, match="return_indices"):
        nn.AdaptiveAvgPool2d.__mro__[1](2, return_indices=True)


# ---------------------------------------------------------------------- instance norm, LRN
@pytest.mark.parametrize("name,shape", [("InstanceNorm1d", (2, 3, 5)), ("InstanceNorm1d", (3, 6)),
                                        ("InstanceNorm2d", (2, 3, 4, 3)),
                                        ("InstanceNorm3d", (1, 3, 2, 3, 2))])
@pytest.mark.parametrize("affine,track,momentum", [(False, False, 0.1), (True, True, 0.3),
                                                   (True, True, None)])
def test_instance_norm_layers(name, shape, affine, track, momentum):
    s = getattr(nn, name)(3, affine=affine, track_running_stats=track, momentum=momentum)
    t = getattr(torch.nn, name)(3, affine=affine, track_running_stats=track, momentum=momentum)
    s, t = s.double(), t.double()
    if affine:
        with torch.no_grad():
            t.weight.uniform_(0.5, 1.5), t.bias.uniform_(-0.5, 0.5)
    for step in range(2):
        compare_layer(s, t, W if affine else {}, [rand(_r(20 + step), *shape)])
    if track:
        close(s.running_mean.numpy(), t.running_mean)
        close(s.running_var.numpy(), t.running_var)
        s.eval(), t.eval()
        compare_layer(s, t, W if affine else {}, [rand(_r(22), *shape)])


def test_instance_norm_jit_updates_running_stats():
    s = nn.InstanceNorm2d(2, track_running_stats=True)
    t = torch.nn.InstanceNorm2d(2, track_running_stats=True)
    x = rand(_r(23), 2, 2, 3, 3).astype("float32")
    f = sampan.jit(lambda v: s(v))
    for _ in range(2):
        f(sampan.tensor(x)), t(torch.tensor(x))
    close(s.running_var.numpy(), t.running_var, "float32")
    with pytest.raises(sampan.ShapeError, match="InstanceNorm2d.*2 channels"):
        s(sampan.zeros(1, 3, 2, 2))
    with pytest.raises(sampan.ShapeError, match="instance_norm.*spatial"):
        F.instance_norm(sampan.zeros(2, 3))


@pytest.mark.parametrize("shape,kw", [((2, 5, 3), dict(size=3)),
                                      ((1, 6, 3, 2), dict(size=4, alpha=0.2, beta=0.5, k=2.0)),
                                      ((1, 4, 2, 2, 3), dict(size=2))])
def test_local_response_norm(shape, kw):
    compare_layer(nn.LocalResponseNorm(**kw), torch.nn.LocalResponseNorm(**kw), {},
                  [rand(_r(24), *shape)])


# ---------------------------------------------------------------------- EmbeddingBag
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("kind", ["offsets", "offsets_last", "2d", "padding"])
def test_embedding_bag(mode, kind):
    ids = np.array([1, 2, 4, 5, 4, 3, 2, 9, 0])
    offsets, kw, fkw = np.array([0, 2, 2, 6]), {}, {}
    if kind == "offsets_last":
        offsets, kw = np.array([0, 3, 3, 7, 9]), {"include_last_offset": True}
    if kind == "padding":
        kw = {"padding_idx": 2}
    if kind == "2d":
        ids, offsets = ids[:8].reshape(2, 4), None
    s = nn.EmbeddingBag(10, 3, mode=mode, **kw).double()
    t = torch.nn.EmbeddingBag(10, 3, mode=mode, **kw).double()
    if mode == "sum" and kind != "padding":
        fkw = {"per_sample_weights": rand(_r(25), *ids.shape)}
    inputs = [ids] if offsets is None else [ids, offsets]
    s_kw = {k: sampan.tensor(v) for k, v in fkw.items()}
    t_kw = {k: torch.tensor(v) for k, v in fkw.items()}
    compare_layer(s, t, {"weight": same("weight")}, inputs, s_kwargs=s_kw, t_kwargs=t_kw)


def test_embedding_bag_from_pretrained_jit_and_errors():
    w = rand(_r(26), 6, 2)
    s = nn.EmbeddingBag.from_pretrained(sampan.tensor(w), mode="sum")
    t = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(w), mode="sum")
    assert not s.weight.requires_grad
    ids = sampan.tensor(np.array([1, 2, 3, 5, 0]))
    f = sampan.jit(lambda i, o: s(i, o))
    for off in ([0, 2, 3], [0, 4, 4]):       # the bags follow the offsets after tracing
        close(f(ids, sampan.tensor(off)).numpy(), t(torch.tensor(ids.numpy()),
                                                    torch.tensor(off)))
    unfrozen = nn.EmbeddingBag.from_pretrained(sampan.tensor(w), freeze=False, padding_idx=0)
    assert unfrozen.weight.requires_grad and unfrozen.padding_idx == 0
    with pytest.raises(sampan.SampanValueError, match="embedding_bag.*mode='sum'"):
        F.embedding_bag(ids, sampan.tensor(w), sampan.tensor([0]),
                        per_sample_weights=sampan.ones(5))
    with pytest.raises(sampan.SampanValueError, match="embedding_bag.*offsets"):
        F.embedding_bag(ids, sampan.tensor(w))
    with pytest.raises(sampan.SampanIndexError):
        F.embedding_bag(sampan.tensor([7]), sampan.tensor(w), sampan.tensor([0]))
    with pytest.raises(sampan.SampanValueError, match="EmbeddingBag.*mode"):
        nn.EmbeddingBag(3, 2, mode="min")


def test_pad_result_is_never_a_view():
    for mode in ("constant", "reflect", "circular"):
        x = sampan.ones(1, 2, 4)
        for pad in ((0, 0), (-1, 0)):
            y = F.pad(x, pad, mode=mode)
            y.add_(1.0)
            assert float(x.sum()) == 8.0, (mode, pad)
