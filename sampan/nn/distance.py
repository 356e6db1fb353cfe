"""(issue 17) layers of this family; each name `sampan.nn` exports from it is listed in `EXPORTS`."""
from __future__ import annotations

EXPORTS: list = []
