"""Each layer's forward and backward (input and parameter grads) against PyTorch with
identical weights. Tolerances: see _ref.TOL (float32 rel 1e-5, float64 rel 1e-10)."""
import numpy as np
import pytest
import torch

import sampan
from sampan import nn

from ._ref import close, compare_layer, linear_map, rand, same

DTYPES = ["float32", "float64"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5)])
def test_linear(dtype, shape):
    r = np.random.default_rng(0)
    s, t = nn.Linear(5, 7).to(dtype), torch.nn.Linear(5, 7).to(getattr(torch, dtype))
    compare_layer(s, t, linear_map(""), [rand(r, *shape, dtype=dtype)], dtype)
    s2, t2 = nn.Linear(5, 3, bias=False).to(dtype), torch.nn.Linear(5, 3, bias=False)
    compare_layer(s2, t2.to(getattr(torch, dtype)), linear_map("", bias=False),
                  [rand(r, *shape, dtype=dtype)], dtype)


def test_linear_shape_error_names_layout():
    with pytest.raises(sampan.ShapeError, match="linear.*\\(in_features, out_features\\)"):
        nn.Linear(5, 7)(sampan.zeros(2, 7))


@pytest.mark.parametrize("dtype", DTYPES)
def test_bilinear(dtype):
    r = np.random.default_rng(1)
    s = nn.Bilinear(3, 4, 5).to(dtype)
    t = torch.nn.Bilinear(3, 4, 5).to(getattr(torch, dtype))
    compare_layer(s, t, {"weight": same("weight"), "bias": same("bias")},
                  [rand(r, 2, 6, 3, dtype=dtype), rand(r, 2, 6, 4, dtype=dtype)], dtype)


def test_embedding_padding_idx_gets_no_grad():
    s, t = nn.Embedding(10, 4, padding_idx=1).double(), torch.nn.Embedding(10, 4, 1).double()
    ids = np.array([[1, 2, 3, 1], [9, 1, 2, 0]])
    compare_layer(s, t, {"weight": same("weight")}, [ids], "float64")
    assert np.all(s.weight.grad.numpy()[1] == 0)
    assert np.all(nn.Embedding(5, 3, padding_idx=0).weight.numpy()[0] == 0)
    with pytest.raises(sampan.SampanIndexError, match="embedding.*\\[0, 10\\)"):
        s(sampan.tensor([10]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms(dtype):
    r = np.random.default_rng(3)
    td = getattr(torch, dtype)
    x = rand(r, 3, 4, 6, dtype=dtype)
    m = {"weight": same("weight"), "bias": same("bias")}
    s, t = nn.LayerNorm(6).to(dtype), torch.nn.LayerNorm(6).to(td)
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5), t.bias.uniform_(-0.5, 0.5)
    compare_layer(s, t, m, [x], dtype)
    s, t = nn.LayerNorm((4, 6)).to(dtype), torch.nn.LayerNorm((4, 6)).to(td)
    compare_layer(s, t, m, [x], dtype)
    s, t = nn.RMSNorm(6, eps=1e-6).to(dtype), torch.nn.RMSNorm(6, eps=1e-6).to(td)
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5)
    compare_layer(s, t, {"weight": same("weight")}, [x], dtype)
    s, t = nn.RMSNorm(6).to(dtype), torch.nn.RMSNorm(6).to(td)  # default eps = finfo.eps
    compare_layer(s, t, {"weight": same("weight")}, [x], dtype)
    s, t = nn.GroupNorm(2, 4).to(dtype), torch.nn.GroupNorm(2, 4).to(td)
    with torch.no_grad():
        t.weight.uniform_(0.5, 1.5), t.bias.uniform_(-0.5, 0.5)
    compare_layer(s, t, m, [x], dtype)


@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (8, 3)), ("BatchNorm1d", (4, 3, 5)),
                                       ("BatchNorm2d", (4, 3, 2, 5))])
