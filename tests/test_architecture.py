"""The architecture as a checked contract (../shared/DESIGN.md "Floors"; issue 30).

`lint-imports` (.importlinter, run by `make test`) holds the floors; this file holds what
a layers contract cannot say: no import cycle but the inherent ops <-> tensor <-> autograd
one, no file in sampan/ over 600 lines, nothing below the inference/onnx/deploy floor
reaching the floors above through the root package, and the low utilities and hooks that
let low floors stay low.
"""
from __future__ import annotations

import os
import sys

import pytest

grimp = pytest.importorskip("grimp")

ROOT = "sampan"
PKG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ROOT)
MAX_LINES = 600

# The one inherent cycle: an op makes Tensors, a Tensor's methods and autograd call ops.
# (backends.numba left it when the hand-written loops moved to backends/numba/loops/.)
INHERENT = ("sampan.tensor", "sampan._tensor_methods", "sampan.autograd", "sampan.ops")

# --- cycles being untied elsewhere; remove each entry when its cycle is gone ---
CYCLES_IN_FLIGHT = [
]

# --- not yet untied: cycles inside one package (a package's modules importing each
# other both ways); remove each entry when its cycle is gone ---
CYCLES_INSIDE_A_PACKAGE: list = [
    # the fused kernel generator and its reduction part (kernelgen imports reducegen
    # lazily for reduction bodies): hidden inside the inherent cycle until backends.numba
    # left it
    ("sampan.backends.numba.kernelgen", "sampan.backends.numba.reducegen"),
]

# --- files over the limit, to be split; remove each when it is ---
LONG_FILES_IN_FLIGHT: set = set()

# Floors that may not import the root package `sampan` (its __init__ imports every floor,
# so `import sampan` there would hide an import of a floor above).
BELOW_FEATURES = ("errors", "dtypes", "device", "_alloc", "_atomic", "_buckets", "_events",
                  "_recorder", "_tensorfile", "_threads", "return_types", "tensor",
                  "_tensor_methods", "autograd", "ops", "linalg", "backends", "ir", "passes",
                  "runtime", "nn", "optim", "jit", "data", "io", "amp", "quant", "prune",
                  "utils", "experimental")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(ROOT, include_external_packages=False, cache_dir=None)


def _cycles(graph):
    """The strongly connected components (more than one module) of sampan's import graph,
    the root package and the imports of it left out (it is the facade above every floor)."""
    mods = sorted(m for m in graph.modules if m != ROOT)
    adj = {m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d != ROOT)
           for m in mods}
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    for start in mods:                      # Tarjan's algorithm, iterative
        if start in index:
            continue
        work = [(start, iter(adj[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(adj[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    return comps


def _under(mod, prefixes):
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def test_only_the_inherent_cycle_remains(graph):
    comps = _cycles(graph)
    inherent = [c for c in comps if "sampan.tensor" in c]
    assert len(inherent) == 1
    outside = sorted(m for m in inherent[0] if not _under(m, INHERENT))
    assert outside == [], f"the ops <-> tensor <-> autograd cycle runs through {outside}"
    listed = CYCLES_IN_FLIGHT + CYCLES_INSIDE_A_PACKAGE
    other = [sorted(c) for c in comps if "sampan.tensor" not in c
             and not any(all(_under(m, allowed) for m in c) for allowed in listed)]
    assert other == [], f"import cycles besides ops <-> tensor <-> autograd: {other}"


def test_no_file_over_600_lines():
    long = {}
    for folder, _, files in os.walk(PKG_DIR):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_LINES:
                    long[os.path.relpath(path, PKG_DIR).replace(os.sep, "/")] = n
    unlisted = {p: n for p, n in long.items() if p not in LONG_FILES_IN_FLIGHT}
    assert unlisted == {}, f"files in sampan/ over {MAX_LINES} lines: {unlisted}"


def test_low_floors_do_not_import_the_root_package(graph):
    bad = sorted(m for m in graph.modules if m != ROOT and m.split(".")[1] in BELOW_FEATURES
                 and ROOT in graph.find_modules_directly_imported_by(m))
    assert bad == [], f"`import sampan` below the inference/onnx/deploy floor: {bad}"


def test_every_top_level_module_is_on_a_floor():
    """.importlinter is exhaustive; this names the floor list this file relies on."""
    here = {os.path.splitext(n)[0] for n in os.listdir(PKG_DIR)
            if not n.startswith(("__", ".")) and (n.endswith(".py") or
                                                  os.path.isdir(os.path.join(PKG_DIR, n)))}
    with open(os.path.join(os.path.dirname(PKG_DIR), ".importlinter"), encoding="utf-8") as f:
        text = f.read()
    layers = text.split("layers =", 1)[1].split("\n#", 1)[0].split("unmatched", 1)[0]
    named = {t.strip() for line in layers.splitlines() for t in line.replace("|", ":").split(":")}
    assert here - named == set()


# ----------------------------------------------------------- what keeps low floors low
def test_moved_low_utilities_keep_their_old_paths():
    """The event recorder, the event schema, atomic files and the tensor file layout moved
    below every floor; the old paths name the same module objects (state, monkeypatches)."""
    import sampan
    import sampan._atomic
    import sampan._events
    import sampan._recorder
    import sampan._tensorfile
    from sampan.io import _atomic, _tensorfile
    from sampan.profiler import events, recorder
    assert recorder is sampan._recorder and sampan.profiler.recorder is sampan._recorder
    assert events is sampan._events and events.Event is sampan._recorder.Event
    assert _atomic is sampan._atomic and sys.modules["sampan.io._atomic"] is sampan._atomic
    assert _tensorfile is sampan._tensorfile


def test_openmp_runtime_is_registered_by_the_provider(monkeypatch):
    """`_threads` sits below the providers: it sets the count of the OpenMP runtime that
    oneDNN registered, and of none before."""
    from sampan import _threads

    class Gomp:
        n = None

        def omp_set_num_threads(self, n):
            Gomp.n = n.value

    monkeypatch.setitem(_threads._OMP, "gomp", None)
    _threads._omp_set(3)                         # nothing registered: nothing to set
    _threads.set_openmp_runtime(Gomp())
    _threads._omp_set(2)
    assert Gomp.n == 2


def test_onnx_registers_the_engine_model_builder():
    import numpy as np

    import sampan  # noqa: F401  (imports sampan.onnx, which registers)
    from sampan.backends import onnxruntime as ort_provider
    from sampan.onnx import engine
    from sampan.onnx.export import check_opset
    assert ort_provider._BUILDER == {"model": engine.build_model, "subgraph": engine.subgraph,
                                     "opset": check_opset}
    assert ort_provider.check_opset(None) == check_opset(None)
    g, args = ort_provider.subgraph([((2, 3), np.float32), np.ones(3, np.float32)],
                                    (("add", (0, 1), (), 1),), (2,))
    assert args == {0: "x0"} and [n.op for n in g.nodes] == ["add"]
