"""sampan.jit: trace eager code into the Graph IR, optimise it, run generated code.

`sampan.jit(fn)` / `@sampan.jit` / `sampan.jit(layer)` compile per input signature, guard
the Python values and objects a trace read (`guards.py`: changing one traces again), and
are differentiable from outside (`autodiff.py`: the gradient is traced and compiled too),
and return outputs that share memory and versions where eager's would (`outputs.py`);
`sampan.jit.save(fn_or_layer, path, example_inputs)` and `sampan.jit.load(path)`
store and restore a compiled program without its Python source (`program.SavedProgram`
is the one reader of a saved program's folder); `dynamic=` on both marks
dims (batch, sequence) whose size varies, so one program serves every size (`dynamic.py`).
"""
import sys as _sys
import types as _types

from ..passes.bisect import register_front as _bisect_front
from . import blocks as _blocks  # noqa: F401  (control flow; hands ops.control the Graph)
from . import serialize as _serialize
from . import tracing as _tracing
from .api import JitFunction, RetraceWarning, jit, trace
from .program import Loaded, SavedProgram, load
from .serialize import LoadError, save
from .tracer import Tracer, TracingError

_serialize.load, _serialize.Loaded = load, Loaded     # their old home's names


def _run_graph(g, arrays, use_plan=True):
    from ..runtime import compile_graph
    return compile_graph(g, use_plan=use_plan)(*arrays)


_bisect_front(_run_graph, _tracing.traced_call)   # passes/ calls up only through this hook

__all__ = ["jit", "JitFunction", "trace", "Tracer", "TracingError", "RetraceWarning", "save",
           "load", "LoadError", "SavedProgram"]


class _CallableModule(_types.ModuleType):
    """`sampan.jit` is both this package and the decorator: ``@sampan.jit``."""

    def __call__(self, fn=None, **kw):
        return jit(fn, **kw)


_sys.modules[__name__].__class__ = _CallableModule
