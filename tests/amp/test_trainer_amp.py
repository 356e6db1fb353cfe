"""Trainer(amp=...): forward under autocast, float16 with a GradScaler whose state is in
the trainer's checkpoints."""
import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.data import DataLoader, TensorDataset
from sampan.optim import Adam
from sampan.train import Checkpoint, Trainer, accuracy


def _trainer(amp, hooks=()):
    sampan.manual_seed(0)
    r = np.random.default_rng(0)
    x = r.standard_normal((192, 8)).astype(np.float32)
    y = (x @ r.standard_normal((8, 3)).astype(np.float32)).argmax(1)
    x, y = sampan.tensor(x), sampan.tensor(y)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    train = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=16, shuffle=True, seed=3)
    evl = DataLoader(TensorDataset(x[128:], y[128:]), batch_size=64)
    return Trainer(model, Adam(model.parameters(), lr=0.02), sampan.cross_entropy, train,
                   evl, metrics={"acc": accuracy}, amp=amp, hooks=list(hooks))


@pytest.mark.parametrize("dtype", [sampan.bfloat16, sampan.float16])
def test_trainer_amp_learns_and_checkpoints_the_scaler(dtype, tmp_path):
    t = _trainer(dtype, hooks=[Checkpoint(str(tmp_path), every_n_steps=8)])
    hist = t.fit(epochs=3)
    assert hist[-1]["val_acc"] > 0.7
    assert all(p.dtype == np.float32 for p in t.model.parameters())
    state = t.state_dict()
    if dtype == sampan.float16:
        assert state["grad_scaler"]["scale"] == t.grad_scaler.get_scale()
        t2 = _trainer(dtype)
        t2.load_state_dict(sampan.io.load(str(sorted(tmp_path.iterdir())[-1])))
        assert t2.grad_scaler.state_dict() == t.grad_scaler.state_dict()
    else:
        assert t.grad_scaler is None and state["grad_scaler"] is None
