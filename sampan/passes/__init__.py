"""Graph passes: plug-ins registered by name, run in named pipelines.

Adding a pass: one module here with `@register_pass("name")` (its settings declared there:
`options={"k": default}`) and one import line below. Example::

    >>> from sampan import passes
    >>> passes.list_passes(); passes.pipeline("inference")
    >>> g2 = passes.PassManager(["cse", "dce"], debug=True).run(g)
    >>> passes.pass_options("amp")                 # {'dtype': 'bfloat16'}
    >>> passes.bisect(fn, (x,))          # which pass changes the outputs?
"""
from .manager import (PASSES, PIPELINES, Pass, PassError, PassManager, list_passes,
                      pass_options, pipeline, register_pass, set_pipeline, unregister_pass)
from . import (cse, dce, fold_constants, fuse, inference, simplify,  # noqa: F401,E402
               slice_grads)
from . import fuse_quant, quantize  # noqa: F401,E402  (issue 19: int8)
from . import offload  # noqa: F401,E402
from . import distribute  # noqa: F401,E402  (issue 23: data parallel)
from . import amp  # noqa: F401,E402  (issue 22: mixed precision)
from . import partition  # noqa: F401,E402  (issue 30: kernel providers)
from . import unfuse  # noqa: F401,E402  (issue 30: the Predictor's steps are passes)
from . import licm  # noqa: F401,E402  (issue 34: loop-invariant code motion)
from . import onednn_layout  # noqa: F401,E402  (issue 31: convs in oneDNN's layouts)
from . import fuse_layers  # noqa: F401,E402  (issue 31: a served layer and its epilogue)
from . import fuse_attention  # noqa: F401,E402  (issue 31: BERT's self-attention, one node)
from .bisect import BisectResult, bisect, bisect_graph  # noqa: E402
# `plan_memory` is registered by sampan.runtime.memory, whose plan the code generator reads

__all__ = ["Pass", "PASSES", "PIPELINES", "PassError", "PassManager", "register_pass",
           "unregister_pass", "list_passes", "pass_options", "pipeline", "set_pipeline", "bisect",
           "bisect_graph", "BisectResult"]
