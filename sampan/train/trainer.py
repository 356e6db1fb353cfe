"""`Trainer`: fit / evaluate / predict around a model, an optimiser and hooks.

The Trainer is a convenience over the plain loop it runs::

    for batch in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        optimizer.step()

Everything else (progress bars, logging, checkpoints, early stopping, debugging)
plugs in as a `Hook` that sees the trainer before and after each step and epoch.
Counters live on the trainer (`epoch`, `global_step`, `batch_in_epoch`) and, with
the model, optimiser, scheduler, hook states and RNG state, make up `state_dict()`:
restoring it mid-epoch continues a run exactly where it stopped. `step_in_progress` is
True from a step's start until its counters are advanced: a state taken while it is
True (after an exception escaped the step) may hold updated parameters that the
counters do not count, so the `Checkpoint` hook does not save it.
"""
from __future__ import annotations

import numpy as np

from sampan.autograd import no_grad
from sampan.errors import SampanValueError
from sampan.tensor import Tensor

from .hooks import Hook

__all__ = ["Trainer", "accuracy"]


def accuracy(output, target) -> float:
    """Fraction of rows whose arg-max over the last axis equals `target`.

    Example::

        >>> Trainer(model, opt, loss_fn, loader, metrics={"acc": accuracy})
    """
    out = output.numpy() if isinstance(output, Tensor) else np.asarray(output)
    tgt = target.numpy() if isinstance(target, Tensor) else np.asarray(target)
    return float(np.mean(out.argmax(-1) == tgt))


def _as_float(v) -> float:
    if isinstance(v, Tensor):
        return float(v.item())
    return float(v)


def _batch_size(target, args) -> int:
    for t in (target, *args):
        shape = getattr(t, "shape", None)
        if shape:
            return int(shape[0])
    return 1


