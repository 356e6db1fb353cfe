"""Memory planning as a pass: stores the buffer plan in `graph.meta["memory_plan"]`
(see `sampan.runtime.memory`) for the code generator to use."""
from __future__ import annotations

from ..runtime.memory import plan
from .manager import register_pass


@register_pass("plan_memory")
def plan_memory(g):
    """Assign intermediate values to reusable buffers (liveness + escape analysis)."""
    g.meta["memory_plan"] = plan(g)
    return g
