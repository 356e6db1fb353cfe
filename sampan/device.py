"""Devices. `cpu` runs on the numpy backend; `cuda` is a real value that explains
what is missing until the CuPy backend exists."""
from __future__ import annotations

from .errors import DeviceError


class Device:
    """A device such as ``Device("cpu")`` or ``Device("cuda:0")``."""

    __slots__ = ("type", "index")

    def __init__(self, spec="cpu"):
        if isinstance(spec, Device):
            self.type, self.index = spec.type, spec.index
            return
        kind, _, idx = str(spec).partition(":")
        if kind not in ("cpu", "cuda"):
            raise DeviceError(f"device: got {spec!r}; expected 'cpu' or 'cuda[:N]'")
        self.type = kind
        self.index = int(idx) if idx else (0 if kind == "cuda" else None)

    def __repr__(self):
        return f"device('{self}')"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        try:
            other = Device(other)
        except DeviceError:
            return False
        return self.type == other.type and (self.index or 0) == (other.index or 0)

    def __hash__(self):
        return hash((self.type, self.index or 0))


CPU = Device("cpu")


def as_device(spec) -> Device:
    """Resolve a device spelling and check that it can be used now."""
    d = spec if isinstance(spec, Device) else Device(spec)
    if d.type == "cuda":
        try:
            import cupy  # noqa: F401
        except ImportError:
            raise DeviceError(
                f"device {d}: the GPU backend needs CuPy; install the gpu extra "
                "(pip install 'sampan[gpu]') on a machine with a CUDA device") from None
        raise DeviceError(f"device {d}: the CuPy backend is not available in this build yet")
    return d


def cuda_is_available() -> bool:
    """True when a CUDA device and the CuPy backend can be used. The CuPy backend is not
    built yet, so this is False even on a machine with a GPU."""
    return False
