"""Resuming can be trusted: damaged checkpoints, killed writes, optimiser states that do not fit."""
import errno
import os
import signal

import numpy as np
import pytest
import torch

import sampan
from sampan import nn
from sampan.data import DataLoader, TensorDataset
from sampan.errors import DTypeError, SampanValueError, ShapeError
from sampan.io import CheckpointError, load
from sampan.optim import SGD, Adam
from sampan.train import Checkpoint, Trainer

from test_trainer import _Crash, _Losses  # the same hooks as the trainer's own tests


# ----------------------------------------------------------------- a small run
def _trainer(hooks=(), seed=0):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = (x @ rng.standard_normal((6, 3)).astype(np.float32)).argmax(1).astype(np.int64)
    sampan.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    loader = DataLoader(TensorDataset(sampan.tensor(x), sampan.tensor(y)), batch_size=16,
                        shuffle=True, seed=3)
    return Trainer(model, Adam(model.parameters(), lr=0.02), sampan.cross_entropy, loader,
                   hooks=list(hooks))


EPOCHS = 4  # 4 batches an epoch: 16 steps


@pytest.fixture(scope="module")
def reference():
    rec = _Losses()
    _trainer([rec]).fit(EPOCHS)
    return rec.losses


def _crashed_run(ckdir, at=11):
    """Checkpoints at steps 3, 6, 9; killed at step `at`."""
    t = _trainer([Checkpoint(ckdir, every_n_steps=3, keep_last=5, save_at_end=False),
                  _Crash(at)])
    with pytest.raises(KeyboardInterrupt):
        t.fit(EPOCHS)
    return t


