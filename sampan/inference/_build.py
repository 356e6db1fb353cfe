"""What `create_predictor` does to a loaded graph before compiling it: the runtime's own
rewrite (the numpy runtime expands fused nodes back into their op-table nodes), the
configured passes with the verifier after each, and the debug dumps.

`plan_memory` is not run here: it needs concrete sizes, so it runs when a program is
compiled for a size (once for a graph without symbolic dims)."""
from __future__ import annotations

import os
import re

from ..errors import SampanError
from .config import MEMORY_PASS, OFFLOAD_PASS, InferenceError

FUSION_PASSES = ("fuse_elementwise",)       # passes that ask for generated kernels
AMP_PASS = "amp"                            # set_precision("bf16")
_DUMP_FILE = re.compile(r"\d\d+_[A-Za-z0-9_.-]+\.(ir|dot)")


def unfuse(g):
    """Replace every `fused` node by the nodes of its body (op-table kernels only).

    Example: ``g2 = unfuse(g.copy())`` runs under the numpy runtime without numba."""
    from ..ops.fused import body_attrs
    new_nodes, rep = [], {}
    for n in list(g.nodes):
        n.inputs = [rep.get(v.id, v) for v in n.inputs]
        if n.op != "fused":
            new_nodes.append(n)
            continue
        vals = list(n.inputs)
        for e in n.attrs["body"]:
            made = g.add_node(e[0], [vals[i] for i in e[1]], body_attrs(e), loc=n.loc)
            g.nodes.pop()                  # placed where the fused node was, below
            new_nodes.append(made)
            vals.append(made.outputs[0])
        for out, k in zip(n.outputs, n.attrs["outputs"]):
            r = vals[k]
            if (tuple(r.shape), r.dtype) != (tuple(out.shape), out.dtype):
                raise InferenceError(f"unfuse: body result {k} of the fused node at "
                                     f"{n.loc or '?'} is {r.type_str()}, the node says "
                                     f"{out.type_str()}")
            rep[out.id] = r
    g.nodes = new_nodes
    g.outputs = [rep.get(v.id, v) for v in g.outputs]
    return g


class Dumper:
    """Writes `NN_name.ir` (str(graph)) and `NN_name.dot` (graph.to_dot()) per step."""

    def __init__(self, folder):
        self.folder = folder
        self.k = 0
        if folder is None:
            return
        os.makedirs(folder, exist_ok=True)
        for f in os.listdir(folder):          # a previous run's dumps: the list changed
            if _DUMP_FILE.fullmatch(f):
                os.remove(os.path.join(folder, f))

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


def optimise(g, config, symbolic: bool):
    """The loaded graph `g` after the runtime's rewrite and the configured passes.

    Returns (graph, steps run). A pass that raises or leaves a graph the verifier rejects
    fails here, naming it and the passes run before it."""
    from ..ir import verify as _verify
    from ..jit import dynamic as _dyn
    from ..passes import PASSES

    def verify(h):
        """Shape rules check concrete graphs: a symbolic one at a size of 3 per symbol."""
        syms = _dyn.symbols_of(h)
        if not syms:
            return _verify(h)
        try:
            c = _dyn.concrete(h, {s: 3 for s in syms})
        except Exception:  # noqa: BLE001 - a broken graph cannot be copied: say what is wrong
            return _verify(h)
        _verify(c)
    dump = Dumper(config.ir_debug_dir())
    g = g.copy()
    done = []
    dump("loaded", g)
    ort = config.runtime() == "onnxruntime"
    if config.precision() == "bf16" and (ort or config.offload_min_subgraph_size()):
        raise InferenceError("create_predictor: set_precision('bf16') cannot be combined with "
                             "onnxruntime (its CPU kernels have no bfloat16 forms); use fp32")
    no_gen = config.runtime() in ("numpy", "onnxruntime")
    bf16 = config.precision() == "bf16"
    if ort or config.offload_min_subgraph_size():     # the options the offload pass reads
        g.meta["onnxruntime_offload"] = {
            "min_subgraph_size": 1 if ort else config.offload_min_subgraph_size()}
    # the offload pass partitions plain ops (a fused node with one op onnxruntime lacks
    # would keep all of its ops out); fuse_elementwise after it fuses what stays sampan
    if (no_gen or bf16 or config.offload_min_subgraph_size()) and any(n.op == "fused"
                                                                      for n in g.nodes):
        g = _step("unfuse", unfuse, g, done, verify)
        done.append("unfuse")
        dump("unfuse", g, " (no generated kernels: numpy runtime)" if no_gen else
             " (bf16: the amp pass places casts between op-table nodes)" if bf16 else
             " (for onnxruntime_offload; fuse_elementwise fuses what stays sampan)")
    if bf16:     # first, so that simplify, fold_constants and fusion fold its casts
        from ..passes import PASSES
        g = _step(AMP_PASS, PASSES[AMP_PASS], g, done, verify)
        done.append(AMP_PASS)
        dump(AMP_PASS, g, " (set_precision('bf16'): the op table's autocast policy)")
    names = config.pass_builder().enabled_passes() if config.ir_optim() else []
    for name in names:
        if name == MEMORY_PASS:
            continue                       # at compile time, per concrete size
        if no_gen and name in FUSION_PASSES:
            continue
        p = PASSES.get(name)
        if p is None:                      # unregistered after it was added
            raise InferenceError(f"create_predictor: pass {name!r} is no longer registered; "
                                 f"passes run before it: {done or 'none'}")
        g = _step(name, p, g, done, verify)
        done.append(name)
        dump(name, g)
    if ort and OFFLOAD_PASS not in names:    # the onnxruntime runtime: everything it runs
        g = _step(OFFLOAD_PASS, PASSES[OFFLOAD_PASS], g, done, verify)
        done.append(OFFLOAD_PASS)
        dump(OFFLOAD_PASS, g, " (the onnxruntime runtime: every supported node)")
    # each node to the first provider of the list that supports it: the partition pass's
    # assignment (node.meta only: the graph's text, the dumps and the steps listed stay
    # those above; the offload it would do is the configured offload step above)
    from ..passes.partition import assign
    g.meta["providers"] = config.get_providers()
    g.meta["partition"] = assign(g, g.meta["providers"])
    plan = config.memory_optim_enabled() and (
        not config.ir_optim() or MEMORY_PASS in names)
    if plan:
        done.append(MEMORY_PASS)
        note = " (runs per concrete size at compile time)" if symbolic else ""
        if symbolic:
            dump(MEMORY_PASS, g, note)
        else:
            from ..passes import PassManager
            dump(MEMORY_PASS, PassManager([MEMORY_PASS]).run(g), note)
    return g, done, plan


def _step(name, fn, g, done, verify):
    try:
        out = fn(g)
    except SampanError as e:
        raise InferenceError(f"create_predictor: pass {name!r} failed: {e}\npasses run "
                             f"before it: {done or 'none'}") from e
    except Exception as e:
        raise InferenceError(f"create_predictor: pass {name!r} failed ({type(e).__name__}: "
                             f"{e}); passes run before it: {done or 'none'}") from e
    g = out if out is not None else g
    try:
        verify(g)
    except SampanError as e:
        raise InferenceError(f"create_predictor: pass {name!r} left an invalid graph: {e}\n"
                             f"passes run before it: {done or 'none'}") from None
    return g
