"""Issue 31, pruning: 50% channel pruning of the W5 CNN (LeNet-5) gives the model its dense
twin computes once the pruned channels are zeroed (their weights and biases: ReLU and
pooling keep a zero channel zero, so the next layer reads nothing from it), in eager, in
the loaded program, through the Predictor at batch 1 and above, and in `prune.report`'s
served executor (the one whose latency the report gives)."""
import copy
import io

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor


def _lenet():
    sampan.manual_seed(31)
    net = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                        nn.Linear(84, 10))
    r = np.random.default_rng(0)
    for p in net.parameters():
        if p._data.ndim == 1:             # biases not zero: a zeroed channel must be
            p._data[...] = r.uniform(0.05, 0.2, p._data.shape)   # cut with its bias
    net.eval()
    return net


def _kept_rows(dense_w, small_w, kept_in, per_in=1, linear=False):
    """Indices of the dense layer's output channels the pruned layer kept (matched row
    by row over the kept inputs)."""
    if linear:                            # Linear weight (in, out): channels are columns
        cols = np.concatenate([np.arange(c * per_in, (c + 1) * per_in) for c in kept_in])
        d, s = dense_w[cols].T, small_w.T
    else:
        d, s = dense_w[:, kept_in], small_w
    kept = [next(i for i in range(len(d)) if np.array_equal(d[i], row)) for row in s]
    assert kept == sorted(kept) and len(set(kept)) == len(kept)
    return kept


@pytest.fixture(scope="module")
def twins():
    x = sampan.tensor(np.random.default_rng(1).standard_normal((1, 1, 28, 28))
                      .astype(np.float32))
    dense = _lenet()
    small = copy.deepcopy(dense)
    rep = sampan.prune.channels(small, 0.5, example_inputs=(x,))
    assert [(a, b) for _, a, b in rep.pruned] == [(6, 3), (16, 8), (120, 60), (84, 42)]
    twin = copy.deepcopy(dense)
    layers = [0, 3, 7, 9]                 # the pruned producers; the last (11) kept whole
    kept_in, per_in = [0], 1
    for k in layers:
        d, s = dense[k].weight.numpy(), small[k].weight.numpy()
        linear = isinstance(dense[k], nn.Linear)
        kept = _kept_rows(d, s, kept_in, per_in, linear)
        np.testing.assert_array_equal(small[k].bias.numpy(), dense[k].bias.numpy()[kept])
        drop = np.setdiff1d(np.arange(dense[k].bias.numpy().size), kept)
        w = twin[k].weight._data
        if linear:
            w[:, drop] = 0
        else:
            w[drop] = 0
        twin[k].bias._data[drop] = 0
        kept_in, per_in = kept, (25 if k == 3 else 1)   # conv2 -> Flatten: 5x5 a channel
    return dense, small, twin


def _batch(n, seed):
    return np.random.default_rng(seed).standard_normal((n, 1, 28, 28)).astype(np.float32)


def test_pruned_model_equals_its_zeroed_dense_twin(twins):
    dense, small, twin = twins
    x = sampan.tensor(_batch(5, 2))
    with sampan.no_grad():
        a, b, c = small(x).numpy(), twin(x).numpy(), dense(x).numpy()
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert np.abs(a - c).max() > 1e-3        # the channels did carry something
    assert small.num_parameters() < 0.3 * dense.num_parameters()


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_predictors_of_the_twins_agree(twins, tmp_path, batch):
    _, small, twin = twins
    x = _batch(batch, 3)
    ex = (sampan.tensor(_batch(2, 4)),)
    got = {}
    for name, m in (("small", small), ("twin", twin)):
        path = sampan.jit.save(m, str(tmp_path / f"{name}.sampan"), ex,
                               dynamic={"x": {0: "batch"}})
        (got[name],) = create_predictor(Config(path)).run([x])
        loaded = sampan.jit.load(path)
        np.testing.assert_allclose(loaded(sampan.tensor(x)).numpy(), got[name],
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["small"], got["twin"], rtol=1e-5, atol=1e-5)


def test_report_times_the_served_executor(twins, tmp_path):
    """The report's latency comes from the executor a Predictor serves (the kernels
    chosen for the program's shapes), which answers as the loaded program does."""
    from sampan.prune.report import _served
    dense, small, twin = twins
    x = (sampan.tensor(_batch(1, 5)),)
    out = io.StringIO()
    rows = sampan.prune.report({"dense": dense, "50% channels": small, "twin": twin}, x,
                               repeats=20, file=out)
    assert rows["50% channels"]["params"] < rows["dense"]["params"]
    assert rows["twin"]["sparsity"] > 0.45 and "speed-up" in out.getvalue()
    prog = sampan.jit.load(sampan.jit.save(small, str(tmp_path / "s.sampan"), x))
    served = _served(prog)
    lines = served.code.splitlines()
    assert any("= s" in ln and "_conv2d(" in ln for ln in lines), served.code
    assert any("= s" in ln and "_max_pool2d(" in ln for ln in lines), served.code
    arrays = prog.input_arrays(x)
    np.testing.assert_allclose(served(*arrays)[0], prog.compiled(*arrays)[0],
                               rtol=1e-5, atol=1e-5)
