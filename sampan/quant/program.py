"""Post-training quantisation of saved programs: calibrate, run the `quantize` (and
`fuse_quant`) passes, and write a program `sampan.jit.load` reads.

The written program keeps the original's calling convention (its arguments and output
structure) but drops the state inputs the graph no longer reads (the float weights that
`freeze_state` had folded into constants), so an int8 program stores its weights once, in
int8: the file is about a quarter of the float program's.

Example::

    >>> sampan.quant.quantize_program("mlp.sampan", batches, "mlp-int8.sampan")
    >>> sampan.jit.load("mlp-int8.sampan")(x)
"""
from __future__ import annotations

import json
import os

import numpy as np

from .. import dtypes as _dt
# the program calibration reads, re-exported (tests and the Predictor name it here)
from .calibrate import (Program, QuantError, calibrate_graph, check_batches,  # noqa: F401
                        load_program)

PASSES_INT8 = ["quantize", "fuse_quant", "dce"]
PASSES_WEIGHT_ONLY = ["quantize", "dce"]


def quantize_graph(g, calibration=None, weight_only=False, debug=True):
    """`g` with int8 weights (and calibrated int8 activations unless `weight_only`)."""
    from ..passes import PassManager
    opts = {"quantize": {"acts": {} if calibration is None else calibration.acts,
                         "weight_only": weight_only}}
    return PassManager(PASSES_WEIGHT_ONLY if weight_only else PASSES_INT8, debug=debug,
                       options=opts).run(g)


def calibrator(src, calibration_data, observer="minmax"):
    """The `calibrate` option of the `quantize` pass for program `src` (a saved directory,
    a loaded program or a Program): a function that calibrates the graph it is given (the
    program's graph after the passes before `quantize`, same inputs) on
    `calibration_data`, checked here first. Example: see `sampan.inference.Config`."""
    prog = load_program(src)
    feeds = [prog.feeds(b) for b in check_batches(calibration_data, prog.arg_specs(),
                                                  prog.path)]

    def calibrate(g):
        return calibrate_graph(g, feeds, observer).acts
    return calibrate


def quantize_program(saved_dir_or_graph, calibration_data, out_dir, observer="minmax",
                     weight_only=False):
    """Post-training int8 quantisation of a saved program, written to `out_dir`.

    `calibration_data`: an iterable of batches (an array, or a tuple of arrays, one per
    program argument; None with `weight_only=True`); `observer`: "minmax", "percentile",
    "kl" or "mse"; `weight_only`: int8 weights with per-channel scales, activations left
    in float (no calibration needed). Returns `out_dir`.

    Example: ``sampan.quant.quantize_program("m.sampan", batches, "m-int8.sampan")``"""
    prog = load_program(saved_dir_or_graph)
    cal = None
    if not weight_only:
        batches = check_batches(calibration_data, prog.arg_specs(), prog.path)
        cal = calibrate_graph(prog.graph, [prog.feeds(b) for b in batches], observer)
    elif calibration_data is not None:     # not used, but checked: a bad set is an error
        check_batches(calibration_data, prog.arg_specs(), prog.path)
    g = quantize_graph(prog.graph, cal, weight_only)
    example = None
    if "example.0" not in prog.arrays and calibration_data is not None:
        example = check_batches(calibration_data, prog.arg_specs(), prog.path)[0]
    return write_program(prog, g, out_dir, example)


def write_program(prog, g, out_dir, example=None):
    """Write graph `g` (a rewrite of `prog.graph` with the same arguments) as a saved
    program, dropping state inputs it does not read. Returns `out_dir`."""
    from ..io import _tensorfile as _tf
    from ..jit.serialize import write_dir
    read_ids = {v.id for n in g.nodes for v in n.inputs} | {v.id for v in g.outputs}
    keep = [i for i, (spec, v) in enumerate(zip(prog.meta["inputs"], g.inputs))
            if spec["kind"] == "arg" or v.id in read_ids]
    g = g.copy()
    g.inputs = [g.inputs[i] for i in keep]
    g.prune_consts()
    for k in ("frozen", "quantized"):
        g.meta.pop(k, None)
    meta = dict(prog.meta)
    meta["inputs"] = [prog.meta["inputs"][i] for i in keep]
    arrays = {}
    for spec in meta["inputs"]:
        if spec["kind"] != "arg":
            arrays[spec["key"]] = prog.arrays[spec["key"]]
    text = str(g)
    for c in g.consts:
        if c.name is not None and f"ref={c.name!r}" in text:
            arrays[f"const.{c.name}"] = c.const
    for k, a in prog.arrays.items():
        if k.startswith(("example.", "outconst.")):
            arrays[k] = a
    if example is not None:
        for i, a in enumerate(example):
            arrays[f"example.{i}"] = a
    arrays = {k: _tf.contiguous(np.asarray(a)) for k, a in arrays.items()}
    meta["dtypes"] = {k: _dt.dtype_name(a.dtype) for k, a in arrays.items()}
    files = {"graph.ir": text.encode("utf-8"),
             "meta.json": json.dumps(meta, indent=1).encode("utf-8")}
    return write_dir(os.fspath(out_dir), files, arrays)
