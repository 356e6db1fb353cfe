"""Models the predictor tests save once per session: an MLP, a small CNN (with an eval
batch-norm for the inference passes to fold) and a two-input model with batch and
sequence dims."""
import numpy as np

import sampan
from sampan import nn


class TwoIn(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, a, b):
        return {"y": (self.fc(a) + b.unsqueeze(1)).relu(), "s": a.sum(-1)}


def models():
    sampan.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(4 * 3 * 3, 5))
    cnn.eval()
    two = TwoIn()
    for m in (mlp, cnn, two):
        m.eval()
    return mlp, cnn, two


def save_all(root):
    mlp, cnn, two = models()
    paths = {}
    paths["mlp"] = sampan.jit.save(mlp, str(root / "mlp.sampan"), (sampan.randn(3, 8),),
                                   dynamic="batch")
    paths["cnn"] = sampan.jit.save(cnn, str(root / "cnn.sampan"), (sampan.randn(2, 1, 8, 8),),
                                   dynamic={"x": {0: "batch"}})
    paths["two"] = sampan.jit.save(two, str(root / "two.sampan"),
                                   (sampan.randn(2, 3, 4), sampan.randn(2, 6)),
                                   dynamic={"a": {0: "batch", 1: "seq"}, "b": {0: "batch"}})
    paths["static"] = sampan.jit.save(mlp, str(root / "static.sampan"), (sampan.randn(2, 8),))
    return {"mlp": mlp, "cnn": cnn, "two": two}, paths


def eager(model, *arrays):
    with sampan.no_grad():
        out = model(*[sampan.tensor(a) for a in arrays])
    if isinstance(out, dict):
        return {k: v.numpy() for k, v in out.items()}
    return out.numpy()


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
