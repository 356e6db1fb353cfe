"""Pass registry, named pipelines and the PassManager.

A pass is a named Graph -> Graph function registered once with `register_pass`.
A pipeline is a list of pass names; `PIPELINES` holds the named ones ("train",
"inference") and users list, extend, reorder or trim them (`pipeline("train")`
returns a copy to edit; `set_pipeline` stores one back).

Example::

    >>> from sampan.passes import pipeline, PassManager
    >>> names = pipeline("inference"); names.remove("cse")
    >>> g2 = PassManager(names, debug=True, dump_ir=print).run(g)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..errors import SampanError


@dataclass
class Pass:
    """One registered pass: a name, a Graph -> Graph function and a description."""
    name: str
    fn: Callable
    doc: str = ""

    def __call__(self, g):
        return self.fn(g)


PASSES: dict[str, Pass] = {}

PIPELINES: dict[str, list] = {
    "train": ["simplify", "fold_constants", "cse", "dce", "merge_slice_grads",
              "share_reshape_copies", "fuse_elementwise", "plan_memory"],
    "inference": ["freeze_state", "simplify", "fold_constants", "cse", "simplify", "dce",
                  "fold_batch_norm", "dce", "fuse_elementwise", "plan_memory"],
    # the train pipeline after `distribute` (gradients all-reduced before the update)
    "data_parallel": ["distribute", "simplify", "fold_constants", "cse", "dce",
                      "merge_slice_grads", "share_reshape_copies", "fuse_elementwise",
                      "plan_memory"],
    "none": [],
}


class PassError(SampanError):
    """A pass failed or left a graph the verifier rejects."""


def register_pass(name: str, fn=None, *, replace: bool = False):
    """Register `fn` as pass `name` (usable as a decorator)."""
    def reg(f):
        if name in PASSES and not replace:
            raise ValueError(f"pass {name!r} is registered twice (pass replace=True)")
        PASSES[name] = Pass(name, f, (f.__doc__ or "").strip().split("\n")[0])
        return f
    return reg(fn) if fn is not None else reg


def unregister_pass(name: str) -> None:
    PASSES.pop(name, None)


def list_passes() -> list:
    """Names of all registered passes."""
    return sorted(PASSES)


def pipeline(name: str) -> list:
    """A copy of the named pipeline's pass list, to edit and pass to PassManager."""
    if name not in PIPELINES:
        raise PassError(f"unknown pipeline {name!r}; known: {', '.join(sorted(PIPELINES))}")
    return list(PIPELINES[name])


def set_pipeline(name: str, passes: list) -> None:
    """Define or replace a named pipeline."""
    for p in passes:
        if p not in PASSES:
            raise PassError(f"pipeline {name!r}: unknown pass {p!r}")
    PIPELINES[name] = list(passes)


class PassManager:
    """Runs a pipeline over a copy of a graph, timing each pass.

    `debug=True` runs the verifier after every pass and names the pass that broke
    the graph with those that ran before it; `dump_ir` (a callable or a directory
    path) receives the IR text after every pass."""

    def __init__(self, passes="train", debug: bool = False, dump_ir=None):
        self.passes = pipeline(passes) if isinstance(passes, str) else list(passes)
        self.debug = debug
        self.dump_ir = dump_ir
        self.timings: list = []

    def run(self, g):
        from ..ir import verify
        g = g.copy()
        self.timings = []
        done = []
        for i, name in enumerate(self.passes):
            p = PASSES.get(name)
            if p is None:
                raise PassError(f"unknown pass {name!r}; registered: {', '.join(list_passes())}")
            t0 = time.perf_counter()
            try:
                out = p(g)
            except SampanError:
                raise
            except Exception as e:
                raise PassError(f"pass {name!r} failed ({type(e).__name__}: {e}); passes run "
                                f"before it: {done or 'none'}") from e
            g = out if out is not None else g
            self.timings.append((name, time.perf_counter() - t0))
            if self.debug:
                try:
                    verify(g)
                except SampanError as e:
                    raise PassError(f"pass {name!r} left an invalid graph: {e}\n"
                                    f"passes run before it: {done or 'none'}") from None
            done.append(name)
            if self.dump_ir is not None:
                self._dump(i, name, g)
        return g

    def _dump(self, i, name, g):
        text = f"// after pass {i}: {name}\n{g}"
        if callable(self.dump_ir):
            self.dump_ir(text)
        else:
            import os
            os.makedirs(self.dump_ir, exist_ok=True)
            with open(os.path.join(self.dump_ir, f"{i:02d}_{name}.ir"), "w") as f:
                f.write(text)

    def report(self) -> str:
        """A table of pass timings."""
        return "\n".join(f"{n:<16} {s * 1e3:8.3f} ms" for n, s in self.timings)
