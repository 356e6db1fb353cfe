"""What the server serves: a `ServedModel`, made from a model directory by its kind.

A model directory holds the model's files and, optionally, ``config.json``::

    {"kind": "program",              # which loader reads the directory (default "program")
     "max_batch_size": 64,           # 0: inputs carry no batch dimension, never batched
     "dynamic_batching": {"max_queue_delay_us": 500, "preferred_batch_sizes": [8, 32],
                          "max_queue_size": 256, "timeout_ms": 5000},
     "instance_count": 2}            # worker threads, each with its own clone

The server reads the generic keys; a kind's loader reads the rest of the file itself.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import ServingError  # its home is errors.py; importable from here too


# KServe v2 datatypes <-> numpy
DATATYPES = {"BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8),
             "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
             "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
             "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32),
             "FP64": np.dtype(np.float64),
             "BYTES": np.dtype(object)}   # an object array of `bytes` (bytes_tensor.py)
_BY_NUMPY = {v: k for k, v in DATATYPES.items()}


def datatype_of(dtype) -> str:
    """The protocol's name for a numpy dtype (``float32`` -> ``"FP32"``; object, bytes
    and str arrays -> ``"BYTES"``)."""
    try:
        dt = np.dtype(dtype)
        return "BYTES" if dt.kind in "OSU" else _BY_NUMPY[dt]
    except (KeyError, TypeError):
        raise ServingError(f"serving: dtype {dtype} has no open-inference-protocol "
                           f"datatype; expected one of {', '.join(DATATYPES)}") from None


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: ``shape`` uses -1 for a dimension of any size; when the model
    has ``max_batch_size > 0`` the shape includes the batch dimension first (as -1)."""
    name: str
    datatype: str
    shape: tuple


@dataclass
class ServedModel:
    """A model the server can run. `infer` is called from several worker threads at once
    and must be safe for that (clone per thread in `clone`, or lock inside)."""
    name: str
    inputs: list
    outputs: list
    max_batch_size: int = 0
    version: str = "1"
    platform: str = "sampan"
    config: dict = field(default_factory=dict)

    def infer(self, inputs: dict) -> dict:
        """Map input name -> array to output name -> array (arrays share the batch dim)."""
        raise NotImplementedError

    def check(self, inputs: dict) -> None:
        """Refuse values this model cannot take (ids outside a table, ...) by raising
        `ServingError` naming the input, before the request joins a batch: a bad request
        then fails alone, with a message about its own values. Default: no check."""

    def checks_values(self) -> bool:
        """Whether `check` reads the inputs' values: the server then parses a JSON
        request's numbers before it, on the event loop, rather than in the worker that
        runs the batch. Default: whenever a subclass defines `check`."""
        return type(self).check is not ServedModel.check

    def batch_sizes(self) -> list | None:
        """The batch sizes this model runs a batch at (sorted; it pads any other size up
        to the next of them), or None (every size runs as it is). The batcher rounds a
        batch down to one of them while more requests are on their way, so the rows
        it would pad become real rows of the next batch. Default: None."""
        return None

    def clone(self) -> "ServedModel":
        """A model for one more worker thread (default: this one, if `infer` is safe)."""
        return self

    def metadata(self) -> dict:
        """Extra fields for ``GET /v2/models/{name}`` (e.g. the snapshot sequence)."""
        return {}

    def gauges(self) -> dict:
        """Numbers for ``/metrics`` (``{"held_deltas": 0}`` -> ``sampan_model_held_deltas``),
        read at every scrape. Default: none."""
        return {}

    def ready(self) -> bool:
        return True

    def start(self) -> None:
        """Begin background work (a snapshot watcher); called once when serving starts."""

    def stop(self) -> None:
        """End background work; called once when the server shuts down."""


KINDS: dict[str, Callable[[str, str, dict], ServedModel]] = {}


def register_kind(kind: str):
    """Decorator: ``@register_kind("dlrm") def load(name, directory, config) -> ServedModel``."""
    def deco(fn):
        if kind in KINDS:
            raise ValueError(f"serving: model kind {kind!r} is registered twice")
        KINDS[kind] = fn
        return fn
    return deco


def read_config(directory: str) -> dict:
    """``config.json`` of a model directory ({} when absent); a malformed file is an error
    naming it."""
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ServingError(f"serving: cannot read {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise ServingError(f"serving: {path} must hold a JSON object, got {type(cfg).__name__}")
    cfg.pop("_code_root", None)     # only the server says where code may run from
    return cfg


def kind_of(directory: str, config: dict) -> str:
    """The kind of a model directory: its config's ``kind``, else "custom" for a folder
    with a ``model.py`` and no saved program, else "program"."""
    kind = config.get("kind")
    if kind is not None:
        return kind
    if os.path.isfile(os.path.join(directory, "model.py")) and not os.path.exists(
            os.path.join(directory, "meta.json")):
        return "custom"
    return "program"


def kind_loader(kind: str, name: str = "?", where: str = "config.json"):
    """The loader registered for model kind `kind` (``loader(name, directory, config)``),
    the built-in kinds imported first; an unknown kind is a `ServingError`."""
    if kind not in KINDS:
        _load_builtin_kinds()
    if kind not in KINDS:
        raise ServingError(f"serving: model {name!r}: unknown kind {kind!r} in "
                           f"{where}; expected one of {sorted(KINDS)}")
    return KINDS[kind]


def load_model(name: str, directory: str, config: dict | None = None,
               code_root: str | None = None) -> ServedModel:
    """The ServedModel for `directory`, made by the loader of its kind (`kind_of`);
    `config` replaces what ``config.json`` says (the server merges its overrides in).
    `code_root`: the model repository the user passed, inside which a custom model's
    ``model.py`` may run (None: no code is run from `directory`)."""
    if not os.path.isdir(directory):
        raise ServingError(f"serving: model {name!r}: {directory!r} is not a directory")
    cfg = read_config(directory) if config is None else dict(config)
    cfg.pop("_code_root", None)
    if code_root is not None:
        cfg["_code_root"] = os.fspath(code_root)
    kind = kind_of(directory, cfg)
    return kind_loader(kind, name, f"{directory}/config.json")(name, directory, cfg)


# modules that register kinds when imported (each, once it exists)
_KIND_MODULES = ("sampan.serving.program", "sampan.serving.rec", "sampan.serving.custom")


def _load_builtin_kinds() -> None:
    import importlib
    import importlib.util
    for mod in _KIND_MODULES:
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)
