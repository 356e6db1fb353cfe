"""sampan.prune: magnitude masks that survive optimiser steps, channel pruning that
shrinks a CNN (parameter count by hand) and keeps its accuracy after a short fine-tune,
refusals where the channel dependency cannot be followed, and the report table."""
import io

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.prune import PruneError


def _mlp():
    sampan.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 4))


def _steps(net, opt, n=5):
    x = sampan.randn(32, 10)
    y = sampan.randint(0, 4, (32,))
    for _ in range(n):
        opt.zero_grad()
        sampan.cross_entropy(net(x), y).backward()
        opt.step()


@pytest.mark.parametrize("make_opt", [
    lambda p: sampan.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-2),
    lambda p: sampan.optim.Adam(p, lr=0.05),
    lambda p: sampan.optim.AdamW(p, lr=0.05, weight_decay=0.1),
])
def test_masks_survive_optimizer_steps(make_opt):
    net = _mlp()
    sp = sampan.prune.magnitude(net, amount=0.6)
    masks = {n: sampan.prune.mask_of(net[int(n)]).copy() for n in sp}
    before = {n: net[int(n)].weight._data.copy() for n in sp}
    _steps(net, make_opt(net.parameters()))
    for n, m in masks.items():
        w = net[int(n)].weight._data
        assert np.all(w[~m] == 0)                 # exactly zero, not small
        assert not np.array_equal(w[m], before[n][m])   # the others did train
    assert sampan.prune.sparsity(net)["total"] == pytest.approx(0.6, abs=1 / 224)
    sampan.prune.remove(net)
    assert not sampan.prune.is_pruned(net[0])
    assert sampan.prune.sparsity(net)["total"] == pytest.approx(0.6, abs=1 / 224)


def test_global_and_per_layer_scopes_and_repruning():
    net = _mlp()
    sp = sampan.prune.magnitude(net, amount=0.5, scope="layer")
    assert sp == {"0": 0.5, "2": 0.5}
    first = sampan.prune.mask_of(net[0]).copy()
    sampan.prune.magnitude(net, amount=0.75, scope="layer")
    assert not np.any(sampan.prune.mask_of(net[0])[~first])   # masked weights stay masked
    assert sampan.prune.sparsity(net)["0"] == 0.75
    g = _mlp()
    sampan.prune.magnitude(g, amount=0.5)
    ws = np.concatenate([np.abs(g[0].weight._data[sampan.prune.mask_of(g[0])]),
                         np.abs(g[2].weight._data[sampan.prune.mask_of(g[2])])])
    ref = np.concatenate([np.abs(_mlp()[0].weight._data).ravel(),
                          np.abs(_mlp()[2].weight._data).ravel()])
    assert ws.min() >= np.sort(ref)[len(ref) // 2 - 1]     # the global smallest went
    with pytest.raises(PruneError, match="amount"):
        sampan.prune.magnitude(g, amount=1.5)


def _cnn():
    sampan.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 2 * 2, 24), nn.ReLU(), nn.Linear(24, 4))


def _planted(n, seed):
    """Four classes: a fixed 8x8 pattern each, plus noise."""
    protos = np.random.default_rng(123).standard_normal((4, 1, 8, 8)).astype(np.float32)
    r = np.random.default_rng(seed)
    y = r.integers(0, 4, n)
    x = protos[y] + 0.8 * r.standard_normal((n, 1, 8, 8)).astype(np.float32)
    return sampan.from_numpy(x), sampan.from_numpy(y)


def _train(net, steps, lr=1e-2):
    opt = sampan.optim.Adam(net.parameters(), lr=lr)
    x, y = _planted(512, 5)
    net.train()
    for i in range(steps):
        s = slice((i * 64) % 512, (i * 64) % 512 + 64)
        opt.zero_grad()
        sampan.cross_entropy(net(x[s]), y[s]).backward()
        opt.step()
    net.eval()


def _accuracy(net):
    x, y = _planted(400, 9)
    with sampan.no_grad():
        return float((net(x).numpy().argmax(1) == y.numpy()).mean())


