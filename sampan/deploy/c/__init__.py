"""The C target of `sampan deploy` (`--target c`): see `sampan.deploy.c.gen`.

Modules: `emit_c` (the C sibling of `sampan.runtime.emit`), `lower` (the program as steps
over buffers, and the memory plan), `steps` (the C of each op family's step),
`templates` (the C kernel templates), `weights` (weights.bin), `files` (model.h, the
frame of model.c, Makefile, driver), `gen` (the generator)."""
from .gen import CGenerated, generate_c

__all__ = ["generate_c", "CGenerated"]
