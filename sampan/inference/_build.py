"""What `create_predictor` does to a loaded graph before compiling it: one PassManager runs
the config's pass list (`Config.pass_builder().enabled_passes()`, which holds the steps of
the runtime and precision settings as registered passes, `sampan.inference.steps`) with
the builder's options, the verifier and the debug dump as the PassManager's hooks.

`plan_memory` is not run here: it needs concrete sizes, so it runs when a program is
compiled for a size (once for a graph without symbolic dims); it is listed, and dumped,
last.

Example::

    >>> g2, ran, plan = optimise(g, cfg, symbolic=False)
    >>> ran == cfg.pass_builder().enabled_passes()
    True
"""
from __future__ import annotations

import os
import re

from ..passes.unfuse import unfuse  # noqa: F401 (its old home: now a registered pass)
from .config import MEMORY_PASS, InferenceError
from .steps import ir_optim_off

_DUMP_FILE = re.compile(r"\d\d+_[A-Za-z0-9_.-]+\.(ir|dot)")
_NOTES = {"unfuse": " (fused nodes expanded into op-table nodes)",
          "amp": " (set_precision('bf16'): the op table's autocast policy)"}


class Dumper:
    """Writes `NN_name.ir` (str(graph)) and `NN_name.dot` (graph.to_dot()) per step; as a
    PassManager hook (`hook(index, name, graph)`) it numbers the steps it is given."""

    def __init__(self, folder):
        self.folder = folder
        self.k = 0
        if folder is None:
            return
        os.makedirs(folder, exist_ok=True)
        for f in os.listdir(folder):          # a previous run's dumps: the list changed
            if _DUMP_FILE.fullmatch(f):
                os.remove(os.path.join(folder, f))

    def hook(self, index, name, g):
        self(name, g, _NOTES.get(name, ""))

    def __call__(self, name, g, note=""):
        if self.folder is None:
            return
        stem = os.path.join(self.folder, f"{self.k:02d}_{name}")
        self.k += 1
        head = f"// after step {self.k - 1}: {name}{note}\n"
        with open(stem + ".ir", "w") as f:
            f.write(head + str(g))
        with open(stem + ".dot", "w") as f:
            f.write(g.to_dot())


def passes_to_run(config) -> list:
    """The passes `create_predictor` runs for `config`, in order (`plan_memory`, when it
    runs, last)."""
    names = config.pass_builder().enabled_passes()
    if not config.ir_optim():
        names = ir_optim_off(config, names)
    rewrites = [n for n in names if n != MEMORY_PASS]
    plan = config.memory_optim_enabled() and (not config.ir_optim() or MEMORY_PASS in names)
    return rewrites + [MEMORY_PASS] * plan


def _verifier(sizes=None):
    from ..ir import verify as _verify
    from ..jit import dynamic as _dyn

    def verify(h):
        """Shape rules check concrete graphs: a symbolic one at `sizes` (the example
        inputs': an image model may run at no size as small as 3), else 3 per symbol."""
        syms = _dyn.symbols_of(h)
        if not syms:
            return _verify(h)
        try:
            c = _dyn.concrete(h, {s: (sizes or {}).get(s, 3) for s in syms})
        except Exception:  # noqa: BLE001 - a broken graph cannot be copied: say what is wrong
            return _verify(h)
        _verify(c)
    return verify


def optimise(g, config, symbolic: bool, options=None, sizes=None):
    """The loaded graph `g` after the config's passes.

    `options`: pass options on top of the builder's (what create_predictor adds, e.g. the
    int8 calibration); `sizes`: {symbol: size} the verifier checks a symbolic graph at
    (default 3 each). Returns (graph, steps run, whether the memory plan runs). A pass
    that raises or leaves a graph the verifier rejects fails here, naming it and the
    passes run before it."""
    from ..passes import PassError, PassManager
    if config.precision() == "bf16" and (config.runtime() == "onnxruntime"
                                         or config.offload_min_subgraph_size()):
        raise InferenceError("create_predictor: set_precision('bf16') cannot be combined with "
                             "onnxruntime (its CPU kernels have no bfloat16 forms); use fp32")
    names = passes_to_run(config)
    plan = MEMORY_PASS in names
    opts = config.pass_builder().options()
    for k, v in (options or {}).items():
        opts.setdefault(k, {}).update(v)
    # the `partition` step of the list gives each node to the first provider of the
    # Config's list that supports it (unless the user set its option on the builder)
    part = opts.setdefault("partition", {})
    if not part.get("providers"):
        part["providers"] = config.get_providers()
    opts.setdefault("onednn_layout", {}).setdefault("providers", part["providers"])
    dump = Dumper(config.ir_debug_dir())
    dump("loaded", g)
    try:
        pm = PassManager([n for n in names if n != MEMORY_PASS], options=opts,
                         verify=_verifier(sizes), hooks=[dump.hook], wrap_errors=True)
        g = pm.run(g)
    except PassError as e:
        raise InferenceError(f"create_predictor: {e}") from e
    done = list(pm.passes_run)
    if plan:
        done.append(MEMORY_PASS)
        if symbolic:
            dump(MEMORY_PASS, g, " (runs per concrete size at compile time)")
        else:
            dump(MEMORY_PASS, PassManager([MEMORY_PASS]).run(g))
    return g, done, plan
