"""numba's cache files of generated kernels, checked before numba unpickles them.

`kernelgen` checks each kernel module against its source, but numba keeps the compiled
machine code beside it, in `__pycache__/sampan_kernel_<hash>.<fn>-<line>.py311.nbi`
(the index) and `.N.nbc` (the code): pickles, which numba loads unchecked. A truncated
index (a full disk, a killed writer) raised UnpicklingError in every later process that
used the kernel, and a changed pickle runs whatever it holds.

So each such file gets a sidecar `<file>.sha256` holding the digest of its bytes,
written right after numba writes the file; before numba reads one, its bytes must match
its sidecar. A file that does not (or has none, like caches of an older sampan) counts
as absent: numba compiles again and overwrites it. This protects against damage, not
against someone who can write both a file and its sidecar (they could as well edit the
cache directory's owner's code).

Only files named `sampan_kernel_*` are affected; numba's other caches are left as they
are. numba's cache-file class is internal: if its shape changes, nothing is installed.
"""
from __future__ import annotations

import hashlib
import os

_INSTALLED = []


def _ours(path: str) -> bool:
    return os.path.basename(path).startswith("sampan_kernel_")


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def stamp(path: str) -> None:
    """Record the digest of `path` (written by numba just now) in its sidecar."""
    d = _digest(path)
    if d is None:
        return
    tmp = f"{path}.sha256.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(d)
        os.replace(tmp, path + ".sha256")
    except OSError:   # an unwritable sidecar only costs a recompilation next time
        try:
            os.unlink(tmp)
        except OSError:
            pass


def intact(path: str) -> bool:
    """True when `path` holds the bytes its sidecar names."""
    try:
        with open(path + ".sha256") as f:
            want = f.read(65)
    except (OSError, UnicodeDecodeError):
        return False
    return len(want) == 64 and _digest(path) == want


def install() -> None:
    """Wrap numba's cache-file reads and writes for sampan's kernel modules (once)."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    try:
        from numba.core.caching import IndexDataCacheFile as F
        load_index, save_index = F._load_index, F._save_index
        load_data, save_data = F._load_data, F._save_data
    except (ImportError, AttributeError):  # pragma: no cover - another numba layout
        return

    def _load_index(self):
        if not _ours(self._index_path):
            return load_index(self)
        if not os.path.exists(self._index_path) or not intact(self._index_path):
            return {}   # no index, or a damaged one: compile and write a new one
        try:
            return load_index(self)
        except Exception:  # noqa: BLE001 - what a pickle of another numba may raise
            return {}

    def _save_index(self, overloads):
        save_index(self, overloads)
        if _ours(self._index_path):
            stamp(self._index_path)

    def _load_data(self, name):
        path = self._data_path(name)
        if not _ours(path):
            return load_data(self, name)
        if not intact(path):   # numba's `load` takes an OSError for "not cached"
            raise OSError(f"sampan: {path} does not match its checksum; recompiling")
        try:
            return load_data(self, name)
        except Exception as e:  # noqa: BLE001
            raise OSError(f"sampan: {path} cannot be loaded ({e}); recompiling") from None

    def _save_data(self, name, data):
        save_data(self, name, data)
        path = self._data_path(name)
        if _ours(path):
            stamp(path)

    F._load_index, F._save_index = _load_index, _save_index
    F._load_data, F._save_data = _load_data, _save_data
