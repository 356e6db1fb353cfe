"""(issue 17) functional forms re-exported by `sampan.nn.functional` through `__all__`."""
from __future__ import annotations

__all__: list = []
