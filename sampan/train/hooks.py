"""Hooks: code the `Trainer` calls before and after each step and epoch.

A hook subclasses `Hook` and overrides the events it cares about. Each receives the
trainer (model, optimizer, counters, ``should_stop``) and, after a step or an epoch,
that step's or epoch's logs. Hooks with state (early stopping's best value, say)
return it from `state_dict` so that checkpoints carry it.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import time
import warnings

import numpy as np

from sampan.errors import SampanValueError
from sampan.tensor import Tensor

__all__ = ["Checkpoint", "DebugStep", "EarlyStopping", "Hook", "JSONLLogger", "ProgressBar"]


class Hook:
    """Base class: every event is a no-op. Lower `priority` runs first.

    Example::

        >>> class PrintLoss(Hook):
        ...     def after_step(self, trainer, logs):
        ...         print(logs["step"], logs["loss"])
    """

    priority = 0

    def on_fit_begin(self, trainer):
        """Called once when `fit` starts (after a resume has been applied)."""

    def on_fit_end(self, trainer):
        """Called once when `fit` returns or raises."""

    def before_epoch(self, trainer):
        """Called before the first batch of each epoch (also of a resumed one)."""

    def after_epoch(self, trainer, logs):
        """Called after each epoch with ``train_loss``, ``lr`` and ``val_*`` logs."""

    def before_step(self, trainer, batch):
        """Called with the batch before its step."""

    def after_backward(self, trainer):
        """Called once gradients exist, before clipping and the optimiser step."""

    def after_step(self, trainer, logs):
        """Called after each step with ``step``, ``epoch``, ``loss`` and ``lr``."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ProgressBar(Hook):
    """A tqdm progress bar per epoch, showing the running loss and the rate.

    Example::

        >>> Trainer(..., hooks=[ProgressBar()]).fit(3)
        epoch 1/3: 100%|██████████| 47/47 [00:01, loss=0.31]
    """

    def __init__(self, disable: bool = False, leave: bool = True, **tqdm_kwargs):
        self.disable, self.leave, self.kwargs = disable, leave, tqdm_kwargs
        self.bar = None

    def before_epoch(self, trainer):
        from tqdm.auto import tqdm
        try:
            total = len(trainer.train_loader)
        except TypeError:
            total = None
        self.bar = tqdm(total=total, initial=trainer.batch_in_epoch, leave=self.leave,
                        desc=f"epoch {trainer.epoch + 1}/{trainer.epochs}",
                        disable=self.disable, **self.kwargs)

    def after_step(self, trainer, logs):
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{logs['loss']:.4g}", refresh=False)

    def after_epoch(self, trainer, logs):
        if self.bar is not None:
            shown = {k: f"{v:.4g}" for k, v in logs.items()
                     if k != "epoch" and isinstance(v, float)}
            self.bar.set_postfix(shown)
            self.bar.close()
            self.bar = None

    def on_fit_end(self, trainer):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _jsonable(v):
    if isinstance(v, Tensor):
        v = v.numpy()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class JSONLLogger(Hook):
    """Append one JSON object per step (``"kind": "step"``) and per epoch to `path`.

    On a resumed run, lines from past the resume point (written by the interrupted
    run after its last checkpoint) are dropped, so the file reads as one clean run.

    Example::

        >>> Trainer(..., hooks=[JSONLLogger("runs/log.jsonl")]).fit(2)
        >>> [json.loads(line)["loss"] for line in open("runs/log.jsonl")][:2]
        [2.31, 2.17]
    """

    def __init__(self, path, every_n_steps: int = 1):
        self.path = os.fspath(path)
        self.every = max(1, int(every_n_steps))
        self.file = None
        self._t0 = None

    def on_fit_begin(self, trainer):
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        kept = []
        if trainer.global_step > 0 and os.path.exists(self.path):
            with open(self.path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        break  # a torn last line from a crash
                    done = rec.get("step", 0) <= trainer.global_step if rec["kind"] == "step" \
                        else rec.get("epoch", 0) < trainer.epoch
                    if done:
                        kept.append(line if line.endswith("\n") else line + "\n")
        self.file = open(self.path, "w")  # noqa: SIM115  (open for the whole fit)
        self.file.writelines(kept)
        self.file.flush()
        self._t0 = time.perf_counter()

    def _write(self, rec):
        rec["time"] = round(time.perf_counter() - self._t0, 6)
        self.file.write(json.dumps({k: _jsonable(v) for k, v in rec.items()}) + "\n")
        self.file.flush()

    def after_step(self, trainer, logs):
        if self.file is not None and logs["step"] % self.every == 0:
            self._write({"kind": "step", **logs})

    def after_epoch(self, trainer, logs):
        if self.file is not None:
            self._write({"kind": "epoch", **logs})

    def on_fit_end(self, trainer):
        if self.file is not None:
            self.file.close()
            self.file = None


class Checkpoint(Hook):
    """Save the whole training state every `every_n_steps` steps; resume from the latest.

    Files are ``<directory>/step-<global step>.sampan`` written by `sampan.io.save`
    (atomic, checksummed): a write that fails or is killed leaves the previous files as
    they were. The newest `keep_last` are kept. With ``resume=True``, `fit` first loads
    the newest checkpoint in `directory` (if any) and continues from it: same
    parameters, optimiser and scheduler state, counters, hook states and random state,
    and the data loader is set to the same epoch and batch, so the loss curve continues
    exactly as if the run had never stopped. A newest file that fails verification
    (truncated, corrupt) is renamed to ``<name>.damaged`` with a warning, and the newest
    good one is loaded instead; if none is good, `fit` raises `CheckpointError`. The
    temporary file a killed write leaves behind is removed when `fit` starts. When `fit`
    ends by an exception from inside a step, no final checkpoint is written (the state
    would be half a step on).

    Example::

        >>> hooks = [Checkpoint("runs/ckpt", every_n_steps=100, resume=True)]
        >>> Trainer(model, opt, loss_fn, loader, hooks=hooks).fit(10)
    """

    priority = -100  # resume before any other hook looks at the counters
    _NAME = re.compile(r"^step-(\d+)\.sampan$")
    # what sampan.io.save writes before its rename: left behind only by a killed write
    _TEMP = re.compile(r"^\.step-\d+\.sampan\..+\.tmp$")

    def __init__(self, directory, every_n_steps: int = 100, keep_last: int = 3,
                 resume: bool = True, save_at_end: bool = True):
        if every_n_steps < 1:
            raise SampanValueError(f"Checkpoint: every_n_steps {every_n_steps} must be >= 1")
        self.directory = os.fspath(directory)
        self.every = int(every_n_steps)
        self.keep_last = int(keep_last)
        self.resume = resume
        self.save_at_end = save_at_end
        self.resumed_from = None

    def checkpoints(self) -> list:
        """Paths of the checkpoints in the directory, oldest first."""
        if not os.path.isdir(self.directory):
            return []
        found = []
        for name in os.listdir(self.directory):
            m = self._NAME.match(name)
            if m:
                found.append((int(m.group(1)), os.path.join(self.directory, name)))
        return [p for _, p in sorted(found)]

    def on_fit_begin(self, trainer):
        self._remove_temporaries()
        if self.resume:
            self._resume(trainer)

    def _remove_temporaries(self):
        if not os.path.isdir(self.directory):
            return
        for name in os.listdir(self.directory):
            if self._TEMP.match(name):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.directory, name))

    def _resume(self, trainer):
        """Load the newest checkpoint that verifies; set damaged newer ones aside."""
        from sampan.io import CheckpointError, load
        damaged = []
        for path in reversed(self.checkpoints()):
            try:
                state = load(path)  # checks version and checksums before returning
            except CheckpointError as e:
                damaged.append((path, e))
                continue
            trainer.load_state_dict(state)
            self.resumed_from = path
            break
        else:
            if damaged:
                listing = "\n".join(f"  {p}: {e}" for p, e in damaged)
                raise CheckpointError(
                    f"Checkpoint: cannot resume from {self.directory}: every checkpoint there "
                    f"is damaged:\n{listing}\nmove them away (or pass resume=False) to start "
                    "afresh")
            return
        for path, e in damaged:
            # out of the way, so that rotation never keeps it in place of a good file
            aside = path + ".damaged"
            try:
                os.replace(path, aside)
                moved = f"; it is renamed to {os.path.basename(aside)}"
            except OSError as err:
                moved = f"; it could not be renamed ({err})"
            warnings.warn(f"Checkpoint: {path} is damaged and was skipped ({e}){moved}. "
                          f"Resumed from {self.resumed_from} instead.", RuntimeWarning,
                          stacklevel=2)

    def save(self, trainer) -> str:
        """Write a checkpoint now; returns its path."""
        from sampan.io import save
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"step-{trainer.global_step:09d}.sampan")
        save(trainer.state_dict(), path)
        for old in self.checkpoints()[:-self.keep_last] if self.keep_last > 0 else []:
            os.remove(old)
        return path

    def after_step(self, trainer, logs):
        if trainer.global_step % self.every == 0:
            self.save(trainer)

    def after_epoch(self, trainer, logs):
        # counters moved to the next epoch: a checkpoint here resumes at its start
        if trainer.global_step % self.every == 0:
            self.save(trainer)

    def on_fit_end(self, trainer):
        if not self.save_at_end or trainer.global_step == 0:
            return
        if getattr(trainer, "step_in_progress", False):
            # an exception escaped step global_step + 1: the parameters may hold its update
            # while the counters do not count it, and the file would take the place of a
            # good one of the same step number; resuming must redo that step from a
            # state before it
            warnings.warn(f"Checkpoint: fit stopped inside step {trainer.global_step + 1}; "
                          "no final checkpoint is written (its state would be half a step "
                          "on). Resume continues from the newest one in "
                          f"{self.directory}.", RuntimeWarning, stacklevel=2)
            return
        self.save(trainer)


