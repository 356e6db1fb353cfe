"""Trainer: learning, JSONL logs, exact resume from a checkpoint, early stopping, debugging."""
import json

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.data import DataLoader, TensorDataset
from sampan.optim import SGD, Adam
from sampan.optim.lr_scheduler import CosineAnnealingLR, ReduceLROnPlateau
from sampan.train import (
    Checkpoint,
    DebugStep,
    EarlyStopping,
    Hook,
    JSONLLogger,
    ProgressBar,
    Trainer,
    accuracy,
)


def _data(n=192, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    y = (x @ w).argmax(1).astype(np.int64)
    return sampan.tensor(x), sampan.tensor(y)


def _setup(seed=0, dropout=0.2, sched=True, hooks=(), shuffle_seed=7, **kw):
    sampan.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 3))
    opt = Adam(model.parameters(), lr=0.02)
    x, y = _data()
    train = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=16, shuffle=True,
                       seed=shuffle_seed)
    evl = DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32)
    sch = CosineAnnealingLR(opt, T_max=40) if sched else None
    return Trainer(model, opt, sampan.cross_entropy, train, evl, hooks=list(hooks),
                   scheduler=sch, metrics={"acc": accuracy}, **kw)


class _Losses(Hook):
    def __init__(self):
        self.losses = []

    def after_step(self, trainer, logs):
        self.losses.append(logs["loss"])


class _Crash(Hook):
    """Simulates a killed run: raises after a given global step."""

    def __init__(self, at):
        self.at = at

    def after_step(self, trainer, logs):
        if trainer.global_step == self.at:
            raise KeyboardInterrupt


def test_loss_decreases_and_metrics():
    rec = _Losses()
    t = _setup(dropout=0.0, hooks=[rec, ProgressBar(disable=True)])
    hist = t.fit(6)
    assert len(hist) == 6 and t.global_step == 48
    assert hist[-1]["train_loss"] < 0.6 * hist[0]["train_loss"]
    assert hist[-1]["val_acc"] > 0.8
    assert np.mean(rec.losses[-8:]) < np.mean(rec.losses[:8])
    assert set(t.evaluate()) == {"loss", "acc"}
    assert t.predict(t.eval_loader).shape == (64, 3)
    assert t.model.training  # evaluate/predict restore the mode


def test_jsonl_logger(tmp_path):
    path = tmp_path / "logs" / "run.jsonl"
    t = _setup(hooks=[JSONLLogger(path)])
    t.fit(2)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "step"]
    epochs = [r for r in recs if r["kind"] == "epoch"]
    assert [r["step"] for r in steps] == list(range(1, 17))
    assert {"loss", "lr", "epoch", "time"} <= set(steps[0])
    assert [r["epoch"] for r in epochs] == [0, 1] and "val_acc" in epochs[0]


