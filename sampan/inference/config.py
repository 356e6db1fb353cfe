"""`Config`: what a Predictor loads and how it optimises and runs it (Paddle Inference's
AnalysisConfig, in Python names), and `PassBuilder`, the editable pass pipeline.

The pipeline starts as the "inference" pipeline of `sampan.passes` (which ends with
`plan_memory`). The saved program was already optimised when it was saved; running the
passes again at load is cheap and lets a user add, move or drop passes without saving
again. Every edit is checked at once: an unknown pass name fails at the edit, naming it.

The list is what `create_predictor` runs, in order: the runtime and precision settings
put their steps into it as registered passes (`unfuse`, `amp`, `quantize`, `fuse_quant`,
`onnxruntime_offload`: see `sampan.inference.steps`), and pass options are set on the
builder (`set_option`), which hands them to the PassManager. The one exception is
`plan_memory`: it needs concrete sizes, so it runs last, per compiled size.

Example::

    >>> cfg = sampan.inference.Config("mlp.sampan")
    >>> cfg.pass_builder().delete_pass("cse"); cfg.switch_ir_debug("/tmp/ir")
    >>> cfg.enable_onnxruntime_offload()        # onnxruntime_offload joins the list
    >>> cfg.pass_builder().set_option("onnxruntime_offload", min_subgraph_size=5)
    >>> p = sampan.inference.create_predictor(cfg)
    >>> p.passes_run == cfg.pass_builder().enabled_passes()
    True
"""
from __future__ import annotations

import os

from ..errors import SampanError

RUNTIMES = ("numpy", "numba", "onnxruntime")
# the provider list each runtime name spells (`set_runtime`, kept for old code)
RUNTIME_PROVIDERS = {"numba": ["onednn", "numba", "numpy"], "numpy": ["onednn", "numpy"],
                     "onnxruntime": ["onnxruntime", "onednn", "numpy"]}
PRECISIONS = ("fp32", "bf16", "int8")
MEMORY_PASS = "plan_memory"


class InferenceError(SampanError):
    """A Predictor was configured or fed wrongly (names the input, pass or option)."""


class NotAvailableError(InferenceError):
    """An option whose implementation is not in sampan yet."""


OFFLOAD_PASS = "onnxruntime_offload"


