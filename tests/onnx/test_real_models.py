"""Models no one here wrote: PyTorch's own ONNX exporter (TorchScript, opset 17) writes an
MLP, LeNet, a ResNet-style block with BatchNorm, `nn.TransformerEncoderLayer`, `nn.LSTM`
and a small GPT-style decoder; sampan imports each (`sampan.onnx.to_layer`) and must agree
with onnxruntime and with PyTorch on the same inputs (max abs error <= 1e-5, float32) at
two batch sizes through the dynamic batch axis. One imported model fine-tunes with
`sampan.optim.SGD`; each is jitted with a dynamic batch, saved with `sampan.jit.save`
and reloaded."""
import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import sampan  # noqa: E402

TOL = 1e-5
BATCHES = (2, 3)


# ---------------------------------------------------------------------- the models
class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 4, 5, padding=2), nn.Conv2d(4, 8, 5)
        self.f1, self.f2 = nn.Linear(8 * 2 * 2, 16), nn.Linear(16, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.c1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.f2(torch.relu(self.f1(torch.flatten(x, 1))))


class ResBlock(nn.Module):
    """Pre-activation residual block (BN -> ReLU -> conv, twice) plus a post-conv BN: the
    exporter folds a BN that follows a conv into it, so the first BN stays a
    BatchNormalization node."""

    def __init__(self, c=4):
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        y = self.c1(torch.relu(self.bn1(x)))
        y = self.c2(torch.relu(self.bn2(y)))
        return torch.relu(x + y)


class LSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 6, batch_first=True)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        y, (h, c) = self.rnn(x)
        return self.head(y), h, c


class GPT(nn.Module):
    """One pre-LayerNorm decoder block: causal attention from a triangular mask, exact
    GELU MLP, tied input/output embedding."""

    def __init__(self, vocab=20, d=16, heads=2, seq=8):
        super().__init__()
        self.heads = heads
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, ids):
        b, t = ids.shape
        x = self.tok(ids) + self.pos(torch.arange(t))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        a = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
        a = a.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, -1))
        x = x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))
        return self.lnf(x) @ self.tok.weight.T


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 4))


