"""A compiled graph (`Compiled`): the executor `codegen.py` generates, and its profiling
variant (`profiled.py`) made on the first call while `sampan.profiler` records. It sits
below both, so the generator and the variant it makes need not import each other.
"""
from __future__ import annotations

from .. import _recorder as _rec


class Compiled:
    """A compiled graph: call it with input arrays, get a tuple of output arrays."""

    def __init__(self, fn, code, filename, plan, remake=None):
        self.fn = fn
        self.code = code
        self.filename = filename
        self.plan = plan
        self._remake = remake       # () -> the profiling variant of this executor
        self._profiled = None

    def __call__(self, *arrays):
        if _rec.ACTIVE and self._remake is not None:
            return self.profiled(*arrays)
        return self.fn(*arrays)

    def profiled(self, *arrays):
        """Run the variant that records a "kernel" event per node (made on first use)."""
        if self._profiled is None:    # made once; the span shows the gap it leaves
            t0 = _rec.now()
            self._profiled = self._remake()
            _rec.emit("profiling_variant", "jit", t0, _rec.now() - t0,
                      program=self._profiled.program)
        p = self._profiled
        t0 = _rec.now()
        try:
            return p.fn(*arrays)
        finally:
            _rec.emit("run", "jit", t0, _rec.now() - t0, program=p.program)
