"""More learning-rate schedulers (re-exported by `sampan.optim.lr_scheduler`).

Like the schedulers there, each one is a closed form of its step count where PyTorch's
is (`LambdaLR`, `ConstantLR`, `PolynomialLR`, `CyclicLR`, `CosineAnnealingWarmRestarts`);
`MultiplicativeLR` scales the current rate, as PyTorch's. `SequentialLR` switches
between schedulers at milestones; `ChainedScheduler` lets each schedule change the rate
the previous ones gave (`LRScheduler.chain_lr`). Sequences match PyTorch's schedulers
of the same names.
"""
from __future__ import annotations

import bisect
import copy
import math
import types

from sampan.errors import SampanValueError

from ._lr_base import LRScheduler, ReduceLROnPlateau

__all__ = ["ChainedScheduler", "ConstantLR", "CosineAnnealingWarmRestarts", "CyclicLR",
           "LambdaLR", "MultiplicativeLR", "PolynomialLR", "SequentialLR"]


def _per_group(name, value, groups, what):
    if isinstance(value, (list, tuple)):
        if len(value) != len(groups):
            raise SampanValueError(f"{name}: got {len(value)} values of {what} for "
                                   f"{len(groups)} param groups")
        return list(value)
    return [value] * len(groups)


def _fn_state(fns):
    """Functions are not state (as in PyTorch); a callable object's attributes are."""
    return [None if isinstance(f, types.FunctionType) or not hasattr(f, "__dict__")
            else copy.deepcopy(f.__dict__) for f in fns]


def _plain_state(sched, skip):
    return {k: copy.deepcopy(v) for k, v in sched.__dict__.items()
            if k != "optimizer" and k not in skip}


class LambdaLR(LRScheduler):
    """``lr = base * lr_lambda(t)`` (one function, or one per group).

    Example::

        >>> sched = LambdaLR(opt, lr_lambda=lambda t: 0.95 ** t)
    """

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        self.lr_lambdas = _per_group(type(self).__name__, lr_lambda,
                                     optimizer.param_groups, "lr_lambda")
        for f in self.lr_lambdas:
            if not callable(f):
                raise SampanValueError(f"{type(self).__name__}: lr_lambda should be callable, "
                                       f"got {type(f).__name__}")
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t):
        return [b * f(t) for f, b in zip(self.lr_lambdas, self.base_lrs)]

    def chain_lr(self, lrs, t):  # a closed form: it sets the rate whatever came before
        return self.lr_at(t)

    def state_dict(self):
        sd = _plain_state(self, ("lr_lambdas",))
        sd["lr_lambdas"] = _fn_state(self.lr_lambdas)
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        fns = state_dict.pop("lr_lambdas", None) or []
        self.__dict__.update(copy.deepcopy(state_dict))
        for f, saved in zip(self.lr_lambdas, fns):
            if saved is not None:
                f.__dict__.update(copy.deepcopy(saved))


class MultiplicativeLR(LambdaLR):
    """Multiply each group's current rate by ``lr_lambda(t)`` at every step t >= 1.

    Not a closed form (as in PyTorch): it scales whatever rate the group has, so after
    a `SequentialLR` milestone it carries on from the previous schedule's rate, and a
    resume needs the optimiser's state_dict (which holds the rates) as well as this one.

    Example::

        >>> sched = MultiplicativeLR(opt, lr_lambda=lambda t: 0.95)
    """

    def step(self, epoch=None):
        t = self.last_epoch + 1 if epoch is None else int(epoch)
        self.last_epoch = t
        groups = self.optimizer.param_groups
        if epoch is None and t == 0:  # the initial step (construction) keeps the rates
            lrs = [g["lr"] for g in groups]
        else:
            lrs = [g["lr"] * f(t) for g, f in zip(groups, self.lr_lambdas)]
        for g, lr in zip(groups, lrs):
            g["lr"] = lr
        self._last_lr = list(lrs)

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def lr_at(self, t):
        raise NotImplementedError("MultiplicativeLR has no closed form; it scales the "
                                  "current rates")

    def chain_lr(self, lrs, t):
        return list(lrs) if t <= 0 else [lr * f(t) for lr, f in zip(lrs, self.lr_lambdas)]


class ConstantLR(LRScheduler):
    """``lr = base * factor`` for the first `total_iters` steps, then `base`.

    Example::

        >>> sched = ConstantLR(opt, factor=0.5, total_iters=4)
    """

    def __init__(self, optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1):
        if not 0.0 <= factor <= 1.0:
            raise SampanValueError(f"ConstantLR: factor {factor} must be in [0, 1]")
        self.factor, self.total_iters = factor, int(total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t):
        f = 1.0 if t >= self.total_iters else self.factor
        return [b * f for b in self.base_lrs]


