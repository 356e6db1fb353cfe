"""Layer base class: registration, traversal, state dicts, hooks, modes, repr."""
import numpy as np
import pytest

import sampan
from sampan import nn


def randn(*shape, dtype="float32"):
    return sampan.tensor(np.random.default_rng(len(shape)).standard_normal(shape), dtype=dtype)


class Block(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.scale = nn.Parameter(sampan.ones(4))
        self.register_buffer("step", sampan.zeros(1), persistent=False)
        self.plain = 5

    def forward(self, x):
        return self.bn(self.fc(x)) * self.scale


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.head(self.block(x))


def test_parameter_is_plain_tensor():
    p = nn.Parameter(sampan.zeros(2, 3))
    assert type(p) is sampan.Tensor and isinstance(p, nn.Parameter) and p.requires_grad
    assert not isinstance(sampan.zeros(2), nn.Parameter)
    assert not isinstance(p * 2, nn.Parameter)


def test_registration_and_traversal():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["block.scale", "block.fc.weight", "block.fc.bias", "block.bn.weight",
                     "block.bn.bias", "head.1.weight", "head.1.bias"]
    assert [n for n, _ in net.named_buffers()] == [
        "block.step", "block.bn.running_mean", "block.bn.running_var",
        "block.bn.num_batches_tracked"]
    assert [n for n, _ in net.named_children()] == ["block", "head"]
    assert [n for n, _ in net.named_layers()] == ["", "block", "block.fc", "block.bn", "head",
                                                  "head.0", "head.1"]
    assert len(net.layers()) == 7 and len(net.children()) == 2
    assert net.num_parameters() == 4 + 12 + 4 + 8 + 8 + 2
    assert net.block.plain == 5
    net.block.scale = None
    assert "block.scale" not in dict(net.named_parameters())
    with pytest.raises(sampan.SampanError, match="expected a Parameter"):
        net.block.fc.weight = sampan.zeros(3, 4)


def test_shared_parameter_counted_once():
    a = nn.Linear(3, 3)
    seq = nn.Sequential(a, a)
    assert len(seq.parameters()) == 2


def test_assign_before_init_is_clear():
    class Bad(nn.Layer):
        def __init__(self):
            self.fc = nn.Linear(2, 2)
    with pytest.raises(sampan.SampanError, match="super\\(\\).__init__"):
        Bad()


def test_state_dict_round_trip():
    sampan.manual_seed(1)
    a = Net()
    a(randn(5, 3))  # moves running stats
    sd = a.state_dict()
    assert "block.step" not in sd and "block.bn.running_mean" in sd
    sampan.manual_seed(2)
    b = Net()
    res = b.load_state_dict({k: v.numpy().copy() for k, v in sd.items()})
    assert res.missing_keys == [] and res.unexpected_keys == []
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd[k].numpy())
    x = randn(4, 3)
    a.eval(), b.eval()
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())


def test_strict_load_error_lists_keys():
    net = Net()
    sd = dict(net.state_dict())
    del sd["head.1.bias"]
    sd["extra.weight"] = sampan.zeros(1)
    sd["block.fc.weight"] = sampan.zeros(4, 3)
    with pytest.raises(sampan.ShapeError) as e:
        net.load_state_dict(sd)
    msg = str(e.value)
    assert "Net.load_state_dict" in msg
    assert "missing keys: head.1.bias" in msg
    assert "unexpected keys: extra.weight" in msg
    assert "block.fc.weight: checkpoint (4, 3) vs layer (3, 4)" in msg
    sd["block.fc.weight"] = sampan.zeros(3, 4)
    res = net.load_state_dict(sd, strict=False)
    assert res.missing_keys == ["head.1.bias"] and res.unexpected_keys == ["extra.weight"]
    assert np.all(net.block.fc.weight.numpy() == 0)
    with pytest.raises(sampan.ShapeError, match="missing keys"):
        net.load_state_dict(sd)


def test_hooks_and_handles():
    fc = nn.Linear(2, 2)
    calls = []
    h1 = fc.register_forward_pre_hook(lambda m, args: calls.append("pre") or (args[0] * 0,))
    h2 = fc.register_forward_hook(lambda m, args, out: calls.append("post") or out + 1)
    y = fc(sampan.ones(1, 2))
    assert calls == ["pre", "post"]
    np.testing.assert_allclose(y.numpy(), fc.bias.numpy()[None] + 1, rtol=1e-6)
    h1.remove()
    h2.remove()
    calls.clear()
    fc(sampan.ones(1, 2))
    assert calls == []


def test_train_eval_apply_zero_grad_to():
    net = Net()
    net.eval()
    assert not any(m.training for m in net.layers())
    net.train()
    assert all(m.training for m in net.layers())
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and "Linear" in seen
    net(randn(4, 3)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    w = net.block.fc.weight
    net.to("float64")
    assert net.block.fc.weight is w and w.dtype == np.float64
    assert net.block.bn.running_mean.dtype == np.float64
    assert net.block.bn.num_batches_tracked.dtype == np.int64
    assert net(randn(4, 3, dtype="float64")).dtype == np.float64


def test_repr_tree():
    r = repr(Net())
    assert r.startswith("Net(\n  (block): Block(\n    (fc): Linear(in_features=3, out_features=4")
    assert "    (bn): BatchNorm1d(4, eps=1e-05" in r
    assert "  (head): Sequential(\n    (0): ReLU()\n    (1): Linear(" in r


def test_containers():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU) and len(seq[:2]) == 2
    assert seq(randn(4, 2)).shape == (4, 1)
    ll = nn.LayerList([nn.Linear(2, 2) for _ in range(3)])
    ll.append(nn.Linear(2, 2))
    assert len(ll) == 4 and len(ll.parameters()) == 8 and ll[-1] is ll[3]
    assert [n for n, _ in ll.named_parameters()][:2] == ["0.weight", "0.bias"]
    ld = nn.LayerDict({"a": nn.Linear(2, 2)})
    ld["b"] = nn.Linear(2, 3)
    assert list(ld.keys()) == ["a", "b"] and "b" in ld
    assert [n for n, _ in ld.named_parameters()] == ["a.weight", "a.bias", "b.weight",
                                                     "b.bias"]
    with pytest.raises(sampan.SampanError, match="expected a Layer"):
        ll.append(3)
