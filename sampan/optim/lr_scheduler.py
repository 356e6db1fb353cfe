"""Learning-rate schedulers.

Each scheduler (except `ReduceLROnPlateau`, which reacts to a metric) is a closed-form
function of its step count `last_epoch`: ``lr = f(base_lr, t)``. That makes resuming
from a `state_dict` exact and keeps schedules traceable; it also means a scheduler
owns the rate of its groups (to combine schedules, wrap one in `LinearWarmup`). The
sequences match PyTorch's schedulers of the same names.

Construction counts as step 0 and sets the step-0 rate; call `step()` after each
`optimizer.step()` (per batch or per epoch, as the schedule is counted).

Example::

    >>> opt = sampan.optim.SGD(model.parameters(), lr=0.1)
    >>> sched = sampan.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
    >>> for epoch in range(90):
    ...     train_one_epoch(); sched.step()
"""
from __future__ import annotations

import bisect
import copy
import math

from sampan.errors import SampanValueError

from ._lr_base import LRScheduler, ReduceLROnPlateau

__all__ = [
    "ChainedScheduler",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "LinearWarmup",
    "MultiStepLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "PolynomialLR",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
]


class StepLR(LRScheduler):
    """``lr = base * gamma ** (t // step_size)``.

    Example::

        >>> sched = StepLR(opt, step_size=10, gamma=0.5)
    """

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if step_size < 1:
            raise SampanValueError(f"StepLR: step_size {step_size} must be >= 1")
        self.step_size, self.gamma = int(step_size), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t):
        return [b * self.gamma ** (t // self.step_size) for b in self.base_lrs]


class MultiStepLR(LRScheduler):
    """``lr = base * gamma ** (number of milestones <= t)``; repeated milestones count twice.

    Example::

        >>> sched = MultiStepLR(opt, milestones=[30, 80], gamma=0.1)
    """

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        self.milestones = sorted(int(m) for m in milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t):
        k = bisect.bisect_right(self.milestones, t)
        return [b * self.gamma ** k for b in self.base_lrs]


class ExponentialLR(LRScheduler):
    """``lr = base * gamma ** t``.

    Example::

        >>> sched = ExponentialLR(opt, gamma=0.95)
    """

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t):
        return [b * self.gamma ** t for b in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base - eta_min) * (1 + cos(pi * t / T_max)) / 2``.

    Past `T_max` the cosine carries on (rising again), as PyTorch's does.

    Example::

        >>> sched = CosineAnnealingLR(opt, T_max=100, eta_min=1e-5)
    """

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        if T_max < 1:
            raise SampanValueError(f"CosineAnnealingLR: T_max {T_max} must be >= 1")
        self.T_max, self.eta_min = int(T_max), eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t):
        c = (1.0 + math.cos(math.pi * t / self.T_max)) / 2.0
        return [self.eta_min + (b - self.eta_min) * c for b in self.base_lrs]

    def chain_lr(self, lrs, t):
        if t <= 0:
            return list(lrs)
        T, lo = self.T_max, self.eta_min
        if (t - 1 - T) % (2 * T) == 0:  # leaving the trough: the ratio form would be 0/0
            return [lr + (b - lo) * (1 - math.cos(math.pi / T)) / 2
                    for lr, b in zip(lrs, self.base_lrs)]
        r = (1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
        return [r * (lr - lo) + lo for lr in lrs]


class LinearLR(LRScheduler):
    """Scale the rate linearly from `start_factor` to `end_factor` over `total_iters` steps.

    Example::

        >>> sched = LinearLR(opt, start_factor=0.1, total_iters=100)  # a warm-up
    """

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        if not (0.0 < start_factor <= 1.0 and 0.0 <= end_factor <= 1.0):
            raise SampanValueError(f"LinearLR: start_factor {start_factor} must be in (0, 1] "
                                   f"and end_factor {end_factor} in [0, 1]")
        self.start_factor, self.end_factor = start_factor, end_factor
        self.total_iters = int(total_iters)
        super().__init__(optimizer, last_epoch)

    def factor(self, t: int) -> float:
        if self.total_iters <= 0:
            return self.end_factor
        frac = min(max(t, 0), self.total_iters) / self.total_iters
        return self.start_factor + (self.end_factor - self.start_factor) * frac

    def lr_at(self, t):
        f = self.factor(t)
        return [b * f for b in self.base_lrs]


class LinearWarmup(LRScheduler):
    """Warm up linearly for `warmup_steps`, then follow `after` (if any) from its step 0.

    During warm-up ``lr = base * (start_factor + (1 - start_factor) * t / warmup_steps)``;
    from ``t = warmup_steps`` on, the rate is ``after``'s at ``t - warmup_steps`` (or
    the base rate). Same sequence as PyTorch's ``SequentialLR([LinearLR(...), after])``.

    Example::

        >>> cosine = CosineAnnealingLR(opt, T_max=900)
        >>> sched = LinearWarmup(opt, warmup_steps=100, after=cosine)
    """

    def __init__(self, optimizer, warmup_steps: int, after: LRScheduler | None = None,
                 start_factor: float = 0.0, last_epoch: int = -1):
        if warmup_steps < 0:
            raise SampanValueError(f"LinearWarmup: warmup_steps {warmup_steps} must be >= 0")
        if after is not None and after.optimizer is not optimizer:
            raise SampanValueError("LinearWarmup: `after` schedules a different optimiser")
        self.warmup_steps = int(warmup_steps)
        self.start_factor = start_factor
        self.after = after
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t):
        if t < self.warmup_steps:
            f = self.start_factor + (1.0 - self.start_factor) * t / self.warmup_steps
            return [b * f for b in self.base_lrs]
        if self.after is None:
            return list(self.base_lrs)
        self.after.last_epoch = t - self.warmup_steps
        lrs = self.after.lr_at(self.after.last_epoch)
        self.after._last_lr = list(lrs)
        return lrs

    def chain_lr(self, lrs, t):
        return self.lr_at(t)

    def state_dict(self):
        sd = {k: copy.deepcopy(v) for k, v in self.__dict__.items()
              if k not in ("optimizer", "after")}
        sd["after"] = None if self.after is None else self.after.state_dict()
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        after = state_dict.pop("after", None)
        self.__dict__.update(copy.deepcopy(state_dict))
        if after is not None and self.after is not None:
            self.after.load_state_dict(after)


class OneCycleLR(LRScheduler):
    """The one-cycle policy (Smith): rise to `max_lr`, then anneal far below the start.

    Step count ``total_steps`` (or ``epochs * steps_per_epoch``); the rate starts at
    ``max_lr / div_factor``, peaks at step ``pct_start * total_steps - 1`` and ends at
    ``start / final_div_factor``. With `cycle_momentum` the momentum (or Adam's beta1)
    moves the opposite way between `max_momentum` and `base_momentum`. Matches
    PyTorch's `OneCycleLR`, including `three_phase`.

    Example::

        >>> sched = OneCycleLR(opt, max_lr=0.1, total_steps=1000)  # step() every batch
    """

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True,
                 base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
                 final_div_factor=1e4, three_phase=False, last_epoch=-1):
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise SampanValueError("OneCycleLR: give total_steps, or epochs and "
                                       "steps_per_epoch")
            total_steps = int(epochs) * int(steps_per_epoch)
        if total_steps <= 0:
            raise SampanValueError(f"OneCycleLR: total_steps {total_steps} must be > 0")
        if not 0.0 <= pct_start <= 1.0:
            raise SampanValueError(f"OneCycleLR: pct_start {pct_start} must be in [0, 1]")
        if anneal_strategy not in ("cos", "linear"):
            raise SampanValueError(f"OneCycleLR: anneal_strategy {anneal_strategy!r}; "
                                   "expected 'cos' or 'linear'")
        self.total_steps = int(total_steps)
        self.anneal_strategy = anneal_strategy
        p = float(pct_start * self.total_steps)
        if three_phase:
            self.phases = [(p - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (2 * p - 2, "max_lr", "initial_lr", "base_momentum",
                            "max_momentum"),
                           (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum",
                            "max_momentum")]
        else:
            self.phases = [(p - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (self.total_steps - 1, "max_lr", "min_lr", "base_momentum",
                            "max_momentum")]
        groups = optimizer.param_groups
        max_lrs = _per_group(max_lr, groups, "max_lr")
        if last_epoch == -1:
            for g, m in zip(groups, max_lrs):
                g["initial_lr"] = m / div_factor
                g["max_lr"] = m
                g["min_lr"] = g["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise SampanValueError("OneCycleLR: cycle_momentum=True but the optimiser has "
                                       "neither 'momentum' nor 'betas'")
            self.use_beta1 = "betas" in optimizer.defaults
            bases = _per_group(base_momentum, groups, "base_momentum")
            maxes = _per_group(max_momentum, groups, "max_momentum")
            if last_epoch == -1:
                for g, b, m in zip(groups, bases, maxes):
                    self._set_momentum(g, m)
                    g["base_momentum"], g["max_momentum"] = b, m
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, g, m):
        if self.use_beta1:
            g["betas"] = (m, *g["betas"][1:])
        else:
            g["momentum"] = m

    def chain_lr(self, lrs, t):
        return self.lr_at(t)

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def lr_at(self, t):
        if t > self.total_steps:
            raise SampanValueError(f"OneCycleLR: step {t} is past total_steps "
                                   f"{self.total_steps}")
        lrs = []
        for g in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self.phases):
                if t <= end or i == len(self.phases) - 1:
                    pct = (t - start) / (end - start)
                    lrs.append(self._anneal(g[lr0], g[lr1], pct))
                    if self.cycle_momentum:
                        self._set_momentum(g, self._anneal(g[m0], g[m1], pct))
                    break
                start = end
        return lrs


def _per_group(value, groups, name):
    if isinstance(value, (list, tuple)):
        if len(value) != len(groups):
            raise SampanValueError(f"OneCycleLR: {name} has {len(value)} values for "
                                   f"{len(groups)} param groups")
        return list(value)
    return [value] * len(groups)


# more schedulers live in their own module (file size); they are part of this namespace
from ._lr_more import (
    ChainedScheduler,
    ConstantLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    LambdaLR,
    MultiplicativeLR,
    PolynomialLR,
    SequentialLR,
)