class Trainer:
    """Train `model` with `optimizer` on `loss_fn(model(*inputs), target)`.

    A batch that is a tuple/list ``(x1, ..., xn, y)`` feeds ``model(x1, ..., xn)`` and
    uses ``y`` as target; a dict feeds its other entries as keyword arguments and uses
    its ``"target"`` (or ``"label"``) entry; anything else is a lone input. Override
    `compute_loss` for other shapes of batch. `metrics` maps names to
    ``fn(output, target) -> number``, averaged over `evaluate`'s batches. A scheduler
    steps after every optimiser step (``scheduler_interval="step"``) or every epoch
    (``"epoch"``); `ReduceLROnPlateau` is fed `plateau_monitor` once per epoch.
    ``amp=sampan.bfloat16`` or ``sampan.float16`` runs forward and loss under
    `sampan.amp.autocast`; float16 also scales the loss with a `sampan.amp.GradScaler`
    (`grad_scaler`, saved in `state_dict`), skipping steps whose gradients overflow.

    Example::

        >>> trainer = Trainer(model, sampan.optim.Adam(model.parameters()),
        ...                   sampan.cross_entropy, train_loader, eval_loader,
        ...                   hooks=[ProgressBar(), JSONLLogger("log.jsonl")],
        ...                   metrics={"acc": accuracy})
        >>> history = trainer.fit(epochs=5)
        >>> history[-1]["val_acc"]
        0.97
    """

    def __init__(self, model, optimizer, loss_fn, train_loader, eval_loader=None, hooks=(),
                 scheduler=None, metrics=None, scheduler_interval="step", grad_clip_norm=None,
                 plateau_monitor=None, amp=None):
        if scheduler_interval not in ("step", "epoch"):
            raise SampanValueError(f"Trainer: scheduler_interval {scheduler_interval!r}; "
                                   "expected 'step' or 'epoch'")
        for h in hooks:
            if not isinstance(h, Hook):
                raise TypeError(f"Trainer: hooks must be sampan.train.Hook instances, got "
                                f"{type(h).__name__}")
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.train_loader = train_loader
        self.eval_loader = eval_loader
        # stable sort: a hook's `priority` (lower first) decides, then list order
        self.hooks = sorted(hooks, key=lambda h: h.priority)
        self.scheduler = scheduler
        self.metrics = dict(metrics or {})
        self.scheduler_interval = scheduler_interval
        self.grad_clip_norm = grad_clip_norm
        self.plateau_monitor = plateau_monitor
        self.amp = None
        self.grad_scaler = None
        if amp is not None:
            from sampan.amp import GradScaler, autocast
            self.amp = autocast(amp).dtype    # checks the dtype
            if self.amp == np.float16:
                self.grad_scaler = GradScaler()
        self.epoch = 0
        self.global_step = 0
        self.batch_in_epoch = 0
        self.epochs = 0
        self.should_stop = False
        self.step_in_progress = False
        self.history: list[dict] = []
        self.last_output = None
        self._loss_sum = 0.0
        self._loss_count = 0

    # ----------------------------------------------------------------- batches
    def split_batch(self, batch):
        """``(args, kwargs, target)`` for one batch (see the class docstring).

        Example::

            >>> args, kwargs, target = trainer.split_batch((x, y))
        """
        if isinstance(batch, (tuple, list)):
            if len(batch) >= 2:
                return tuple(batch[:-1]), {}, batch[-1]
            return tuple(batch), {}, None
        if isinstance(batch, dict):
            key = "target" if "target" in batch else "label" if "label" in batch else None
            kwargs = {k: v for k, v in batch.items() if k != key}
            return (), kwargs, (batch[key] if key else None)
        return (batch,), {}, None

    def compute_loss(self, batch):
        """Forward one batch: returns ``(loss, output, target)``.

        Example::

            >>> loss, output, target = trainer.compute_loss(batch)
        """
        args, kwargs, target = self.split_batch(batch)
        if target is None:
            raise SampanValueError("Trainer: the batch has no target; give (inputs, target) "
                                   "tuples or override compute_loss")
        if self.amp is None:
            output = self.model(*args, **kwargs)
            return self.loss_fn(output, target), output, target
        from sampan.amp import autocast
        with autocast(self.amp):
            output = self.model(*args, **kwargs)
            return self.loss_fn(output, target), output, target

    def train_step(self, batch, update: bool = True) -> float:
        """One optimisation step on `batch` (no hooks); returns the loss as a float.

        With ``update=False`` the gradients are computed but the parameters are left.

        Example::

            >>> loss = trainer.train_step(next(iter(loader)))
        """
        self.optimizer.zero_grad()
        loss, output, _ = self.compute_loss(batch)
        scaler = self.grad_scaler
        (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is not None:      # hooks and clipping see the true gradients
            scaler.unscale_(self.optimizer)
        self.last_output = output
        self._call("after_backward")
        if self.grad_clip_norm is not None:
            from sampan.optim import clip_grad_norm_
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            clip_grad_norm_(params, self.grad_clip_norm)
        if scaler is not None and not update:
            scaler.discard_step(self.optimizer)
        if update:
            if scaler is None:
                self.optimizer.step()
            else:
                scaler.step(self.optimizer)      # skipped when a gradient overflowed
                scaler.update()
            if self.scheduler is not None and self.scheduler_interval == "step" and \
                    not _is_plateau(self.scheduler):
                self.scheduler.step()
        return _as_float(loss)

    # ----------------------------------------------------------------- loops
    def _call(self, event, *args):
        for h in self.hooks:
            getattr(h, event)(self, *args)

    def _lr(self):
        return self.optimizer.param_groups[0]["lr"]

    def fit(self, epochs: int) -> list:
        """Train until `epochs` epochs are done in all (counting any resumed ones).

        Returns the per-epoch logs (``train_loss``, ``lr`` and ``val_*`` entries).

        Example::

            >>> trainer.fit(epochs=3)[-1]["train_loss"]
        """
        self.epochs = int(epochs)
        self.should_stop = False
        self.step_in_progress = False
        self._call("on_fit_begin")
        try:
            while self.epoch < self.epochs and not self.should_stop:
                self._run_epoch()
        finally:
            self._call("on_fit_end")
        return self.history

    def _run_epoch(self):
        loader = self.train_loader
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(self.epoch)  # a seeded shuffle depends only on the epoch
        skip = self.batch_in_epoch
        if skip == 0:
            self._loss_sum, self._loss_count = 0.0, 0
        self._set_mode(True)
        self._call("before_epoch")
        for i, batch in enumerate(loader):
            if i < skip:  # resuming mid-epoch: these batches were already trained on
                continue
            self.step_in_progress = True
            self._call("before_step", batch)
            loss = self.train_step(batch)
            self.global_step += 1
            self.batch_in_epoch = i + 1
            self.step_in_progress = False
            self._loss_sum += loss
            self._loss_count += 1
            logs = {"step": self.global_step, "epoch": self.epoch, "loss": loss,
                    "lr": self._lr()}
            self._call("after_step", logs)
            if self.should_stop:
                return
        logs = {"epoch": self.epoch,
                "train_loss": self._loss_sum / max(self._loss_count, 1), "lr": self._lr()}
        if self.eval_loader is not None:
            logs.update({f"val_{k}": v for k, v in self.evaluate().items()})
        if self.scheduler is not None:
            if _is_plateau(self.scheduler):
                key = self.plateau_monitor or ("val_loss" if "val_loss" in logs
                                               else "train_loss")
                self.scheduler.step(logs[key])
            elif self.scheduler_interval == "epoch":
                self.scheduler.step()
        self.epoch += 1
        self.batch_in_epoch = 0
        self.history.append(logs)
        self._call("after_epoch", logs)

    def _set_mode(self, training: bool):
        fn = getattr(self.model, "train", None)
        if callable(fn):
            fn(training)

    def evaluate(self, loader=None) -> dict:
        """Mean loss and metrics over `loader` (default: the eval loader), without grad.

        Example::

            >>> trainer.evaluate()
            {'loss': 0.12, 'acc': 0.96}
        """
        loader = self.eval_loader if loader is None else loader
        if loader is None:
            raise SampanValueError("Trainer.evaluate: no eval_loader given")
        was_training = getattr(self.model, "training", True)
        self._set_mode(False)
        sums = {"loss": 0.0, **{k: 0.0 for k in self.metrics}}
        n = 0
        try:
            with no_grad():
                for batch in loader:
                    loss, output, target = self.compute_loss(batch)
                    args, _, _ = self.split_batch(batch)
                    b = _batch_size(target, args)
                    sums["loss"] += _as_float(loss) * b
                    for k, fn in self.metrics.items():
                        sums[k] += _as_float(fn(output, target)) * b
                    n += b
        finally:
            self._set_mode(was_training)
        return {k: v / max(n, 1) for k, v in sums.items()}

    def predict(self, loader):
        """Model outputs over `loader` (targets, if present, are dropped), joined on axis 0.

        Example::

            >>> probs = trainer.predict(test_loader)
        """
        was_training = getattr(self.model, "training", True)
        self._set_mode(False)
        outs = []
        try:
            with no_grad():
                for batch in loader:
                    args, kwargs, _ = self.split_batch(batch)
                    outs.append(self.model(*args, **kwargs))
        finally:
            self._set_mode(was_training)
        if outs and all(isinstance(o, Tensor) for o in outs):
            from sampan.ops.shape import concat
            return concat(outs, 0)
        return outs

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Model, optimiser, scheduler, counters, hook states and RNG state.

        Example::

            >>> sampan.io.save(trainer.state_dict(), "run.ckpt")
        """
        import sampan
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "grad_scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict(),
            "trainer": {"epoch": self.epoch, "global_step": self.global_step,
                        "batch_in_epoch": self.batch_in_epoch, "loss_sum": self._loss_sum,
                        "loss_count": self._loss_count, "history": list(self.history)},
            "hooks": {f"{i}:{type(h).__name__}": h.state_dict()
                      for i, h in enumerate(self.hooks)},
            "rng": {"sampan": sampan.default_generator.get_state(),
                    "numpy": np.random.get_state()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from `state_dict()`; the next `fit` continues the run exactly.

        All or nothing: if a part does not fit (a model or optimiser state of another
        shape, say), the error is raised with the trainer as it was before the call.

        Example::

            >>> trainer.load_state_dict(sampan.io.load("run.ckpt")); trainer.fit(10)
        """
        # the model's state dict shares memory with its parameters: keep a copy to go back to
        before = _copied(self.state_dict())
        try:
            self._apply_state(state)
        except BaseException:
            self._apply_state(before)
            raise

    def _apply_state(self, state: dict) -> None:
        import sampan
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.grad_scaler is not None and state.get("grad_scaler"):
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        t = state["trainer"]
        self.epoch, self.global_step = int(t["epoch"]), int(t["global_step"])
        self.batch_in_epoch = int(t["batch_in_epoch"])
        self._loss_sum, self._loss_count = float(t["loss_sum"]), int(t["loss_count"])
        self.history = list(t.get("history", []))
        saved_hooks = state.get("hooks", {})
        for i, h in enumerate(self.hooks):
            hs = saved_hooks.get(f"{i}:{type(h).__name__}")
            if hs:
                h.load_state_dict(hs)
        rng = state.get("rng") or {}
        if "sampan" in rng:
            sampan.default_generator.set_state(rng["sampan"])
        if "numpy" in rng:
            np.random.set_state(tuple(rng["numpy"]))

    # ----------------------------------------------------------------- debugging
    def debug_step(self, names, batch=None, update: bool = False) -> dict:
        """Run one step on `batch` (default: the first training batch) and fetch values.

        `names` are sub-layer names (their outputs), ``"grad:<param name>"`` (a
        gradient), ``"loss"`` or ``"output"``. Returns ``{name: numpy array}``. Nothing
        is updated unless `update`.

        Example::

            >>> vals = trainer.debug_step(["0", "2", "grad:0.weight", "loss"])
        """
        from .hooks import DebugStep
        if batch is None:
            batch = next(iter(self.train_loader))
        probe = DebugStep(names)
        probe.before_step(self, batch)
        try:
            self.hooks.append(probe)  # so after_backward reaches it
            loss = self.train_step(batch, update=update)
        finally:
            self.hooks.remove(probe)
        probe.after_step(self, {"loss": loss})
        return probe.values


def _copied(tree):
    """`tree` with every Tensor replaced by a Tensor over a copy of its values."""
    if isinstance(tree, Tensor):
        return Tensor(np.array(tree.numpy(), copy=True))
    if isinstance(tree, dict):
        return type(tree)((k, _copied(v)) for k, v in tree.items())
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*(_copied(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(_copied(v) for v in tree)
    return tree


def _is_plateau(s) -> bool:
    from sampan.optim.lr_scheduler import ReduceLROnPlateau
    return isinstance(s, ReduceLROnPlateau)