class EarlyStopping(Hook):
    """Stop `fit` when `monitor` has not improved by `min_delta` for `patience` epochs.

    `monitor` names an epoch log entry (``"val_loss"``, ``"val_acc"``, ``"train_loss"``);
    `mode` is "min" or "max". With `restore_best`, the model's best weights are put
    back when fitting ends.

    Example::

        >>> stopper = EarlyStopping("val_loss", patience=3)
        >>> Trainer(..., hooks=[stopper]).fit(100); stopper.stopped_epoch
        12
    """

    def __init__(self, monitor: str = "val_loss", patience: int = 5, min_delta: float = 0.0,
                 mode: str = "min", restore_best: bool = False):
        if mode not in ("min", "max"):
            raise SampanValueError(f"EarlyStopping: mode {mode!r}; expected 'min' or 'max'")
        self.monitor, self.patience, self.min_delta = monitor, int(patience), abs(min_delta)
        self.mode, self.restore_best = mode, restore_best
        self.best = math.inf if mode == "min" else -math.inf
        self.wait = 0
        self.stopped_epoch = None
        self._best_weights = None

    def _improved(self, v):
        if self.mode == "min":
            return v < self.best - self.min_delta
        return v > self.best + self.min_delta

    def after_epoch(self, trainer, logs):
        if self.monitor not in logs:
            raise SampanValueError(f"EarlyStopping: no '{self.monitor}' in the epoch logs "
                                   f"(have {sorted(logs)})")
        v = float(logs[self.monitor])
        if self._improved(v):
            self.best, self.wait = v, 0
            if self.restore_best:
                self._best_weights = {k: np.array(t.numpy() if isinstance(t, Tensor) else t)
                                      for k, t in trainer.model.state_dict().items()}
        else:
            self.wait += 1
            if self.wait >= self.patience:
                trainer.should_stop = True
                self.stopped_epoch = logs["epoch"]

    def on_fit_end(self, trainer):
        if self.restore_best and self._best_weights is not None:
            trainer.model.load_state_dict({k: Tensor(v) for k, v in self._best_weights.items()})

    def state_dict(self):
        return {"best": self.best, "wait": self.wait, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state):
        self.best, self.wait = float(state["best"]), int(state["wait"])
        self.stopped_epoch = state["stopped_epoch"]