def _step_file(ckdir, step):
    return os.path.join(ckdir, f"step-{step:09d}.sampan")


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _damage(path, how):
    data = bytearray(_read(path))
    if how == "truncated":
        data = data[:len(data) // 2]
    elif how == "empty":
        data = bytearray()
    elif how == "payload byte":
        data[-9] ^= 0x10
    elif how == "header byte":
        data[60] ^= 0x01
    with open(path, "wb") as f:
        f.write(bytes(data))


def _params(t):
    return [p.numpy().copy() for p in t.model.parameters()]


# ----------------------------------------------------------------- damaged newest file
@pytest.mark.parametrize("how", ["truncated", "empty", "payload byte", "header byte"])
def test_resume_skips_a_damaged_newest_checkpoint(tmp_path, reference, how):
    ckdir = str(tmp_path / "ck")
    _crashed_run(ckdir)
    newest = _step_file(ckdir, 9)
    _damage(newest, how)
    with pytest.raises(CheckpointError):
        load(newest)  # the damage is real

    rec = _Losses()
    ck = Checkpoint(ckdir, every_n_steps=3, keep_last=5)
    t = _trainer([rec, ck], seed=99)
    with pytest.warns(RuntimeWarning, match=r"step-000000009\.sampan is damaged"):
        t.fit(EPOCHS)
    assert ck.resumed_from == _step_file(ckdir, 6)
    assert rec.losses == reference[6:]  # continued exactly from the newest good file
    # the damaged file is set aside, never again taken for the newest
    assert os.path.exists(newest + ".damaged")
    assert load(newest)["trainer"]["global_step"] == 9  # rewritten by the resumed run


def test_resume_with_every_checkpoint_damaged_is_a_clear_error(tmp_path):
    ckdir = str(tmp_path / "ck")
    _crashed_run(ckdir)
    for step in (3, 6, 9):
        _damage(_step_file(ckdir, step), "payload byte")
    t = _trainer([Checkpoint(ckdir, every_n_steps=3)], seed=99)
    before = _params(t)
    with pytest.raises(CheckpointError) as info:
        t.fit(EPOCHS)
    msg = str(info.value)
    assert "every checkpoint there is damaged" in msg and "resume=False" in msg
    for step in (3, 6, 9):
        assert f"step-{step:09d}.sampan" in msg
    assert msg.count("checksum mismatch") == 3
    assert t.global_step == 0
    for a, b in zip(_params(t), before):
        np.testing.assert_array_equal(a, b)  # nothing half-loaded
    assert sorted(os.listdir(ckdir)) == [f"step-{s:09d}.sampan" for s in (3, 6, 9)]


# ----------------------------------------------------------------- failed and killed writes
def test_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    ckdir = str(tmp_path / "ck")
    t = _crashed_run(ckdir, at=9)  # its newest file is step 9, and it stands at step 9
    newest = _step_file(ckdir, 9)
    old_bytes = _read(newest)
    t.model[0].weight._data += 1.0  # a state that differs from the file's

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        Checkpoint(ckdir, every_n_steps=3).save(t)  # overwrites step 9: fails half-way
    monkeypatch.undo()
    assert _read(newest) == old_bytes
    assert load(newest)["trainer"]["global_step"] == 9
    assert sorted(os.listdir(ckdir)) == [f"step-{s:09d}.sampan" for s in (3, 6, 9)]


def test_killed_write_leaves_the_previous_checkpoint_and_resume_works(tmp_path, reference):
    ckdir = str(tmp_path / "ck")
    t = _crashed_run(ckdir, at=9)
    newest = _step_file(ckdir, 9)
    old_bytes = _read(newest)
    t.model[0].weight._data += 1.0
    pid = os.fork()
    if pid == 0:  # the child is killed after writing every byte, before the rename
        try:
            os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
            Checkpoint(ckdir, every_n_steps=3).save(t)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    left = [n for n in os.listdir(ckdir) if n.endswith(".tmp")]
    assert len(left) == 1  # the killed write's temporary file, full size but never renamed
    assert _read(newest) == old_bytes

    rec = _Losses()
    ck = Checkpoint(ckdir, every_n_steps=3)
    _trainer([rec, ck], seed=5).fit(EPOCHS)
    assert ck.resumed_from == newest
    assert rec.losses == reference[9:]
    assert not [n for n in os.listdir(ckdir) if n.endswith(".tmp")]  # cleaned up


# ----------------------------------------------------------------- half a step, half a load
def test_exception_inside_a_step_leaves_the_last_checkpoint_alone(tmp_path, reference):
    ckdir = str(tmp_path / "ck")
    t = _trainer([Checkpoint(ckdir, every_n_steps=3, keep_last=5)])
    update = t.optimizer.step

    def step_then_crash(closure=None):  # step 7 updates the parameters, then dies
        out = update(closure)
        if t.global_step == 6:
            raise KeyboardInterrupt
        return out

    t.optimizer.step = step_then_crash
    with pytest.warns(RuntimeWarning, match="fit stopped inside step 7; no final checkpoint"), \
            pytest.raises(KeyboardInterrupt):
        t.fit(EPOCHS)
    # before: the final save wrote step 6's file again, with step 7's update in it
    rec = _Losses()
    ck = Checkpoint(ckdir, every_n_steps=3)
    _trainer([rec, ck], seed=7).fit(EPOCHS)
    assert ck.resumed_from == _step_file(ckdir, 6)
    assert rec.losses == reference[6:]


@pytest.mark.parametrize("bad,error", [("foreign index", "a state for parameter 17, which no"),
                                       ("float64 slot", "slot 'exp_avg' of dtype float64")])
def test_trainer_load_that_does_not_fit_leaves_the_trainer_as_it_was(tmp_path, bad, error):
    donor = _trainer()
    donor.fit(2)
    state = load_roundtrip(donor.state_dict(), tmp_path / "donor.sampan")
    opt_state = state["optimizer"]["state"]
    if bad == "foreign index":
        opt_state[17] = opt_state.pop(3)
    else:
        opt_state[3]["exp_avg"] = sampan.tensor(opt_state[3]["exp_avg"].numpy()
                                                .astype(np.float64))
    t = _trainer(seed=5)
    t.fit(1)
    params, step = _params(t), t.global_step
    opt_before = {i: {k: np.array(v.numpy()) if hasattr(v, "numpy") else v for k, v in s.items()}
                  for i, s in t.optimizer.state_dict()["state"].items()}
    with pytest.raises((SampanValueError, DTypeError), match=error):
        t.load_state_dict(state)
    assert t.global_step == step
    for a, b in zip(_params(t), params):
        np.testing.assert_array_equal(a, b)  # before: the donor's weights were already in
    opt_after = t.optimizer.state_dict()["state"]
    for i, s in opt_before.items():
        for k, v in s.items():
            got = opt_after[i][k]
            np.testing.assert_array_equal(got.numpy() if hasattr(got, "numpy") else got, v)


def load_roundtrip(state, path):
    sampan.save(state, path)
    return load(path)


# ----------------------------------------------------------------- optimiser states
def _adam_pair(shapes, steps=3, dtype=np.float32):
    """A sampan Adam and a torch Adam on the same parameters, stepped on the same grads."""
    rng = np.random.default_rng(1)
    init = [rng.standard_normal(s).astype(dtype) for s in shapes]
    ps = [sampan.tensor(a.copy(), requires_grad=True) for a in init]
    tps = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    opt, topt = Adam(ps, lr=0.05), torch.optim.Adam(tps, lr=0.05)
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(8)]

    def step(k):
        for p, tp, g in zip(ps, tps, grads[k]):
            p.grad = sampan.tensor(g.copy())
            tp.grad = torch.tensor(g.copy())
        opt.step()
        topt.step()

    for k in range(steps):
        step(k)
    return ps, tps, opt, step


def _state_copy(opt):
    sd = opt.state_dict()
    return {i: {k: (v.numpy().copy() if hasattr(v, "numpy") else v) for k, v in s.items()}
            for i, s in sd["state"].items()}, sd["param_groups"]


