"""Shared pieces of the optimisers that have no traced (`sampan.jit`) rule yet."""
from __future__ import annotations

from sampan.errors import SampanError, SampanValueError, op_error

__all__ = ["EagerOnly", "check_range"]


class EagerOnly:
    """Mixin: `step()` inside a traced function raises instead of tracing nothing.

    These optimisers update numpy storage directly; their pure rules are not in
    `sampan.optim.functional` yet, so a traced step would silently do nothing.
    """

    def _traced_update(self, p, grad, st, group, lr):
        raise op_error(SampanError, f"{type(self).__name__}.step",
                       "a call inside a sampan.jit-traced function",
                       "an eager call (this optimiser has no traced update rule yet)",
                       "Call opt.step() outside the jitted function, or use SGD/Adam/AdamW/"
                       "Adagrad/RMSprop, which trace")


def check_range(name: str, key: str, value, lo=0.0, hi=None, lo_open=False, hi_open=False):
    """Raise a SampanValueError naming `key` unless ``lo <= value <= hi`` (bounds optional)."""
    bad = value < lo or (lo_open and value == lo)
    if hi is not None:
        bad = bad or value > hi or (hi_open and value == hi)
    if bad:
        lo_s = "(" if lo_open else "["
        hi_s = ")" if hi_open else "]"
        rng = f"{lo_s}{lo}, {'inf' if hi is None else hi}{')' if hi is None else hi_s}"
        raise SampanValueError(f"{name}: invalid {key} {value} (expected in {rng})")