class PassBuilder:
    """The passes `create_predictor` runs on the loaded graph, in order.

    Edits: `append_pass(name)`, `insert_pass(index, name)`, `delete_pass(name or index)`
    (every occurrence of a name), `turn_off(name)` (kept in the list, skipped; `turn_on`
    undoes it). `all_passes()` lists every pass, `enabled_passes()` those that run.
    `plan_memory` needs concrete sizes, so wherever it sits it runs last, when a program is
    compiled for a set of input shapes. Options: `set_option(name, **values)` for the
    options pass `name` declares at registration (`sampan.passes.pass_options(name)`),
    `get_option(name, key)`, `options()`.

    Example: ``cfg.pass_builder().insert_pass(0, "cse")``"""

    def __init__(self, passes):
        self._passes = list(passes)
        self._off: set = set()
        self._options: dict = {}

    @staticmethod
    def _known(name, edit):
        from ..passes import PASSES, list_passes
        if not isinstance(name, str) or name not in PASSES:
            raise InferenceError(f"PassBuilder.{edit}: unknown pass {name!r}; registered "
                                 f"passes: {', '.join(list_passes())}")

    def append_pass(self, name: str) -> None:
        """Run pass `name` last."""
        self._known(name, "append_pass")
        self._passes.append(name)

    def insert_pass(self, index: int, name: str) -> None:
        """Run pass `name` at position `index` of the list (as list.insert)."""
        self._known(name, "insert_pass")
        if isinstance(index, bool) or not isinstance(index, int):
            raise InferenceError(f"PassBuilder.insert_pass: index must be an int; got "
                                 f"{index!r}")
        self._passes.insert(index, name)

    def delete_pass(self, name_or_index) -> None:
        """Remove every occurrence of a pass name, or the pass at an index."""
        if isinstance(name_or_index, int) and not isinstance(name_or_index, bool):
            n = len(self._passes)
            if not -n <= name_or_index < n:
                raise InferenceError(f"PassBuilder.delete_pass: index {name_or_index} is "
                                     f"outside the {n} passes {self._passes}")
            del self._passes[name_or_index]
            return
        if name_or_index not in self._passes:
            raise InferenceError(f"PassBuilder.delete_pass: pass {name_or_index!r} is not in "
                                 f"the pipeline {self._passes}")
        self._passes = [p for p in self._passes if p != name_or_index]

    def turn_off(self, name: str) -> None:
        """Keep pass `name` in the list but skip it (every occurrence)."""
        if name not in self._passes:
            raise InferenceError(f"PassBuilder.turn_off: pass {name!r} is not in the "
                                 f"pipeline {self._passes}")
        self._off.add(name)

    def turn_on(self, name: str) -> None:
        """Undo `turn_off(name)`."""
        self._off.discard(name)

    def all_passes(self) -> list:
        """Every pass of the list, turned off or not."""
        return list(self._passes)

    def enabled_passes(self) -> list:
        """The passes that run, in order."""
        return [p for p in self._passes if p not in self._off]

    def is_turned_off(self, name: str) -> bool:
        return name in self._off

    def set_option(self, name: str, **values) -> None:
        """Set options of pass `name` (those it declares at registration; an unknown pass
        or option fails here, naming what the pass takes). They reach the pass wherever
        it sits in the list. Example: ``b.set_option("amp", dtype="float16")``"""
        from ..passes.manager import PassError, check_options
        self._known(name, "set_option")
        try:
            check_options(name, values)
        except PassError as e:
            raise InferenceError(f"PassBuilder.set_option: {e}") from None
        self._options.setdefault(name, {}).update(values)

    def get_option(self, name: str, key: str):
        """The value pass `name` gets for option `key`: the one set, else its default."""
        from ..passes import pass_options
        self._known(name, "get_option")
        declared = pass_options(name)
        if key not in declared:
            raise InferenceError(f"PassBuilder.get_option: pass {name!r} has no option "
                                 f"{key!r}; its options: {sorted(declared) or 'none'}")
        return self._options.get(name, {}).get(key, declared[key])

    def options(self) -> dict:
        """{pass name: {option: value}} of the options set (as `PassManager(options=)`)."""
        return {k: dict(v) for k, v in self._options.items()}

    def copy(self) -> "PassBuilder":
        b = PassBuilder(self._passes)
        b._off = set(self._off)
        b._options = self.options()
        return b

    def __repr__(self):
        marks = [p + (" (off)" if p in self._off else "") for p in self._passes]
        return f"PassBuilder([{', '.join(marks)}])"


