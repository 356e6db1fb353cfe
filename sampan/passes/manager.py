"""Pass registry, named pipelines and the PassManager.

A pass is a named Graph -> Graph function registered once with `register_pass`. A pass
with settings declares them there, with their defaults (`options={"weight_only": False}`)
and takes them as keyword arguments; a caller sets them per run (`PassManager(names,
options={"quantize": {"weight_only": True}})`, or `Config.pass_builder().set_option`),
never through `graph.meta`.

A pipeline is a list of pass names; `PIPELINES` holds the named ones ("train",
"inference") and users list, extend, reorder or trim them (`pipeline("train")` returns a
copy to edit; `set_pipeline` stores one back).

The PassManager runs a list in order and calls its hooks after every pass: `verify` (the
IR verifier with `debug=True`, or any callable) and the dump hooks (`dump_ir`, `hooks`),
so whoever drives a pipeline (jit, the Predictor's `switch_ir_debug`) sees the same list
that ran.

Example::

    >>> from sampan.passes import pipeline, PassManager
    >>> names = pipeline("inference"); names.remove("cse")
    >>> seen = []
    >>> g2 = PassManager(names, debug=True, hooks=[lambda i, n, g: seen.append(n)]).run(g)
    >>> seen == names
    True
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

from ..errors import SampanError


@dataclass
class Pass:
    """One registered pass: a name, a Graph -> Graph function, a description and the
    options it takes (name -> default), passed to it as keyword arguments."""
    name: str
    fn: Callable
    doc: str = ""
    options: dict = field(default_factory=dict)
    legacy_meta: str | None = None      # graph.meta key its options came in, before options
    # whether the pass also runs on the blocks of control-flow nodes (innermost first, the
    # graph last): passes that keep a graph's inputs and outputs as they are. The others
    # run on the top graph only and leave control nodes as they are
    blocks: bool = False

    def __call__(self, g, **options):
        if self.blocks:
            for n in g.nodes:
                n.blocks = [self._on_block(b, options) for b in n.blocks]
        if not self.options:
            if options:
                raise PassError(f"pass {self.name!r} takes no options; got {sorted(options)}")
            return self.fn(g)
        if not options:
            options = self._legacy(g)
        return self.fn(g, **self.resolve(options))

    def _on_block(self, b, options):
        out = self(b, **options)
        return out if out is not None else b

    def _legacy(self, g) -> dict:
        """Options an older caller put in `graph.meta[legacy_meta]` (deprecated)."""
        legacy = g.meta.get(self.legacy_meta) if self.legacy_meta else None
        if not isinstance(legacy, dict) or not legacy:
            return {}
        warnings.warn(f"pass {self.name!r}: options in graph.meta[{self.legacy_meta!r}] are "
                      f"deprecated; set them with PassManager(options={{{self.name!r}: "
                      "...}) or Config.pass_builder().set_option", DeprecationWarning,
                      stacklevel=4)
        return {k: v for k, v in legacy.items() if k in self.options}

    def resolve(self, options) -> dict:
        """The declared defaults updated by `options` (every name checked)."""
        check_options(self.name, options)
        out = dict(self.options)
        out.update(options)
        return out


PASSES: dict[str, Pass] = {}

PIPELINES: dict[str, list] = {
    # `licm` moves loop invariants out of while_loop/scan blocks (nothing without them)
    "train": ["simplify", "fold_constants", "cse", "dce", "licm", "merge_slice_grads",
              "share_reshape_copies", "fuse_elementwise", "plan_memory"],
    "inference": ["freeze_state", "simplify", "fold_constants", "cse", "simplify", "dce",
                  "fold_batch_norm", "dce", "licm", "fuse_elementwise", "plan_memory"],
    # the Predictor's list (Config.pass_builder()): inference, then each node given to a
    # kernel provider of the Config's list (`partition`) before the memory plan; `licm`
    # as in "inference", so a served loop computes its invariants once, not per iteration;
    # `fuse_layers` after it: a layer and its epilogue one kernel where numba serves them;
    # `fuse_attention` before the fusion: BERT's self-attention chain one node
    "predictor": ["freeze_state", "simplify", "fold_constants", "cse", "simplify", "dce",
                  "fold_batch_norm", "dce", "licm", "fuse_attention", "fuse_elementwise",
                  "onednn_layout", "partition", "fuse_layers", "plan_memory"],
    # the train pipeline after `distribute` (gradients all-reduced before the update)
    "data_parallel": ["distribute", "simplify", "fold_constants", "cse", "dce", "licm",
                      "merge_slice_grads", "share_reshape_copies", "fuse_elementwise",
                      "plan_memory"],
    "none": [],
}


class PassError(SampanError):
    """A pass failed or left a graph the verifier rejects."""


def register_pass(name: str, fn=None, *, replace: bool = False, options=None,
                  legacy_meta=None, blocks: bool = False):
    """Register `fn` as pass `name` (usable as a decorator).

    `options`: the settings the pass takes, {name: default}; the PassManager calls
    `fn(g, **settings)` with the defaults updated by what its caller set. `legacy_meta`:
    the `graph.meta` key older callers put those settings in (read, with a deprecation
    warning, only when the caller set none). `blocks`: run it on the blocks of
    control-flow nodes too (a pass that keeps a graph's inputs and outputs as they are).

    Example: ``@register_pass("scale", options={"factor": 2.0})`` on ``def scale(g, factor)``"""
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"register_pass({name!r}): options must be a dict of defaults; got "
                         f"{type(options).__name__}")

    def reg(f):
        if name in PASSES and not replace:
            raise ValueError(f"pass {name!r} is registered twice (pass replace=True)")
        PASSES[name] = Pass(name, f, (f.__doc__ or "").strip().split("\n")[0],
                            dict(options or {}), legacy_meta, bool(blocks))
        return f
    return reg(fn) if fn is not None else reg


def unregister_pass(name: str) -> None:
    PASSES.pop(name, None)


def list_passes() -> list:
    """Names of all registered passes."""
    return sorted(PASSES)


def pass_options(name: str) -> dict:
    """The options pass `name` declares, with their defaults."""
    if name not in PASSES:
        raise PassError(f"unknown pass {name!r}; registered: {', '.join(list_passes())}")
    return dict(PASSES[name].options)


def check_options(name: str, options) -> None:
    """Fail, naming the pass and what it takes, when `options` holds a name pass `name`
    does not declare."""
    known = pass_options(name)
    bad = sorted(k for k in options if k not in known)
    if bad:
        takes = ", ".join(f"{k}={v!r}" for k, v in known.items()) or "none"
        raise PassError(f"pass {name!r} has no option {bad[0]!r}; its options: {takes}")


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

    `options`: {pass name: {option: value}} for the passes that declare options (checked
    here). After every pass, in this order: `verify(graph)` (`debug=True` means the IR
    verifier; a callable replaces it) whose failure names the pass that broke the graph
    and those that ran before it; then every hook, `hook(index, name, graph)`. `dump_ir`
    (a callable taking the text, or a directory) is a hook that writes the IR text.
    `wrap_errors=True` also names the pass (and those before it) when a pass raises a
    sampan error of its own; otherwise that error propagates as it is.
    `passes_run` lists the passes of the last `run`, in order.

    Example: ``PassManager(["amp", "dce"], options={"amp": {"dtype": "float16"}}).run(g)``"""

    def __init__(self, passes="train", debug: bool = False, dump_ir=None, *, options=None,
                 verify=None, hooks=(), wrap_errors: bool = False):
        self.passes = pipeline(passes) if isinstance(passes, str) else list(passes)
        self.debug = debug
        self.dump_ir = dump_ir
        self.options = {k: dict(v) for k, v in (options or {}).items()}
        for name, opts in self.options.items():
            check_options(name, opts)
        self.verify = verify
        self.hooks = list(hooks)
        self.wrap_errors = wrap_errors
        self.timings: list = []
        self.passes_run: list = []

    def add_hook(self, hook) -> None:
        """Call `hook(index, name, graph)` after every pass that runs."""
        self.hooks.append(hook)

    def _verifier(self):
        if self.verify is not None:
            return self.verify
        if self.debug:
            from ..ir import verify
            return verify
        return None

    def run(self, g):
        g = g.copy()
        self.timings = []
        self.passes_run = done = []
        check = self._verifier()
        for i, name in enumerate(self.passes):
            p = PASSES.get(name)
            if p is None:
                raise PassError(f"unknown pass {name!r}; registered: {', '.join(list_passes())}")
            opts = self.options.get(name, {})
            t0 = time.perf_counter()
            try:
                out = p(g, **opts)
            except SampanError as e:
                if not self.wrap_errors:
                    raise
                raise PassError(f"pass {name!r} failed: {e}\npasses run before it: "
                                f"{done or 'none'}") from e
            except Exception as e:
                raise PassError(f"pass {name!r} failed ({type(e).__name__}: {e}); passes run "
                                f"before it: {done or 'none'}") from e
            g = out if out is not None else g
            self.timings.append((name, time.perf_counter() - t0))
            if check is not None:
                try:
                    check(g)
                except SampanError as e:
                    raise PassError(f"pass {name!r} left an invalid graph: {e}\n"
                                    f"passes run before it: {done or 'none'}") from None
            done.append(name)
            if self.dump_ir is not None:
                self._dump(i, name, g)
            for hook in self.hooks:
                hook(i, name, g)
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
