"""Runtime: compile a Graph into straight-line Python over backend kernels, with a
memory plan that reuses buffers.

Example::

    >>> from sampan.runtime import compile_graph
    >>> c = compile_graph(graph); print(c.code); outs = c(*input_arrays)
"""
from .codegen import Compiled, RuntimeCheckError, compile_graph
from .memory import plan as plan_memory
from . import memory as _memory

_memory.register()          # the plan_memory pass: the runtime reads the plan it stores

__all__ = ["Compiled", "compile_graph", "plan_memory", "RuntimeCheckError"]
