"""`sampan.onnx`: ONNX interchange.

- `to_layer(path_or_model)`: an ONNX model as a trainable `nn.Layer` (initializers become
  Parameters; fine-tune it, jit it, save it); `load(path_or_model)`: its `Graph` IR. A model
  given as bytes or a ModelProto whose weights live in external files needs `base_dir=`.
  Importing allocates what the file paid for: folding is bounded (`sampan/onnx/fold.py`)
  and `load` and `sampan onnx import` trace without making inputs of the declared sizes.
- `export(fn_or_layer, example_inputs, path, ...)`: a traced program written as ONNX.
- `OnnxError`: what a model sampan cannot read or write raises.

The import table (`sampan/onnx/ops/`) maps ONNX op types onto sampan ops per opset; export
lowers each op of the op table through its ONNX mapping. Needs the `onnx` extra.
"""
from .export import export  # export: writes a traced program as an ONNX model
from .importer import OnnxModule, load, to_layer
from .ops import OnnxError, supported
from . import engine as _engine  # noqa: F401,E402  (registers the engine-body builder)

__all__ = ["OnnxError", "OnnxModule", "export", "load", "to_layer", "supported"]


def __getattr__(name):
    # `sampan.onnx.backend` imports onnx's backend API: loaded on first use, so that
    # `import sampan` never imports onnx
    if name == "backend":
        import importlib
        return importlib.import_module(".backend", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
