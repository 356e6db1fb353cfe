"""sampan.quant: int8 post-training quantisation, weight-only int8 and quantisation-aware
training (issue 19).

- `calibrate(program_or_layer, data_loader, observer=...)`: per-tensor activation ranges
  ("minmax", "percentile", "kl", "mse"); the calibration set is checked first.
- `quantize_program(saved, calibration_data, out_dir, weight_only=False)`: calibrate, run
  the `quantize` + `fuse_quant` passes and write a program `sampan.jit.load` reads: int8
  from layer to layer (issue 31: `qlinear_conv2d` / `qlinear_dense` requantise in their
  epilogue, max-pool / reshape / concat run on int8, the last layer is `qdense`);
  `weight_only=True` stores int8 weights with per-channel scales and computes in float.
- dynamic int8 (no calibration; transformer encoders): the `quantize` pass's option
  `dynamic`, or `Config.set_precision("int8", dynamic=True)` on a Predictor
  (`qdense_dynamic`: int8 weights, activations quantised per row inside the kernel).
- `prepare_qat(model)` / `convert(model)`: fake-quant with straight-through gradients in
  every Linear / Conv2d, then the int8 model.

Example::

    >>> sampan.quant.quantize_program("mlp.sampan", batches, "mlp-int8.sampan")
    >>> y = sampan.jit.load("mlp-int8.sampan")(x)
"""
from .calibrate import Calibration, QuantError, calibrate
from .observers import OBSERVERS
from .program import quantize_graph, quantize_program
from .qat import convert, prepare_qat

__all__ = [
           "OBSERVERS",
           "Calibration",
           "QuantError",
           "calibrate",
           "convert",
           "prepare_qat",
           "quantize_graph",
           "quantize_program",
]