def _bad_states(shapes):
    """(description, state_dict, error class, message pieces) for states that do not fit."""
    _, _, donor, _ = _adam_pair(shapes)
    good = donor.state_dict()

    def edit(fn):
        sd = {"state": {i: dict(s) for i, s in good["state"].items()},
              "param_groups": [dict(g) for g in good["param_groups"]]}
        fn(sd)
        return sd

    def transpose_slot(sd):  # same size, wrong shape: used to be reshaped silently
        sd["state"][1]["exp_avg_sq"] = sampan.tensor(good["state"][1]["exp_avg_sq"].numpy().T
                                                     .copy())

    def f64_slot(sd):  # used to be cast silently
        sd["state"][1]["exp_avg"] = sampan.tensor(good["state"][1]["exp_avg"].numpy()
                                                  .astype(np.float64))

    def missing_slot(sd):
        del sd["state"][1]["exp_avg_sq"]

    def foreign_param(sd):  # state for a parameter that no group holds
        sd["state"][7] = sd["state"].pop(1)

    def bad_step(sd):
        sd["state"][1]["step"] = -2

    def bad_lr(sd):
        sd["param_groups"][0]["lr"] = -1.0

    return [
        ("shape", edit(transpose_slot), ShapeError,
         ["parameter 1 (shape (4, 3), float32)", "slot 'exp_avg_sq' of shape (3, 4)",
          "expected shape (4, 3)"]),
        ("dtype", edit(f64_slot), DTypeError,
         ["parameter 1 (shape (4, 3), float32)", "slot 'exp_avg' of dtype float64",
          "expected float32"]),
        ("slots", edit(missing_slot), SampanValueError,
         ["slots ['exp_avg', 'step'] for parameter 1", "['exp_avg', 'exp_avg_sq', 'step']"]),
        ("index", edit(foreign_param), SampanValueError,
         ["a state for parameter 7, which no group holds", "expected parameters numbered [0, 1]"]),
        ("step", edit(bad_step), SampanValueError, ["step -2 for parameter 1"]),
        ("hyper", edit(bad_lr), SampanValueError,
         ["hyperparameters in group 0 of the state", "invalid learning rate -1.0"]),
    ]


SHAPES = [(3,), (4, 3)]


@pytest.mark.parametrize("case", range(6),
                         ids=["shape", "dtype", "slots", "index", "step", "hyper"])
def test_optimizer_refuses_a_state_that_does_not_fit_and_loses_nothing(case):
    _, bad, cls, pieces = _bad_states(SHAPES)[case]
    ps, tps, opt, step = _adam_pair(SHAPES)
    before_state, before_groups = _state_copy(opt)
    with pytest.raises(cls) as info:
        opt.load_state_dict(bad)
    msg = str(info.value)
    assert msg.startswith("Adam.load_state_dict: ")
    for piece in pieces:
        assert piece in msg, msg
    # unchanged: same state, and training goes on exactly as torch's Adam does
    after_state, after_groups = _state_copy(opt)
    assert after_groups == before_groups
    assert after_state.keys() == before_state.keys()
    for i in before_state:
        for k, v in before_state[i].items():
            np.testing.assert_array_equal(after_state[i][k], v)
    for k in range(3, 6):
        step(k)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_optimizer_refuses_a_state_for_other_parameters():
    # the same number of parameters, but shaped otherwise (another model)
    _, _, donor, _ = _adam_pair([(3,), (2, 6)])
    _, _, opt, _ = _adam_pair(SHAPES)
    with pytest.raises(ShapeError, match=r"slot 'exp_avg' of shape \(2, 6\) for parameter 1 "
                                         r"\(shape \(4, 3\), float32\); expected shape \(4, 3\)"):
        opt.load_state_dict(donor.state_dict())
    # another number of parameters
    _, _, donor3, _ = _adam_pair([(3,), (4, 3), (2,)])
    with pytest.raises(SampanValueError, match="got a state whose group 0 has 3 parameters; expected 2"):
        opt.load_state_dict(donor3.state_dict())
    # another optimiser's state
    sgd = SGD([sampan.zeros(3, requires_grad=True), sampan.zeros((4, 3), requires_grad=True)],
              lr=0.1, momentum=0.9)
    with pytest.raises(SampanValueError, match=r"slots \['exp_avg', 'exp_avg_sq', 'step'\] "
                                               r"for parameter 0 .*\['momentum_buffer'\]"):
        sgd.load_state_dict(donor.state_dict())
    assert sgd.state == {}


def test_optimizer_state_that_fits_still_loads_through_a_file(tmp_path):
    ps, _, opt, _ = _adam_pair(SHAPES)
    sampan.save(opt.state_dict(), tmp_path / "opt.sampan")
    ps2 = [sampan.tensor(p.numpy().copy(), requires_grad=True) for p in ps]
    opt2 = Adam(ps2, lr=0.05)
    opt2.load_state_dict(load(tmp_path / "opt.sampan"))
    assert opt2.state[ps2[1]]["step"] == 3
    assert opt2.state[ps2[1]]["exp_avg"].dtype == np.float32