class PolynomialLR(LRScheduler):
    """``lr = base * (1 - min(t, total_iters) / total_iters) ** power``.

    Example::

        >>> sched = PolynomialLR(opt, total_iters=100, power=2.0)
    """

    def __init__(self, optimizer, total_iters: int = 5, power: float = 1.0,
                 last_epoch: int = -1):
        if total_iters < 1:
            raise SampanValueError(f"PolynomialLR: total_iters {total_iters} must be >= 1")
        self.total_iters, self.power = int(total_iters), power
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t):
        f = (1.0 - min(self.total_iters, max(t, 0)) / self.total_iters) ** self.power
        return [b * f for b in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing that restarts: periods `T_0`, `T_0*T_mult`, ... (SGDR).

    ``lr = eta_min + (base - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2``. `step(epoch)`
    takes a fractional epoch (e.g. ``epoch + i / iters_per_epoch``) to anneal per batch.

    Example::

        >>> sched = CosineAnnealingWarmRestarts(opt, T_0=10, T_mult=2, eta_min=1e-5)
        >>> sched.step(epoch + i / len(loader))
    """

    def __init__(self, optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1):
        if not isinstance(T_0, int) or T_0 <= 0:
            raise SampanValueError(f"CosineAnnealingWarmRestarts: T_0 {T_0!r} must be a "
                                   "positive int")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise SampanValueError(f"CosineAnnealingWarmRestarts: T_mult {T_mult!r} must be "
                                   "an int >= 1")
        self.T_0 = self.T_i = T_0
        self.T_mult, self.eta_min = T_mult, eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        c = (1.0 + math.cos(math.pi * self.T_cur / self.T_i)) / 2.0
        return [self.eta_min + (b - self.eta_min) * c for b in self.base_lrs]

    def lr_at(self, t):  # the position in the cycle is state: t alone does not fix it
        return self.get_lr()

    def chain_lr(self, lrs, t):
        return self.get_lr()

    def step(self, epoch=None):
        """Advance one epoch, or jump to (fractional) `epoch`."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:
                self.T_cur %= self.T_i
                self.T_i *= self.T_mult
        else:
            if epoch < 0:
                raise SampanValueError(f"CosineAnnealingWarmRestarts: epoch {epoch} must "
                                       "be >= 0")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        lrs = self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
        self._last_lr = list(lrs)


class CyclicLR(LRScheduler):
    """Cyclical learning rate (Smith): between `base_lr` and `max_lr`, per batch.

    Each cycle rises for `step_size_up` steps and falls for `step_size_down` (default:
    the same). `mode` "triangular" keeps the amplitude, "triangular2" halves it each
    cycle, "exp_range" scales it by ``gamma ** t``; or give `scale_fn` (with
    `scale_mode` "cycle" or "iterations"). With `cycle_momentum` the momentum (or
    Adam's beta1) moves the opposite way, between `max_momentum` and `base_momentum`.

    Example::

        >>> sched = CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=200)
    """

    def __init__(self, optimizer, base_lr, max_lr, step_size_up=2000, step_size_down=None,
                 mode="triangular", gamma=1.0, scale_fn=None, scale_mode="cycle",
                 cycle_momentum=True, base_momentum=0.8, max_momentum=0.9, last_epoch=-1):
        groups = optimizer.param_groups
        base_lrs = _per_group("CyclicLR", base_lr, groups, "base_lr")
        if last_epoch == -1:
            for lr, g in zip(base_lrs, groups):
                g["lr"] = lr
        self.max_lrs = _per_group("CyclicLR", max_lr, groups, "max_lr")
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        if up <= 0 or down < 0:
            raise SampanValueError(f"CyclicLR: step_size_up {step_size_up} must be > 0 and "
                                   f"step_size_down {step_size_down} >= 0")
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise SampanValueError(f"CyclicLR: mode {mode!r}; expected 'triangular', "
                                   "'triangular2' or 'exp_range' (or give scale_fn)")
        if scale_fn is None:
            scale_mode = "iterations" if mode == "exp_range" else "cycle"
        self.mode, self.gamma, self.scale_mode = mode, gamma, scale_mode
        self._scale_fn_custom = scale_fn
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise SampanValueError("CyclicLR: cycle_momentum=True but the optimiser has "
                                       "neither 'momentum' nor 'betas'")
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group("CyclicLR", base_momentum, groups,
                                             "base_momentum")
            self.max_momentums = _per_group("CyclicLR", max_momentum, groups, "max_momentum")
            if last_epoch == -1:
                for m, b, g in zip(self.max_momentums, self.base_momentums, groups):
                    self._set_momentum(g, m)
                    g["max_momentum"], g["base_momentum"] = m, b
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _set_momentum(self, g, m):
        if self.use_beta1:
            g["betas"] = (m, *g["betas"][1:])
        else:
            g["momentum"] = m

    def scale_fn(self, x) -> float:
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma ** x

    def lr_at(self, t):
        cycle = math.floor(1 + t / self.total_size)
        x = 1.0 + t / self.total_size - cycle
        frac = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else t)
        lrs = [b + (m - b) * frac * scale for b, m in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for g, b, m in zip(self.optimizer.param_groups, self.base_momentums,
                               self.max_momentums):
                self._set_momentum(g, m - (m - b) * frac * scale)
        return lrs

    def chain_lr(self, lrs, t):
        return self.lr_at(t)

    def state_dict(self):
        sd = _plain_state(self, ("_scale_fn_custom",))
        sd["_scale_fn_custom"] = _fn_state([self._scale_fn_custom])[0] \
            if self._scale_fn_custom is not None else None
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        fn = state_dict.pop("_scale_fn_custom", None)
        self.__dict__.update(copy.deepcopy(state_dict))
        if fn is not None and self._scale_fn_custom is not None:
            self._scale_fn_custom.__dict__.update(copy.deepcopy(fn))


def _check_children(name, optimizer, schedulers):
    if len(schedulers) < 1:
        raise SampanValueError(f"{name}: expects at least one scheduler, got none")
    for i, s in enumerate(schedulers):
        if isinstance(s, ReduceLROnPlateau):
            raise SampanValueError(f"{name}: scheduler {i} is a ReduceLROnPlateau, which needs "
                                   "a metric at each step; step it on its own")
        if not hasattr(s, "optimizer") or s.optimizer is not optimizer:
            raise SampanValueError(f"{name}: scheduler {i} ({type(s).__name__}) schedules "
                                   "another optimiser")


class _Composite(LRScheduler):
    """Shared state handling of the schedulers made of other schedulers."""

    def state_dict(self):
        sd = _plain_state(self, ("_schedulers",))
        sd["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        children = state_dict.pop("_schedulers")
        self.__dict__.update(copy.deepcopy(state_dict))
        for s, saved in zip(self._schedulers, children):
            s.load_state_dict(saved)


class SequentialLR(_Composite):
    """Run `schedulers[0]` until `milestones[0]`, then `schedulers[1]` from its step 0, ...

    Example::

        >>> warm = LinearLR(opt, start_factor=0.1, total_iters=5)
        >>> cos = CosineAnnealingLR(opt, T_max=95)
        >>> sched = SequentialLR(opt, [warm, cos], milestones=[5])
    """

    def __init__(self, optimizer, schedulers, milestones, last_epoch: int = -1):
        _check_children("SequentialLR", optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise SampanValueError(f"SequentialLR: got {len(schedulers)} schedulers and "
                                   f"{len(milestones)} milestones; expected one milestone "
                                   "fewer than schedulers")
        self.optimizer = optimizer
        self._schedulers = list(schedulers)
        self._milestones = [int(m) for m in milestones]
        self.last_epoch = last_epoch + 1
        for g in optimizer.param_groups:
            g["lr"] = g["initial_lr"]
        # the children each took their step 0 when built: the first one starts now
        for s in self._schedulers:
            s.last_epoch -= 1
        first = self._schedulers[bisect.bisect_right(self._milestones, 0)]
        first.step()
        self._last_lr = first.get_last_lr()

    def step(self, epoch=None):
        if epoch is not None:
            raise SampanValueError("SequentialLR.step: takes no epoch (it counts its own)")
        self.last_epoch += 1
        idx = bisect.bisect_right(self._milestones, self.last_epoch)
        s = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            s.step(0)
        else:
            s.step()
        self._last_lr = s.get_last_lr()


class ChainedScheduler(_Composite):
    """Apply several schedules at once, in order: each one changes the rate the ones
    before it gave, as its step would change its own (`LRScheduler.chain_lr`); the
    schedules that are only a closed form (LambdaLR, CyclicLR, OneCycleLR,
    CosineAnnealingWarmRestarts) set it outright, as in PyTorch.

    Example::

        >>> sched = ChainedScheduler([ConstantLR(opt, factor=0.5, total_iters=3),
        ...                           ExponentialLR(opt, gamma=0.9)])
    """

    def __init__(self, schedulers, optimizer=None):
        optimizer = optimizer if optimizer is not None else schedulers[0].optimizer
        _check_children("ChainedScheduler", optimizer, schedulers)
        self.optimizer = optimizer
        self._schedulers = list(schedulers)
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = self._schedulers[0].last_epoch
        # each child set its own step-0 rate when built; chain those steps instead
        self._chain(self.base_lrs, advance=False)

    def _chain(self, lrs, advance: bool):
        lrs = list(lrs)
        for s in self._schedulers:
            if advance:
                s.last_epoch += 1
            lrs = s.chain_lr(lrs, s.last_epoch)
            s._last_lr = list(lrs)
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
        self._last_lr = lrs

    def step(self, epoch=None):
        if epoch is not None:
            raise SampanValueError("ChainedScheduler.step: takes no epoch")
        self.last_epoch += 1
        self._chain([g["lr"] for g in self.optimizer.param_groups], advance=True)