@pytest.mark.parametrize("crash_at", [11, 16])  # mid-epoch and at an epoch's last batch
def test_resume_continues_loss_curve_exactly(tmp_path, crash_at):
    full = _Losses()
    t = _setup(hooks=[full])
    t.fit(4)
    ref_params = [p.numpy().copy() for p in t.model.parameters()]

    ckdir, log = tmp_path / "ck", tmp_path / "log.jsonl"
    first = _Losses()
    t1 = _setup(seed=123, hooks=[first, Checkpoint(ckdir, every_n_steps=5, save_at_end=False),
                                 JSONLLogger(log), _Crash(crash_at)])
    t1.model.load_state_dict(_setup().model.state_dict())  # same init as the reference run
    with pytest.raises(KeyboardInterrupt):
        t1.fit(4)
    last_ck = (crash_at // 5) * 5
    assert first.losses == full.losses[:crash_at]

    # a fresh process: different init and RNG state, everything comes from the checkpoint
    second = _Losses()
    ck = Checkpoint(ckdir, every_n_steps=5)
    t2 = _setup(seed=999, hooks=[second, ck, JSONLLogger(log)])
    sampan.manual_seed(4242)
    t2.fit(4)
    assert ck.resumed_from.endswith(f"step-{last_ck:09d}.sampan")
    assert second.losses == full.losses[last_ck:]  # bit for bit
    for a, b in zip(t2.model.parameters(), ref_params):
        assert np.array_equal(a.numpy(), b)
    assert [h["train_loss"] for h in t2.history] == [h["train_loss"] for h in t.history]
    steps = [json.loads(s)["step"] for s in log.read_text().splitlines()
             if json.loads(s)["kind"] == "step"]
    assert steps == list(range(1, 33))  # the crashed run's extra lines were dropped


def test_early_stopping_triggers():
    stop = EarlyStopping("val_loss", patience=2, restore_best=True)
    t = _setup(hooks=[stop], sched=False)
    t.optimizer.param_groups[0]["lr"] = 0.0  # nothing improves after the first epoch
    hist = t.fit(20)
    assert stop.stopped_epoch == 2 and len(hist) == 3 and t.should_stop


def test_early_stopping_max_mode_and_missing_key():
    stop = EarlyStopping("val_acc", mode="max", patience=1)
    t = _setup(hooks=[stop])
    t.optimizer.param_groups[0]["lr"] = 0.0
    t.scheduler = None
    t.fit(10)
    assert stop.stopped_epoch == 1
    with pytest.raises(sampan.SampanValueError, match="no 'nope'"):
        _setup(hooks=[EarlyStopping("nope")]).fit(1)


def test_reduce_on_plateau_scheduler_fed_per_epoch():
    t = _setup(sched=False)
    t.scheduler = ReduceLROnPlateau(t.optimizer, patience=0, factor=0.5)
    t.optimizer.param_groups[0]["lr"] = 0.0
    t.fit(3)
    assert t.scheduler.last_epoch == 3


def test_debug_step_hook_fetches_intermediates():
    probe = DebugStep(["0", "1", "3", "grad:3.weight", "loss", "output"], at_step=2,
                      stop=True)
    t = _setup(hooks=[probe], dropout=0.0)
    t.fit(3)
    assert t.global_step == 3
    v = probe.values
    assert v["0"].shape == (16, 16) and v["3"].shape == (16, 3)
    np.testing.assert_array_equal(v["1"], np.maximum(v["0"], 0))
    np.testing.assert_array_equal(v["3"], v["output"])
    assert v["grad:3.weight"].shape == t.model[3].weight.shape and np.isfinite(v["loss"])


def test_trainer_debug_step_without_update():
    t = _setup(dropout=0.0)
    before = [p.numpy().copy() for p in t.model.parameters()]
    v = t.debug_step(["3", "loss", "grad:0.bias"])
    assert v["3"].shape == (16, 3) and v["grad:0.bias"].shape == (16,)
    for p, b in zip(t.model.parameters(), before):
        assert np.array_equal(p.numpy(), b)
    with pytest.raises(sampan.SampanValueError, match="no sub-layer 'nope'"):
        t.debug_step(["nope"])


def test_duck_typed_model_and_plain_loop_agree():
    """The Trainer runs any object with parameters/state_dict/train/eval/__call__, and
    its steps equal a plain hand-written loop's."""

    class Tiny:
        def __init__(self):
            self.w = sampan.tensor(np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3),
                                   requires_grad=True)
            self.training = True

        def parameters(self):
            return [self.w]

        def state_dict(self):
            return {"w": self.w.detach()}

        def load_state_dict(self, sd):
            self.w._data[...] = np.asarray(sd["w"])

        def train(self, mode=True):
            self.training = mode

        def eval(self):
            self.training = False

        def __call__(self, x):
            return x @ self.w

    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    m1, m2 = Tiny(), Tiny()
    t = Trainer(m1, SGD(m1.parameters(), lr=0.1, momentum=0.9), sampan.cross_entropy, loader,
                grad_clip_norm=1.0)
    t.fit(2)
    opt = SGD(m2.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            sampan.cross_entropy(m2(xb), yb).backward()
            sampan.optim.clip_grad_norm_(m2.parameters(), 1.0)
            opt.step()
    assert np.array_equal(m1.w.numpy(), m2.w.numpy())
