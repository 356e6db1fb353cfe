"""The pass bisector: which pass changed the outputs?

Runs the pipeline one pass at a time from the unoptimised graph, executes the graph
after each pass on the same inputs, and names the first pass whose outputs differ
from the unoptimised graph's beyond tolerance, with the IR before and after it.

Example::

    >>> r = sampan.passes.bisect(model_step, (x, y))
    >>> print(r)          # "no pass changes the outputs" or the culprit with both IRs
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# What the bisector needs from the floors above passes/ (running a Graph, tracing a
# function), registered by `sampan.jit` as it loads (`register_front`), so that this
# module imports nothing above ir/ and ops/.
_FRONT: dict = {}


def register_front(run, trace) -> None:
    """`run(graph, arrays, use_plan)` -> the graph's outputs; `trace(fn, inputs)` ->
    (graph as traced, its input arrays). Called by `sampan.jit` on import."""
    _FRONT["run"], _FRONT["trace"] = run, trace


def _front(what):
    if what not in _FRONT:
        from ..errors import SampanError
        raise SampanError("sampan.passes.bisect needs sampan.jit (import sampan) to "
                          f"{'run graphs' if what == 'run' else 'trace functions'}")
    return _FRONT[what]


@dataclass
class BisectResult:
    culprit: str | None
    index: int | None = None
    max_error: float = 0.0
    before: str = ""
    after: str = ""
    passes: list = field(default_factory=list)

    def __str__(self):
        if self.culprit is None:
            return f"bisect: no pass changes the outputs (checked {', '.join(self.passes)})"
        return (f"bisect: pass {self.culprit!r} (#{self.index} of {self.passes}) changes the "
                f"outputs (max abs error {self.max_error:.3g})\n--- IR before ---\n"
                f"{self.before}--- IR after ---\n{self.after}")


def _max_err(a, b):
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return float("inf")
        if x.size == 0:
            continue
        if x.dtype.kind in "fc" or x.dtype.name == "bfloat16":
            xf, yf = x.astype(np.float64), y.astype(np.float64)
            if not np.array_equal(np.isnan(xf), np.isnan(yf)):
                return float("inf")
            d = np.abs(np.nan_to_num(xf - yf, nan=0.0))
            tol = 1.0 + np.abs(np.nan_to_num(yf, nan=0.0, posinf=0.0, neginf=0.0))
            worst = max(worst, float(np.max(d / tol)))
        elif not np.array_equal(x, y):
            return float("inf")
    return worst


def _pass_names(passes) -> list:
    """The pass names of `passes`: a pipeline name, or a list whose entries are pass
    names or pipeline names (expanded in place). Unknown names raise PassError."""
    from .manager import PASSES, PIPELINES, PassError, pipeline
    if isinstance(passes, str):
        return pipeline(passes)
    names = []
    for p in passes:
        if p in PASSES:
            names.append(p)
        elif p in PIPELINES:
            names += pipeline(p)
        else:
            raise PassError(f"unknown pass or pipeline {p!r}; pipelines: "
                            f"{', '.join(sorted(PIPELINES))}; passes: {', '.join(sorted(PASSES))}")
    return names


def bisect_graph(g, arrays, passes="train", tol: float = 1e-5) -> BisectResult:
    """Bisect the passes of `passes` (a pipeline name, or pass and pipeline names) on
    graph `g` run with input `arrays`. `g` must have concrete sizes."""
    from .manager import PASSES, PassError
    run = _front("run")
    names = _pass_names(passes)
    sym = next((v for v in g.values() if any(isinstance(d, str) for d in v.shape)), None)
    if sym is not None:
        raise PassError(f"bisect: graph {g.name!r} has symbolic sizes (value "
                        f"{sym.type_str()}); bisect it at concrete sizes (`sampan bisect` "
                        "uses a saved program's example inputs)")
    ref = run(g, arrays, False)
    cur = g.copy()
    for i, name in enumerate(names):
        before = str(cur)
        nxt = PASSES[name](cur.copy())
        nxt = cur if nxt is None else nxt
        try:
            out = run(nxt, arrays, True)
            err = _max_err(out, ref)
        except Exception as e:  # a pass that breaks execution is a culprit too
            err = float("inf")
            nxt.meta["error"] = repr(e)
        if err > tol:
            return BisectResult(name, i, err, before, str(nxt), names)
        cur = nxt
    return BisectResult(None, passes=names)


def bisect(fn, inputs, passes="train", tol: float = 1e-5) -> BisectResult:
    """Trace `fn(*inputs)` (a function, jitted function or Layer) and bisect its passes."""
    g, arrays = _front("trace")(fn, tuple(inputs))
    return bisect_graph(g, arrays, passes, tol)