def test_channel_pruning_shrinks_and_keeps_accuracy(tmp_path):
    net = _cnn()
    _train(net, 120)
    dense = _accuracy(net)
    x = sampan.randn(2, 1, 8, 8)
    big = sampan.jit.save(net, str(tmp_path / "big.sampan"), (x,))
    r = sampan.prune.channels(net, amount=0.5, example_inputs=(x,))
    assert [(n, a, b) for n, a, b in r.pruned] == [("0", 8, 4), ("4", 16, 8), ("8", 24, 12)]
    by_hand = ((4 * 1 * 9 + 4) + (4 + 4) + (8 * 4 * 9 + 8) + (8 * 4 * 12 + 12)
               + (12 * 4 + 4))
    assert r.params_after == net.num_parameters() == by_hand
    assert net(x).shape == (2, 4)
    _train(net, 60, lr=5e-3)                          # a short fine-tune
    pruned = _accuracy(net)
    assert dense >= 0.9 and pruned >= dense - 0.01, (dense, pruned)
    small = sampan.jit.save(net, str(tmp_path / "small.sampan"), (x,))
    size = lambda p: (p / "weights.safetensors").stat().st_size  # noqa: E731
    assert size(tmp_path / "small.sampan") < 0.5 * size(tmp_path / "big.sampan")
    np.testing.assert_allclose(sampan.jit.load(small)(x).numpy(), net(x).numpy(),
                               rtol=1e-4, atol=1e-5)
    assert big


class _Residual(nn.Layer):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return x + self.b(self.a(x))


def test_dependencies_that_cannot_be_followed_are_refused():
    x = sampan.randn(1, 4, 6, 6)
    with pytest.raises(PruneError, match="residual add"):
        sampan.prune.channels(_Residual(), 0.5, example_inputs=(x,))
    with pytest.raises(PruneError, match="example_inputs"):
        sampan.prune.channels(_Residual(), 0.5)
    grouped = nn.Sequential(nn.Conv2d(4, 8, 3, groups=2), nn.Conv2d(8, 4, 1))
    with pytest.raises(PruneError, match="grouped"):
        sampan.prune.channels(grouped, 0.5)
    mixed = nn.Sequential(nn.Linear(4, 8), nn.Softmax(1), nn.Linear(8, 2))
    with pytest.raises(PruneError, match="'1' \\(Softmax\\)"):
        sampan.prune.channels(mixed, 0.5)
    masked = _mlp()
    sampan.prune.magnitude(masked, 0.5)
    with pytest.raises(PruneError, match="remove"):
        sampan.prune.channels(masked, 0.5)


def test_report_prints_a_table():
    a, b = _mlp(), _mlp()
    sampan.prune.channels(b, 0.5)
    out = io.StringIO()
    rows = sampan.prune.report({"dense": a, "half": b}, (sampan.randn(1, 10),),
                               accuracy=lambda m: 0.5, repeats=20, file=out)
    text = out.getvalue()
    assert "sparsity" in text and "half" in text and "speed-up" in text
    assert rows["half"]["params"] < rows["dense"]["params"]
    assert rows["half"]["accuracy"] == 0.5


class _Functional(nn.Layer):
    """The CNN of `_cnn` with a forward of its own: pruned through its traced graph."""

    def __init__(self, seq):
        super().__init__()
        self.c1, self.bn, self.c2, self.f1, self.f2 = seq[0], seq[1], seq[4], seq[8], seq[10]

    def forward(self, x):
        F = nn.functional
        h = F.max_pool2d(sampan.relu(self.bn(self.c1(x))), 2)
        h = F.max_pool2d(sampan.relu(self.c2(h)), 2).flatten(1)
        return sampan.softmax(self.f2(sampan.relu(self.f1(h))), -1)


def test_traced_pruning_of_a_custom_forward_matches_the_sequential_walk():
    seq = _cnn()
    seq[1].running_mean._data[:] = np.linspace(-1, 1, 8, dtype=np.float32)
    seq[1].running_var._data[:] = np.linspace(0.5, 2, 8, dtype=np.float32)
    seq.eval()
    import copy
    fun = _Functional(copy.deepcopy(seq))
    fun.eval()
    x = sampan.randn(3, 1, 8, 8)
    r1 = sampan.prune.channels(seq, 0.5, example_inputs=(x,), norm="l1")
    r2 = sampan.prune.channels(fun, 0.5, example_inputs=(x,), norm="l1")
    assert [p[1:] for p in r1.pruned] == [p[1:] for p in r2.pruned]
    assert r1.params_after == r2.params_after
    assert fun.bn.num_features == 4 and fun.bn.running_mean.shape == (4,)
    np.testing.assert_array_equal(sampan.softmax(seq(x), -1).numpy(), fun(x).numpy())


def test_masks_survive_a_jit_compiled_training_step():
    net = _mlp()
    sampan.prune.magnitude(net, amount=0.5)
    opt = sampan.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = sampan.randn(16, 10), sampan.randint(0, 4, (16,))

    @sampan.jit
    def step(x, y):
        opt.zero_grad()
        loss = sampan.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss
    for _ in range(4):
        step(x, y)
    for layer in (net[0], net[2]):
        assert np.all(layer.weight._data[~sampan.prune.mask_of(layer)] == 0)
