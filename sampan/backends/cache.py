"""The machine and its measured choices: one module below `choice.py` (per-class kernel
winners) and `pool.py` (the GEMM thread pool), which both read and write through it.

It holds what both need and neither owns: the machine key (CPU model, SIMD flags, the
versions of numpy, numba and the extra kernel libraries that load here, the thread
count), the extra libraries themselves (`backends()`: oneDNN where it loads), the
on-disk cache of winners, the lock every decision is taken under, the busy-machine test
and the win margin. Neither `choice` nor `pool` reads the other's state: a change that
must drop the per-class choices (a new pool) calls `forget()`, which runs the hooks the
owners registered with `on_forget`.

The cache file (`$SAMPAN_KERNEL_CACHE`, default `kernels.json` in sampan's cache
directory) holds one section per machine key, so a winner measured elsewhere is never
used here. It is written atomically with a checksum; a corrupt or foreign file is ignored
with a warning and rebuilt.

Example::

    >>> from sampan.backends import cache
    >>> isinstance(cache.machine_key(), str)
    True
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import warnings

import numpy as np

# extra kernel libraries measured against numpy, and the module serving each
BACKENDS = {"onednn": "sampan.backends.onednn"}
FORMAT = 1
# another backend must beat numpy by this factor: a near tie keeps today's kernel, and
# fewer switches between OpenBLAS's and OpenMP's thread pools within a step
WIN_MARGIN = 1.1
WRITE_EVERY_S = 2.0      # a burst of new classes (a model's first step) is one write
BUSY_LOAD_PER_CORE = 1.0   # 1-minute load average per core above which timings are noise
# a record measured busy is measured again once the load per core is below this share of
# the load it was measured under (a shared machine that never gets quiet still gets its
# choices re-raced when it is clearly quieter than it was)
QUIETER = 0.6

LOCK = threading.RLock()   # every choice (a class's winner, the pool) is decided under it
_state = {"disk": None, "path": None, "backends": None}
_forget_hooks: list = []


class KernelCacheWarning(UserWarning):
    """The kernel choice cache file was unreadable or corrupt and is rebuilt."""


# ----------------------------------------------------------------------------- machine
def cpu_model() -> str:
    from .._threads import cpu_model as model     # one reading, shared with the pool hint
    return model()


def cpu_flags() -> list:
    """The CPU's AVX-512, AMX, AVX2/FMA and VNNI flags (those that change kernels)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    fl = line.split(":", 1)[1].split()
                    return sorted(x for x in set(fl) if x.startswith(("avx512", "amx"))
                                  or x in ("avx2", "fma", "avx_vnni", "f16c"))
    except OSError:
        pass
    return []


def library_versions() -> dict:
    out = {"numpy": np.__version__}
    try:
        import numba
        out["numba"] = numba.__version__
    except ImportError:
        pass
    for name in backends():
        out[name] = module(name).version()
    return out


def machine_key() -> str:
    """CPU model | flags digest | library versions: a winner holds only under all three."""
    flags = hashlib.sha256(" ".join(cpu_flags()).encode()).hexdigest()[:12]
    libs = ",".join(f"{k}={v}" for k, v in sorted(library_versions().items()))
    return f"{cpu_model()}|{flags}|{libs}|threads={_threads()}"


def _threads():
    from .. import _threads as t
    return t.get_num_threads()


