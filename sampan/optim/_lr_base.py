"""The base of every learning-rate scheduler (`LRScheduler`) and the metric-driven
`ReduceLROnPlateau`: what both `lr_scheduler.py` and `_lr_more.py` build on, so neither
imports the other back. `sampan.optim.lr_scheduler` is their public namespace."""
from __future__ import annotations

import copy
import math

from sampan.errors import SampanValueError


class LRScheduler:
    """Base class: subclasses define `lr_at(t)`, the list of group rates at step `t`.

    Example::

        >>> class Halving(LRScheduler):
        ...     def lr_at(self, t):
        ...         return [base * 0.5 ** t for base in self.base_lrs]
    """

    def __init__(self, optimizer, last_epoch: int = -1):
        self.optimizer = optimizer
        for i, g in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                g.setdefault("initial_lr", g["lr"])
            elif "initial_lr" not in g:
                raise SampanValueError(f"{type(self).__name__}: last_epoch={last_epoch} "
                                       f"but param group {i} has no 'initial_lr' to resume "
                                       "from")
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr = [g["lr"] for g in optimizer.param_groups]
        self.step()

    def lr_at(self, t: int) -> list:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_lr(self) -> list:
        """The rates the schedule gives at the current step."""
        return self.lr_at(self.last_epoch)

    def chain_lr(self, lrs: list, t: int) -> list:
        """The rates at step `t` when the rates were `lrs` (set by the schedules before
        this one in a `ChainedScheduler`): this schedule's change from step t-1 to t
        applied to them, as PyTorch's chainable form computes it. Schedules that are only
        a closed form (LambdaLR, OneCycleLR ...) override it to return their own rates.
        """
        now = self.lr_at(t)
        before = self.base_lrs if t <= 0 else self.lr_at(t - 1)
        return [lr if b == 0 else lr * (n / b) for lr, n, b in zip(lrs, now, before)]

    def step(self, epoch=None) -> None:
        """Advance one step (or jump to `epoch`) and write the new rates into the groups.

        Example::

            >>> opt.step(); sched.step()
        """
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        lrs = self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
        self._last_lr = list(lrs)

    def get_last_lr(self) -> list:
        """The rates set by the last `step()`.

        Example::

            >>> sched.get_last_lr()
            [0.1]
        """
        return list(self._last_lr)

    def state_dict(self) -> dict:
        """Everything but the optimiser, as plain data.

        Example::

            >>> saved = sched.state_dict(); sched.load_state_dict(saved)
        """
        return {k: copy.deepcopy(v) for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore from `state_dict()` (the optimiser's rates are restored by its own)."""
        self.__dict__.update(copy.deepcopy(state_dict))


class ReduceLROnPlateau:
    """Multiply the rate by `factor` when a metric stops improving for `patience` steps.

    Call ``step(metric)`` once per evaluation. `mode` "min" (loss) or "max" (accuracy);
    improvement is relative (`threshold_mode` "rel") or absolute ("abs"); after a cut,
    `cooldown` evaluations pass before counting again; rates never drop below `min_lr`.

    Example::

        >>> sched = ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=2)
        >>> sched.step(val_loss)
    """

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4,
                 threshold_mode="rel", cooldown=0, min_lr=0.0, eps=1e-8):
        if factor >= 1.0:
            raise SampanValueError(f"ReduceLROnPlateau: factor {factor} must be < 1")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise SampanValueError(f"ReduceLROnPlateau: mode {mode!r} must be 'min' or 'max' "
                                   f"and threshold_mode {threshold_mode!r} 'rel' or 'abs'")
        self.optimizer = optimizer
        n = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != n:
                raise SampanValueError(f"ReduceLROnPlateau: {len(min_lr)} min_lr values for "
                                       f"{n} param groups")
            self.min_lrs = list(min_lr)
        else:
            self.min_lrs = [min_lr] * n
        self.mode, self.factor, self.patience = mode, factor, int(patience)
        self.threshold, self.threshold_mode = threshold, threshold_mode
        self.cooldown, self.eps = int(cooldown), eps
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        self.last_epoch = 0
        self._last_lr = [g["lr"] for g in optimizer.param_groups]

    def is_better(self, a: float, best: float) -> bool:
        rel = self.threshold_mode == "rel"
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if rel else best - self.threshold)
        return a > (best * (1.0 + self.threshold) if rel else best + self.threshold)

    def step(self, metrics) -> None:
        """Record one value of the monitored metric, cutting the rate if it stalled."""
        current = float(metrics)
        self.last_epoch += 1
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g, floor in zip(self.optimizer.param_groups, self.min_lrs):
                new = max(g["lr"] * self.factor, floor)
                if g["lr"] - new > self.eps:
                    g["lr"] = new
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {k: copy.deepcopy(v) for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(copy.deepcopy(state_dict))