class Encoder(nn.Module):
    """`nn.TransformerEncoderLayer` (batch_first); called with its keyword arguments
    spelt out, since the TorchScript exporter otherwise traces `is_causal` as a tensor."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0,
                                                batch_first=True)

    def forward(self, x):
        return self.layer(x, src_mask=None, is_causal=False)


# name: (build, input maker (batch) -> list of arrays, dynamic axes per input, outputs)
def _f(*shape):
    def make(b, seed=0):
        return [np.random.default_rng(seed + b).standard_normal((b, *shape), np.float32)]
    return make


def _ids(b, seed=0):
    return [np.random.default_rng(seed + b).integers(0, 20, (b, 8)).astype(np.int64)]


MODELS = {
    "mlp": (_mlp, _f(8), {"x": {0: "N"}}, ["y"]),
    "lenet": (LeNet, _f(1, 16, 16), {"x": {0: "N"}}, ["y"]),
    "resblock": (ResBlock, _f(4, 6, 6), {"x": {0: "N"}}, ["y"]),
    # the TorchScript exporter bakes the sequence length into the attention's Reshape
    # (onnxruntime refuses another length too): only the batch is dynamic
    "encoder": (Encoder, _f(5, 16), {"x": {0: "N"}}, ["y"]),
    "lstm": (LSTM, _f(5, 4), {"x": {0: "N"}}, ["y", "h", "c"]),
    "gpt": (GPT, _ids, {"x": {0: "N"}}, ["y"]),
}


# ONNX ops each export must contain: the layer is imported as that op, not something else
EXPECT = {"mlp": {"Gemm", "Relu", "Tanh"}, "lenet": {"Conv", "MaxPool", "Flatten", "Gemm"},
          "resblock": {"BatchNormalization", "Conv", "Add"},
          "encoder": {"MatMul", "Softmax", "LayerNormalization"}, "lstm": {"LSTM"},
          "gpt": {"Gather", "Where", "Softmax", "LayerNormalization", "Erf"}}


def _export(name):
    build, make, axes, outs = MODELS[name]
    torch.manual_seed(0)
    m = build().eval()
    for mod in m.modules():         # BatchNorm with statistics that are not the identity
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    args = tuple(torch.from_numpy(a) for a in make(2))
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, args, f, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=outs, dynamic_axes={**axes, **{o: {0: "N"} for o in
                                                                      outs[:1]}})
    return m, f.getvalue()


@pytest.fixture(scope="module")
def exported():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _export(name)
        return cache[name]
    return get


def _torch(m, xs):
    with torch.no_grad():
        out = m(*[torch.from_numpy(a) for a in xs])
    out = out if isinstance(out, tuple) else (out,)
    return [o.numpy() for o in out]


# ---------------------------------------------------------------------- the tests
@pytest.mark.parametrize("name", list(MODELS))
def test_import_matches_onnxruntime_and_pytorch(name, exported):
    m, blob = exported(name)
    ops = {n.op_type for n in onnx.load_from_string(blob).graph.node}
    assert EXPECT[name] <= ops, (name, sorted(ops))
    layer = sampan.onnx.to_layer(blob)
    layer.eval()
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    make = MODELS[name][1]
    for b in BATCHES:
        xs = make(b)
        with sampan.no_grad():
            got = layer(*[sampan.tensor(a) for a in xs])
        got = [t.numpy() for t in (got if isinstance(got, tuple) else (got,))]
        want_ort = sess.run(None, {"x": xs[0]})
        want_torch = _torch(m, xs)
        assert len(got) == len(want_ort) == len(want_torch)
        for k, (g, o, t) in enumerate(zip(got, want_ort, want_torch)):
            assert g.shape == o.shape and g.dtype == o.dtype, (name, b, k)
            err_ort, err_torch = np.abs(g - o).max(), np.abs(g - t).max()
            assert err_ort <= TOL and err_torch <= TOL, (name, b, k, err_ort, err_torch)


def test_fine_tune_imported_model(exported):
    _, blob = exported("lenet")
    layer = sampan.onnx.to_layer(blob)
    before = {n: p.numpy().copy() for n, p in layer.named_parameters()}
    assert before, "the initializers should be parameters"
    opt = sampan.optim.SGD(layer.parameters(), lr=0.05)
    x = sampan.tensor(_f(1, 16, 16)(4)[0])
    y = sampan.tensor(np.random.default_rng(1).integers(0, 10, 4))
    losses = []
    for _ in range(5):
        loss = sampan.nn.functional.cross_entropy(layer(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    assert losses[-1] < losses[0], losses
    changed = [n for n, p in layer.named_parameters()
               if not np.array_equal(p.numpy(), before[n])]
    assert len(changed) == len(before), set(before) - set(changed)


@pytest.mark.parametrize("name", list(MODELS))
def test_jit_save_and_reload_imported_model(name, exported, tmp_path):
    """Traced with a dynamic batch, saved, reloaded: one program for every batch size."""
    m, blob = exported(name)
    make = MODELS[name][1]
    layer = sampan.onnx.to_layer(blob)
    layer.eval()
    dyn = {0: {0: "N"}}
    f = sampan.jit(layer, pipeline="inference", dynamic=dyn)
    path = sampan.jit.save(layer, str(tmp_path / f"{name}.sampan"),
                           tuple(sampan.tensor(a) for a in make(2)), dynamic=dyn)
    loaded = sampan.jit.load(path)
    for b in BATCHES:
        xs = make(b)
        want = _torch(m, xs)
        with sampan.no_grad():
            for run in (f, loaded):
                got = run(*[sampan.tensor(a) for a in xs])
                got = got if isinstance(got, tuple) else (got,)
                errs = [np.abs(g.numpy() - w).max() for g, w in zip(got, want)]
                assert len(got) == len(want) and max(errs) <= TOL, (name, b, errs)
