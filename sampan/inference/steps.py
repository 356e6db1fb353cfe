"""The passes that a Config's settings put into its pass list (the Predictor's steps).

Each setting that changes how a program is computed adds registered passes to
`Config.pass_builder()`'s list, where the user sees, moves, turns off or deletes them like
any other pass, and sets their options (`set_option`); the list is what
`create_predictor` runs:

    setting (the runtime a provider list spells: Config.runtime())
                                     passes in the list (options)
    set_runtime("numpy"),            unfuse first; fuse_elementwise removed
      providers without "numba"
    set_runtime("onnxruntime"),      unfuse first; fuse_elementwise removed;
      "onnxruntime" first, no numba  onnxruntime_offload last (min_subgraph_size=1)
    enable_onnxruntime_offload(n),   unfuse first; onnxruntime_offload before
      "onnxruntime" first + numba    fuse_elementwise (min_subgraph_size=n, default 3)
    set_precision("bf16")            unfuse, amp first
    set_precision("int8", ...)       quantize, fuse_quant first (weight_only; the
                                     calibration is set by create_predictor)

A setting changed back takes out the passes it put in (and puts back a fusion pass it
took out); a pass the user added by hand is never taken out. `switch_ir_optim(False)`
runs these steps, `partition` and the memory plan only. The list's `partition` step gives
each node to the first provider of `Config.get_providers()` that supports it
(`node.meta["provider"]`: it changes no node; its `providers` option, when set on the
builder, wins; a list without it leaves the nodes to the jit's global provider list).

Example::

    >>> cfg.set_precision("bf16"); cfg.pass_builder().all_passes()[:2]
    ['unfuse', 'amp']
"""
from __future__ import annotations

UNFUSE, AMP, QUANTIZE, FUSE_QUANT = "unfuse", "amp", "quantize", "fuse_quant"
OFFLOAD = "onnxruntime_offload"
FUSION = "fuse_elementwise"
MEMORY = "plan_memory"
PARTITION = "partition"
LAYOUT = "onednn_layout"                     # after fusion, before the partition
NO_GENERATED = ("numpy", "onnxruntime")      # runtimes that run no generated kernels
FUSION_TAKEN = "-" + FUSION                  # in `owned`: the settings took fusion out


def wanted(config) -> list:
    """The steps `config`'s settings ask for, in the order they go first in the list."""
    rt, prec = config.runtime(), config.precision()
    out = [QUANTIZE, FUSE_QUANT] if prec == "int8" else []
    if rt in NO_GENERATED or prec == "bf16" or config.offload_min_subgraph_size():
        out.append(UNFUSE)
    if prec == "bf16":
        out.append(AMP)
    if rt == "onnxruntime" or config.offload_min_subgraph_size():
        out.append(OFFLOAD)
    return out


def ir_optim_off(config, names) -> list:
    """What runs of `names` with `switch_ir_optim(False)`: the settings' steps (offload
    only for the onnxruntime runtime, as before) and the memory plan."""
    keep = {QUANTIZE, FUSE_QUANT, UNFUSE, AMP, PARTITION, MEMORY}
    if config.runtime() == "onnxruntime":
        keep.add(OFFLOAD)
    return [n for n in names if n in keep]


def sync(config, owned: set, changed: str) -> None:
    """Make `config`'s pass list hold the steps its settings ask for, after setting
    `changed` ("runtime", "offload" or "precision") changed. `owned`: the steps the
    settings put in before (updated); only those are taken out again. Only the options
    of the changed setting are set (an option set on the builder since stays)."""
    b = config.pass_builder()
    want = wanted(config)
    for name in sorted(owned - set(want) - {FUSION_TAKEN}):
        if name in b.all_passes():
            b.delete_pass(name)
        owned.discard(name)
    front = [n for n in want if n != OFFLOAD]
    for i, name in enumerate(front):
        if name not in b.all_passes():
            prev = front[:i]
            passes = b.all_passes()
            at = max([passes.index(p) + 1 for p in prev if p in passes], default=0)
            b.insert_pass(at, name)
            owned.add(name)
    no_gen = config.runtime() in NO_GENERATED
    if no_gen and FUSION in b.all_passes():
        b.delete_pass(FUSION)
        owned.add(FUSION_TAKEN)                  # put back when the runtime is numba
    elif not no_gen and FUSION_TAKEN in owned:
        owned.discard(FUSION_TAKEN)
        if FUSION not in b.all_passes():
            _insert_before(b, FUSION, (LAYOUT, PARTITION, MEMORY))
    if OFFLOAD in want:
        if OFFLOAD not in b.all_passes():
            _insert_before(b, OFFLOAD, (FUSION, LAYOUT, PARTITION, MEMORY))
            owned.add(OFFLOAD)
        if changed in ("runtime", "offload"):
            n = 1 if config.runtime() == "onnxruntime" else config.offload_min_subgraph_size()
            b.set_option(OFFLOAD, min_subgraph_size=n)
    if config.precision() == "int8" and changed == "precision":
        b.set_option(QUANTIZE, weight_only=config.int8_options()[2],
                     dynamic=config.int8_dynamic())


def _insert_before(b, name, anchors) -> None:
    passes = b.all_passes()
    for a in anchors:
        if a in passes:
            b.insert_pass(passes.index(a), name)
            return
    b.append_pass(name)
