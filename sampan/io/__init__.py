"""Reading and writing sampan files: checkpoints (`save` / `load`)."""
from .checkpoint import FORMAT_VERSION, CheckpointError, load, save

__all__ = ["FORMAT_VERSION", "CheckpointError", "load", "save"]