def _copy_value(v):
    if isinstance(v, Tensor):
        return np.array(v.numpy(), copy=True)
    if isinstance(v, (tuple, list)):
        return type(v)(_copy_value(x) for x in v)
    if isinstance(v, dict):
        return {k: _copy_value(x) for k, x in v.items()}
    return copy.deepcopy(v)


class DebugStep(Hook):
    """Fetch named intermediate values from one training step, by forward hooks.

    `names` are sub-layer names as `named_layers()` spells them (their outputs),
    ``"grad:<param name>"`` (a parameter's gradient after backward), ``"loss"`` and
    ``"output"`` (the model's). The step is the one numbered `at_step` (0-based global
    step; default: the first step the hook sees). After it, `values` maps each name to
    a numpy copy; with ``stop=True`` fitting stops there. `Trainer.debug_step` runs
    the same probe on one batch outside `fit`.

    Example::

        >>> probe = DebugStep(["encoder.0", "head", "grad:head.weight"], stop=True)
        >>> Trainer(..., hooks=[probe]).fit(1); probe.values["head"].shape
        (32, 10)
    """

    def __init__(self, names, at_step: int | None = None, stop: bool = False):
        self.names = [names] if isinstance(names, str) else list(names)
        self.at_step = at_step
        self.stop = stop
        self.values: dict = {}
        self._handles = []
        self._armed = False
        self._done = False

    def _layers(self, model):
        if hasattr(model, "named_layers"):
            return dict(model.named_layers())
        return {}

    def _find(self, model, name):
        layers = self._layers(model)
        if name in layers:
            return layers[name]
        obj = model
        for part in name.split("."):
            obj = obj[int(part)] if part.isdigit() and hasattr(obj, "__getitem__") \
                else getattr(obj, part, None)
            if obj is None:
                raise SampanValueError(f"DebugStep: the model has no sub-layer '{name}' "
                                       f"(layers: {', '.join(n for n in layers if n)})")
        return obj

    def before_step(self, trainer, batch):
        if self._done or (self.at_step is not None and trainer.global_step != self.at_step):
            return
        self._armed = True
        self.values = {}
        for name in self.names:
            if name in ("loss", "output") or name.startswith("grad:"):
                continue
            layer = self._find(trainer.model, name)
            if not hasattr(layer, "register_forward_hook"):
                raise SampanValueError(f"DebugStep: '{name}' ({type(layer).__name__}) has no "
                                       "register_forward_hook; name a sampan.nn.Layer")

            def grab(layer, args, output, _name=name):
                self.values[_name] = _copy_value(output)
            self._handles.append(layer.register_forward_hook(grab))

    def after_backward(self, trainer):
        if not self._armed:
            return
        wanted = [n[5:] for n in self.names if n.startswith("grad:")]
        if wanted:
            params = dict(trainer.model.named_parameters())
            for pname in wanted:
                if pname not in params:
                    raise SampanValueError(f"DebugStep: no parameter '{pname}' (have "
                                           f"{', '.join(params)})")
                g = params[pname].grad
                self.values["grad:" + pname] = None if g is None else _copy_value(g)

    def after_step(self, trainer, logs):
        if not self._armed:
            return
        for h in self._handles:
            h.remove()
        self._handles = []
        self._armed, self._done = False, True
        if "loss" in self.names:
            self.values["loss"] = logs["loss"]
        if "output" in self.names:
            self.values["output"] = _copy_value(trainer.last_output)
        if self.stop:
            trainer.should_stop = True