def load_per_core() -> float | None:
    """The 1-minute load average per core, or None (no load average on this platform)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return None


def busy() -> bool:
    """Whether other work loads the machine enough to make a measurement unreliable."""
    load = load_per_core()
    return load is not None and load > BUSY_LOAD_PER_CORE


def conditions() -> dict:
    """What a new record keeps about the machine it was measured on: {"busy", "load"}
    (the load per core, rounded; None where there is no load average)."""
    load = load_per_core()
    return {"busy": busy(), "load": None if load is None else round(load, 3)}


def trusted(record) -> bool:
    """Whether a stored `record` stands now. One measured quiet stands for good; one
    measured busy is provisional: it stands while the machine is busy and not clearly
    quieter than then (load per core below QUIETER times the load it recorded), so it is
    measured again on a quiet machine, or on a busy one that has become quieter (its new
    record keeps the lower load). A busy record without a load (an older cache) is
    measured again once."""
    if not record.get("busy"):
        return True
    if not busy():
        return False
    then, now = record.get("load"), load_per_core()
    if then is None:
        return False
    return now is None or now >= then * QUIETER


# ----------------------------------------------------------------------------- libraries
def module(name):
    """The module of extra backend `name` (imported, not loaded)."""
    import importlib
    return importlib.import_module(BACKENDS[name])


def backends() -> list:
    """Names of the extra backends that load on this machine (loads them once)."""
    if _state["backends"] is None:
        found = []
        if os.environ.get("SAMPAN_KERNEL_CHOICE", "on") != "off":
            for name in BACKENDS:
                try:
                    mod = module(name)
                    if mod.available():
                        found.append(name)
                except Exception:  # noqa: BLE001 - a broken install is "not there"
                    pass
        _state["backends"] = found
    return _state["backends"]


def on_forget(fn) -> None:
    """Run `fn()` whenever the in-memory choices must be dropped (`forget`)."""
    if fn not in _forget_hooks:
        _forget_hooks.append(fn)


def forget() -> None:
    """Drop every in-memory choice (the owners' hooks): a new pool, a new loader."""
    with LOCK:
        for fn in _forget_hooks:
            fn()


def reset_state() -> None:
    """Forget the loaded backends and the cache read from disk (tests swap loaders)."""
    with LOCK:
        _state.update(backends=None, disk=None, path=None, dirty=False, written=-1e9)


# ----------------------------------------------------------------------------- the file
def cache_path() -> str:
    from .._threads import kernel_cache_path      # read there before libgomp loads
    return kernel_cache_path()


def _digest(machines) -> str:
    return hashlib.sha256(json.dumps(machines, sort_keys=True).encode()).hexdigest()


def read() -> dict:
    """{machine key: {class key: record}} from disk; {} (with a warning) when corrupt."""
    path = cache_path()
    if _state["disk"] is not None and _state["path"] == path:
        return _state["disk"]
    machines = {}
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode())
        if (not isinstance(doc, dict) or doc.get("format") != FORMAT
                or not isinstance(doc.get("machines"), dict)
                or doc.get("sha256") != _digest(doc["machines"])):
            raise ValueError("bad format or checksum")
        machines = doc["machines"]
    except FileNotFoundError:
        pass
    except (OSError, ValueError, UnicodeDecodeError) as e:
        warnings.warn(f"sampan: kernel choice cache {path} is unreadable ({e}); ignoring "
                      "it and measuring again", KernelCacheWarning, stacklevel=3)
    _state.update(disk=machines, path=path)
    return machines


def _write(machines) -> None:
    from .._atomic import write_file
    path = cache_path()
    data = json.dumps({"format": FORMAT, "machines": machines, "sha256": _digest(machines)},
                      sort_keys=True, indent=1).encode()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_file(path, lambda f: f.write(data))
    except OSError as e:
        warnings.warn(f"sampan: cannot write the kernel choice cache {path}: {e}",
                      KernelCacheWarning, stacklevel=3)


def entries() -> dict:
    """This machine's stored choices: {class key: {"winner", "times_us"}}."""
    flush()
    return dict(read().get(machine_key(), {}))


def delete_file() -> None:
    """Delete the cache file (the in-memory copy is dropped with `reset_state`)."""
    with LOCK:
        try:
            os.unlink(cache_path())
        except FileNotFoundError:
            pass


def stored(key):
    """This machine's cached record under `key`, or None."""
    return read().get(machine_key(), {}).get(key)


def store(key, record) -> None:
    """Keep `record` under `key` for this machine (written to disk in bursts)."""
    with LOCK:
        machines = read()
        machines.setdefault(machine_key(), {})[key] = record
        now = time.monotonic()
        if now - _state.get("written", -1e9) >= WRITE_EVERY_S:
            _state["written"] = now
            _state["dirty"] = False
            _write(machines)
        elif not _state.get("dirty"):
            _state["dirty"] = True
            import atexit
            atexit.register(flush)


def flush() -> None:
    """Write choices not yet on disk (also run at exit)."""
    with LOCK:
        if _state.get("dirty") and _state["disk"] is not None:
            _state["dirty"] = False
            _state["written"] = time.monotonic()
            _write(_state["disk"])
