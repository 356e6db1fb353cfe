"""`GradScaler`: dynamic loss scaling for float16 training, with `torch.amp.GradScaler`'s
semantics (its scale sequence, skipped steps and state dict).

The loss is multiplied by the scale before backward so that small float16 gradients do
not flush to zero; `unscale_` divides the (float32 master) gradients by it and notes
whether any is inf/NaN; `step` skips the optimiser step when one was; `update` halves the
scale after a skipped step (`backoff_factor`) and doubles it after `growth_interval`
finite steps in a row (`growth_factor`). The scale is a float32, as PyTorch keeps it, so
both give the same sequence.

Example::

    >>> scaler = sampan.amp.GradScaler()
    >>> with sampan.amp.autocast(sampan.float16):
    ...     loss = sampan.cross_entropy(model(x), y)
    >>> scaler.scale(loss).backward()
    >>> scaler.step(opt)
    >>> scaler.update()
"""
from __future__ import annotations

import numpy as np

from ..errors import SampanError, SampanValueError
from ..tensor import Tensor

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"
_F32 = np.float32


class GradScalerError(SampanError, RuntimeError):
    """A GradScaler call out of order (unscale_ twice, step twice before update ...)."""


class GradScaler:
    """Dynamic loss scale (see module doc); `enabled=False` makes every method a no-op
    (`scale` returns its input, `step` just steps).

    Example::

        >>> s = GradScaler(init_scale=2.0 ** 16, growth_interval=2000)
        >>> s.scale(loss).backward(); s.step(opt); s.update(); s.get_scale()
        65536.0
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        if not growth_factor > 1.0:
            raise SampanValueError(f"GradScaler: growth_factor {growth_factor} must be > 1")
        if not 0.0 < backoff_factor < 1.0:
            raise SampanValueError(f"GradScaler: backoff_factor {backoff_factor} must be in "
                                   "(0, 1)")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) \
                or growth_interval < 1:
            raise SampanValueError(f"GradScaler: growth_interval {growth_interval!r} must be "
                                   "a positive int")
        self._enabled = bool(enabled)
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._scale = None            # float32, created at the first scale() (as PyTorch)
        self._growth_tracker = 0
        self._per_opt: dict = {}      # id(optimizer) -> {"stage", "found_inf"}

    # ----------------------------------------------------------------- the loop
    def is_enabled(self) -> bool:
        return self._enabled

    def scale(self, outputs):
        """`outputs` (a Tensor, or a list/tuple/dict of them) times the current scale."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale = _F32(self._init_scale)
        # a 0-d float32 tensor: the loss keeps its dtype, as with PyTorch's scale tensor
        return _map(outputs, lambda t: t * Tensor(np.asarray(self._scale)))

    def unscale_(self, optimizer) -> None:
        """Divide `optimizer`'s gradients by the scale, in place, and note inf/NaN among
        them. Call it before clipping gradients; `step` calls it when you did not."""
        if not self._enabled:
            return
        self._check_scale("unscale_")
        st = self._state(optimizer)
        if st["stage"] == _UNSCALED:
            raise GradScalerError("GradScaler.unscale_: already called on this optimizer "
                                  "since the last update()")
        if st["stage"] == _STEPPED:
            raise GradScalerError("GradScaler.unscale_: called after step(); call update() "
                                  "first")
        inv = _F32(1.0 / np.float64(self._scale))  # reciprocal in float64, then float32
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                a = g._data
                if a.dtype == np.float16:
                    raise GradScalerError("GradScaler.unscale_: a float16 gradient; keep the "
                                          "parameters float32 (autocast casts them per use)")
                if not np.isfinite(a).all():
                    found = True
                # in place: the optimiser reads p.grad's array
                np.multiply(a, a.dtype.type(inv), out=a, casting="unsafe")
        st["found_inf"] = found
        st["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """`optimizer.step()` unless the unscaled gradients hold inf/NaN (then skipped:
        returns None). Unscales first when `unscale_` was not called."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        self._check_scale("step")
        st = self._state(optimizer)
        if st["stage"] == _STEPPED:
            raise GradScalerError("GradScaler.step: already called since the last update()")
        if st["stage"] == _READY:
            self.unscale_(optimizer)
        ret = None
        if not st["found_inf"]:
            ret = optimizer.step(*args, **kwargs)
        st["stage"] = _STEPPED
        return ret

    def update(self, new_scale=None) -> None:
        """Adjust the scale after this iteration's steps: backoff when any optimiser saw
        inf/NaN, growth after `growth_interval` good iterations; or set `new_scale`."""
        if not self._enabled:
            return
        self._check_scale("update")
        if new_scale is not None:
            v = new_scale.item() if isinstance(new_scale, Tensor) else new_scale
            self._scale = _F32(v)
        else:
            found = [s["found_inf"] for s in self._per_opt.values() if s["stage"] != _READY
                     and s["found_inf"] is not None]
            if not found:
                raise GradScalerError("GradScaler.update: no inf checks were recorded before "
                                      "this call (call step() or unscale_() first)")
            if any(found):
                self._scale = _F32(self._scale * _F32(self._backoff_factor))
                self._growth_tracker = 0
            else:
                good = self._growth_tracker + 1
                if good == self._growth_interval:
                    grown = _F32(self._scale * _F32(self._growth_factor))
                    if np.isfinite(grown):
                        self._scale = grown
                    good = 0
                self._growth_tracker = good
        self._per_opt = {}

    def discard_step(self, optimizer) -> None:
        """Forget this iteration's unscale_/inf check for `optimizer` without stepping or
        changing the scale (a step computed only to look at its gradients)."""
        self._per_opt.pop(id(optimizer), None)

    # ----------------------------------------------------------------- state
    def get_scale(self) -> float:
        """The current scale (the initial one before the first `scale`; 1.0 if disabled)."""
        if not self._enabled:
            return 1.0
        return float(self._init_scale if self._scale is None else self._scale)

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def state_dict(self) -> dict:
        """The scale, its factors and the growth tracker (empty when disabled), as
        PyTorch's keys."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": int(self._growth_tracker)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (from sampan or from torch.amp.GradScaler)."""
        if not self._enabled:
            return
        if not isinstance(state, dict) or not state:
            raise GradScalerError("GradScaler.load_state_dict: the state dict is empty, "
                                  "possibly saved from a disabled GradScaler")
        need = ("scale", "growth_factor", "backoff_factor", "growth_interval",
                "_growth_tracker")
        missing = [k for k in need if k not in state]
        if missing:
            raise GradScalerError(f"GradScaler.load_state_dict: missing {missing}; expected "
                                  f"the keys {list(need)}")
        self._init_scale = float(_num(state["scale"]))
        self._scale = _F32(self._init_scale)
        self._growth_factor = float(_num(state["growth_factor"]))
        self._backoff_factor = float(_num(state["backoff_factor"]))
        self._growth_interval = int(_num(state["growth_interval"]))
        self._growth_tracker = int(_num(state["_growth_tracker"]))

    def __repr__(self):
        return (f"GradScaler(scale={self.get_scale()}, growth_tracker={self._growth_tracker}, "
                f"enabled={self._enabled})")

    # ----------------------------------------------------------------- helpers
    def _check_scale(self, who):
        if self._scale is None:
            raise GradScalerError(f"GradScaler.{who}: no scale yet; call scale(loss) first")

    def _state(self, optimizer):
        st = self._per_opt.get(id(optimizer))
        if st is None:
            st = self._per_opt[id(optimizer)] = {"stage": _READY, "found_inf": None,
                                                 "opt": optimizer}
        return st


def _num(v):
    if isinstance(v, Tensor):
        return v.item()
    if hasattr(v, "item"):
        return v.item()
    return v


def _map(x, fn):
    if isinstance(x, Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    raise SampanValueError(f"GradScaler.scale: expected a Tensor or a list/tuple/dict of "
                           f"them; got {type(x).__name__}")