class Config:
    """How to load, optimise and run a program saved by `sampan.jit.save`.

    Defaults: the "inference" pass pipeline, the memory plan on, the providers
    ["onednn", "numba", "numpy"] (fused kernels), fp32. Nothing is read from `model_dir` until `create_predictor`.

    Example::

        >>> cfg = Config("cnn.sampan"); cfg.set_providers(["numpy"]); cfg.set_num_threads(1)
    """

    def __init__(self, model_dir):
        from ..passes import pipeline
        self.model_dir = os.fspath(model_dir)
        names = pipeline("predictor")
        self._builder = PassBuilder(names + [MEMORY_PASS] * (MEMORY_PASS not in names))
        self._ir_optim = True
        self._memory_optim = True
        self._debug_dir = None
        self._threads = None
        self._providers = list(RUNTIME_PROVIDERS["numba"])
        self._precision = "fp32"
        self._offload = None          # min_subgraph_size of enable_onnxruntime_offload
        self._steps: set = set()      # the passes the settings put in the list (steps.py)

    # ------------------------------------------------------------ optimisation
    def pass_builder(self) -> PassBuilder:
        """The editable pass list (see `PassBuilder`)."""
        return self._builder

    def switch_ir_optim(self, on: bool = True) -> None:
        """Run the pass list (True, the default) or only the steps of the runtime and
        precision settings in it (`sampan.inference.steps`: unfuse, amp, quantize ...) and
        the memory plan."""
        self._ir_optim = bool(on)

    def ir_optim(self) -> bool:
        return self._ir_optim

    def enable_memory_optim(self) -> None:
        """Plan intermediate buffers once and reuse them on every call (the default)."""
        self._memory_optim = True

    def disable_memory_optim(self) -> None:
        """Let every intermediate be a fresh array (no `plan_memory`)."""
        self._memory_optim = False

    def memory_optim_enabled(self) -> bool:
        return self._memory_optim

    def switch_ir_debug(self, dir=None) -> None:
        """Write the graph as text (`NN_pass.ir`) and DOT (`NN_pass.dot`) after every pass
        that runs, numbered in order, into `dir` (None or False: off)."""
        self._debug_dir = os.fspath(dir) if dir not in (None, False) else None

    def ir_debug_dir(self):
        return self._debug_dir

    # ------------------------------------------------------------ execution
    def set_num_threads(self, n: int) -> None:
        """CPU threads for numba kernels and BLAS (`sampan.set_num_threads`, applied when
        the predictor is created; the setting is process-wide)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InferenceError(f"Config.set_num_threads: got {n!r}; expected a positive int")
        self._threads = n

    def num_threads(self):
        return self._threads

    def set_providers(self, names) -> None:
        """The kernel providers, in order of preference, as onnxruntime's `providers=`:
        the partition pass gives each node to the first one that supports it
        (`sampan.backends`; "numpy", which supports every op, is added last when missing).
        Default ["onednn", "numba", "numpy"]: oneDNN for GEMM/convolution/pooling where it
        is measured faster on this machine, generated fused kernels, the op table's
        kernels for the rest. Without "numba" no kernel is generated: fused nodes of the
        saved graph are expanded back into their ops and the fusion passes are skipped.
        "onnxruntime" first offloads what onnxruntime supports: with "numba" in the list
        as `enable_onnxruntime_offload` does (subgraphs of at least its
        `min_subgraph_size`, default 3, the `onnxruntime_offload` pass in the pass list,
        the rest fused), without it every supported node (as `set_runtime("onnxruntime")`).

        Example: ``cfg.set_providers(["onnxruntime", "onednn", "numpy"])``"""
        from ..backends.provider import ProviderError, check_order
        try:
            order = check_order(names, "Config.set_providers")
        except ProviderError as e:
            raise InferenceError(str(e)) from None
        self._providers = order
        if order[0] == "onnxruntime" and "numba" in order:
            self._offload_pass(self._offload or 3)
            return
        if order[0] != "onnxruntime":
            self._offload = None
            if OFFLOAD_PASS in self._builder.all_passes():
                self._builder.turn_off(OFFLOAD_PASS)
        self._sync("runtime")             # the steps of the runtime the list spells

    def get_providers(self) -> list:
        """The provider list (see `set_providers`)."""
        return list(self._providers)

    def set_runtime(self, name: str) -> None:
        """Deprecated spelling of a provider list (`set_providers`), kept working:
        "numba" (default) is ["onednn", "numba", "numpy"]: generated fused kernels;
        "numpy" is ["onednn", "numpy"]: no fusion, fused nodes of the saved graph are
        expanded back into their ops and every node runs its op-table kernel, as eager
        does (those kernels keep their own hand-written loops, e.g. conv2d's);
        "onnxruntime" is ["onnxruntime", "onednn", "numpy"]: fused nodes are expanded as
        for "numpy", the configured passes run without fusion, then
        `onnxruntime_offload` with a minimum subgraph size of 1 puts every node
        onnxruntime supports into engine nodes; the nodes it does not support run their
        op-table kernels (see `sampan.passes.offload`). These are passes in the pass
        list: "numpy" and "onnxruntime" put `unfuse` first and take `fuse_elementwise`
        out, "onnxruntime" adds `onnxruntime_offload` before `plan_memory` (see
        `sampan.inference.steps`)."""
        if name not in RUNTIMES:
            raise InferenceError(f"Config.set_runtime: unknown runtime {name!r}; expected "
                                 f"one of {', '.join(RUNTIMES)}")
        self._providers = list(RUNTIME_PROVIDERS[name])
        if self._offload is not None and name != "onnxruntime":
            self._providers.insert(0, "onnxruntime")   # enable_onnxruntime_offload: kept
        self._sync("runtime")

    def _sync(self, changed) -> None:
        from .steps import sync
        sync(self, self._steps, changed)

    def runtime(self) -> str:
        """The runtime name the provider list spells: "onnxruntime" (onnxruntime first,
        no generated kernels), "numba" (generated kernels) or "numpy"."""
        p = self._providers
        if p[0] == "onnxruntime" and "numba" not in p:
            return "onnxruntime"
        return "numba" if "numba" in p else "numpy"

    def enable_onnxruntime_offload(self, min_subgraph_size: int = 3) -> None:
        """Deprecated spelling of "onnxruntime" first in the provider list
        (`set_providers`), kept working: run connected subgraphs of at least
        `min_subgraph_size` nodes that onnxruntime supports as onnxruntime sessions
        (engine nodes); the rest stays sampan. Adds the `onnxruntime_offload` pass to the
        pass list before `fuse_elementwise` (or last), where it can be moved or turned
        off like any pass; the report of what was offloaded and what fell back, and why,
        is `predictor.graph.meta["offload_report"]`."""
        if isinstance(min_subgraph_size, bool) or not isinstance(min_subgraph_size, int) \
                or min_subgraph_size < 1:
            raise InferenceError(f"Config.enable_onnxruntime_offload: min_subgraph_size must "
                                 f"be a positive int; got {min_subgraph_size!r}")
        if self._providers[0] != "onnxruntime":
            self._providers.insert(0, "onnxruntime")
        self._offload_pass(min_subgraph_size)

    def _offload_pass(self, min_subgraph_size):
        self._offload = min_subgraph_size
        self._sync("offload")
        self._builder.turn_on(OFFLOAD_PASS)

    def offload_min_subgraph_size(self):
        """The `enable_onnxruntime_offload` setting (None: not enabled)."""
        return self._offload

    def set_precision(self, precision: str, calibration_data=None, observer="minmax",
                      weight_only=False, dynamic=False) -> None:
        """"fp32" (default); "bf16": mixed precision by the op table's autocast policy
        (the `amp` pass, run first: matmuls and convolutions in bfloat16 with bfloat16
        weights, softmax/norms/reductions in float32, elementwise ops following their
        inputs; the casts folded into fused kernels; inputs and outputs stay float32);
        "int8": `sampan.quant`'s post-training quantisation of the program at
        `create_predictor`, calibrated on `calibration_data` (batches of the program's
        inputs) with `observer`, or weight-only int8 (`weight_only=True`, no data needed).
        A program that is already int8 (written by `sampan.quant.quantize_program`) is
        served as it is. The steps are passes in the pass list: "bf16" puts `unfuse` and
        `amp` first, "int8" `quantize` and `fuse_quant` (option `weight_only` set here; the
        calibration is `quantize`'s `calibrate` option, set by `create_predictor`).
        "int8" with `dynamic=True` (no data needed): dynamic quantisation, as
        onnxruntime's quantize_dynamic, for transformer encoders: every matmul by a
        constant weight runs on int8 weights with the activations quantised per row inside
        the kernel (`qdense_dynamic`; the `quantize` pass's option `dynamic`)."""
        if precision not in PRECISIONS:
            raise InferenceError(f"Config.set_precision: unknown precision {precision!r}; "
                                 f"expected one of {', '.join(PRECISIONS)}")
        if precision == "int8":
            from ..quant import OBSERVERS
            if observer not in OBSERVERS:
                raise InferenceError(f"Config.set_precision: unknown observer {observer!r}; "
                                     f"expected one of {', '.join(OBSERVERS)}")
        if dynamic and (weight_only or calibration_data is not None):
            raise InferenceError("Config.set_precision: dynamic=True quantises activations "
                                 "when the model runs; it takes no calibration_data and "
                                 "no weight_only")
        self._int8 = (calibration_data, observer, bool(weight_only))
        self._int8_dynamic = bool(dynamic) and precision == "int8"
        self._precision = precision
        self._sync("precision")

    def int8_options(self):
        """(calibration_data, observer, weight_only) given with set_precision("int8")."""
        return getattr(self, "_int8", (None, "minmax", False))

    def int8_dynamic(self) -> bool:
        """Whether set_precision("int8", dynamic=True) was given."""
        return getattr(self, "_int8_dynamic", False)

    def precision(self) -> str:
        return self._precision

    def copy(self) -> "Config":
        c = Config.__new__(Config)
        c.__dict__.update(self.__dict__)
        c._providers = list(self._providers)
        c._builder = self._builder.copy()
        c._steps = set(self._steps)
        return c

    def summary(self) -> str:
        """The settings, one a line."""
        rows = [("model_dir", self.model_dir),
                ("ir_optim", self._ir_optim),
                ("passes", self._builder.enabled_passes() if self._ir_optim else []),
                ("turned off", sorted(self._builder._off)),
                ("pass options", self._builder.options()),
                ("memory_optim", self._memory_optim),
                ("ir_debug", self._debug_dir),
                ("num_threads", self._threads),
                ("runtime", self.runtime()),
                ("providers", self._providers),
                ("ort_offload", self._offload),
                ("precision", self._precision)]
        return "\n".join(f"{k:<13} {v}" for k, v in rows)

    def __repr__(self):
        return f"Config({self.model_dir!r}, providers={self._providers!r})"