def test_batchnorm_train_eval_running_stats(cls, shape):
    r = np.random.default_rng(4)
    s, t = getattr(nn, cls)(3).double(), getattr(torch.nn, cls)(3).double()
    m = {"weight": same("weight"), "bias": same("bias")}
    for step in range(3):
        compare_layer(s, t, m, [rand(r, *shape) * 2 + 1], "float64", rng_seed=step)
        for p in list(s.parameters()) + list(t.parameters()):
            p.grad = None
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        close(s.state_dict()[name].numpy(), t.state_dict()[name], "float64", name)
    s.eval(), t.eval()
    compare_layer(s, t, m, [rand(r, *shape)], "float64")
    with pytest.raises(sampan.ShapeError, match=f"{cls}: got input of shape"):
        s(sampan.zeros(2, 5))
    s2 = getattr(nn, cls)(3, momentum=None).double()
    t2 = getattr(torch.nn, cls)(3, momentum=None).double()
    for step in range(2):
        x = rand(r, *shape)
        s2(sampan.tensor(x)), t2(torch.tensor(x))
    close(s2.running_var.numpy(), t2.running_var, "float64", "cumulative average")


@pytest.mark.parametrize("name,targs", [("ReLU", ()), ("LeakyReLU", (0.2,)), ("GELU", ()),
                                        ("GELU", ("tanh",)), ("SiLU", ()), ("Tanh", ()),
                                        ("Sigmoid", ()), ("Softmax", (-1,)),
                                        ("LogSoftmax", (1,)), ("ELU", ()), ("Softplus", ())])
def test_activations(name, targs):
    x = rand(np.random.default_rng(5), 3, 7, low=-3, high=3)
    compare_layer(getattr(nn, name)(*targs), getattr(torch.nn, name)(*targs), {}, [x])


def test_flatten_identity_dropout():
    x = rand(np.random.default_rng(6), 2, 3, 4)
    compare_layer(nn.Flatten(), torch.nn.Flatten(), {}, [x])
    compare_layer(nn.Flatten(0, 1), torch.nn.Flatten(0, 1), {}, [x])
    i = sampan.tensor(x)
    assert nn.Identity()(i) is i
    d = nn.Dropout(0.25)
    y = d(sampan.ones(200, 200)).numpy()
    np.testing.assert_allclose(y[y != 0], 1 / 0.75, rtol=1e-6)
    assert abs((y == 0).mean() - 0.25) < 0.01
    d.eval()
    assert d(i) is i
    with pytest.raises(sampan.SampanValueError, match="Dropout: got p=1.5"):
        nn.Dropout(1.5)


def _conv_map():
    return {"weight": same("weight"), "bias": same("bias")}


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(dilation=2, padding=2),
                                dict(groups=2, padding=1)])
def test_conv2d(kw):
    r = np.random.default_rng(7)
    s, t = nn.Conv2d(4, 6, 3, **kw).double(), torch.nn.Conv2d(4, 6, 3, **kw).double()
    compare_layer(s, t, _conv_map(), [rand(r, 2, 4, 7, 8)], "float64")


def test_conv1d_and_transpose():
    r = np.random.default_rng(8)
    s, t = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2).double(), torch.nn.Conv1d(
        4, 6, 3, stride=2, padding=1, groups=2).double()
    compare_layer(s, t, _conv_map(), [rand(r, 2, 4, 9)], "float64")
    s = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1).double()
    t = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1).double()
    compare_layer(s, t, _conv_map(), [rand(r, 2, 4, 5, 5)], "float64")


def test_conv2d_float32():
    r = np.random.default_rng(9)
    s, t = nn.Conv2d(1, 6, 5, padding=2), torch.nn.Conv2d(1, 6, 5, padding=2)
    compare_layer(s, t, _conv_map(), [rand(r, 4, 1, 12, 12, dtype="float32")], "float32")


def test_pools():
    r = np.random.default_rng(10)
    x = rand(r, 2, 3, 8, 9)
    compare_layer(nn.MaxPool2d(2), torch.nn.MaxPool2d(2), {}, [x])
    compare_layer(nn.MaxPool2d(3, 2, 1), torch.nn.MaxPool2d(3, 2, 1), {}, [x])
    compare_layer(nn.AvgPool2d(2), torch.nn.AvgPool2d(2), {}, [x])
    compare_layer(nn.AdaptiveAvgPool2d(1), torch.nn.AdaptiveAvgPool2d(1), {}, [x])
    compare_layer(nn.AdaptiveAvgPool2d((3, 3)), torch.nn.AdaptiveAvgPool2d((3, 3)), {}, [x])
