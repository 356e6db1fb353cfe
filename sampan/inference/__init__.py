"""Serving saved programs: `Config` (passes, runtime, precision, threads), and
`create_predictor` giving a `Predictor` with zero-copy input and output handles.

The pass list `Config.pass_builder()` shows is the list `create_predictor` runs: the
runtime and precision settings put their steps (unfuse, amp, quantize, fuse_quant,
onnxruntime_offload) into it as passes (`sampan.inference.steps`), and pass options are
set on the builder (`set_option`).

Example::

    >>> from sampan import inference
    >>> cfg = inference.Config("mlp.sampan"); cfg.pass_builder().turn_off("cse")
    >>> p = inference.create_predictor(cfg)
    >>> p.get_input_handle("x").share_external_data(x); p.run()
    >>> y = p.get_output_handle("output_0").copy_to_cpu()
"""
from .config import Config, InferenceError, NotAvailableError, PassBuilder
from .predictor import InputHandle, OutputHandle, Predictor, create_predictor

__all__ = ["Config", "PassBuilder", "Predictor", "InputHandle", "OutputHandle",
           "create_predictor", "InferenceError", "NotAvailableError"]
