"""Model kind "custom": a user's Python class behind the server, as Triton's python
backend, MLServer's ``implementation`` and ``kserve.Model`` serve one.

The class::

    class Model:
        inputs = [{"name": "x", "datatype": "FP32", "dims": [4]}]    # per row
        outputs = [{"name": "y", "datatype": "FP32", "dims": [4]}]
        max_batch_size = 32             # > 0: every input and output has a batch dim first
        dynamic_batching = {}           # optional: batch requests together (batcher.py)

        def load(self, config):         # optional; config: the model's config dict
            self.scale = config.get("scale", 2.0)

        def infer(self, inputs):        # {name: numpy array} -> {name: numpy array}
            return {"y": inputs["x"] * self.scale}

        def unload(self):               # optional; at shutdown
            ...

Where it comes from:

- ``sampan serve --model name=pkg.module:Class``: the module is imported by name (the
  user named that code on the command line), so it must be importable (``PYTHONPATH``).
- a ``model.py`` in a folder of ``--repository DIR`` (``"kind": "custom"`` in its
  ``config.json``, or a folder holding a ``model.py`` and no saved program): the file is
  run only when it lies inside the repository folder the user passed (its real path, so
  no symlink leads out); ``"class"`` in config.json names the class (default ``Model``,
  else ``TritonPythonModel``). A model folder named by ``--model name=DIR`` is never run
  as code: name its class instead, or serve it from a repository.

Metadata: ``inputs``/``outputs`` in config.json win over the class attributes; each entry
gives ``name``, ``datatype`` (``FP32``, or Triton's ``TYPE_FP32``; ``BYTES``/``TYPE_STRING``:
numpy object arrays of `bytes`, `bytes_tensor.py`) and either ``dims``
(one row's shape, Triton's config) or ``shape`` (the full shape, the batch dim as -1
first when batched). ``max_batch_size`` and ``dynamic_batching`` come from config.json,
the flags, or else the class.

Each worker thread (``instance_count``) gets its own instance, made and loaded once, so
`infer` need not be thread-safe. An exception raised by the user's code answers that
request with a 500 naming it and is logged with its traceback; in a batch, the batcher
runs the batch's requests again one by one, so the others still get their answers.

    >>> # m = from_class_ref("echo", "mypkg.models:Echo", {})   # a ServedModel
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import sys
import threading

import numpy as np

from .bytes_tensor import BytesError, as_bytes_array
from .model import DATATYPES, ServedModel, ServingError, TensorSpec, register_kind

LOG = logging.getLogger("sampan.serving")

CLASS_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
CODE_ROOT = "_code_root"      # config key the server sets for a repository's folders


def is_class_ref(s) -> bool:
    """Whether `s` names a class as ``pkg.module:Class`` (``"a.b:C"`` -> True)."""
    return isinstance(s, str) and bool(CLASS_REF.match(s))


# ------------------------------------------------------------------ finding the class
def import_class(ref: str, name: str):
    """The class ``pkg.module:Class`` names, imported by module name."""
    mod_name, _, cls_name = ref.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 -- the user's module failed: say which, and why
        hint = (" (it must be importable: installed, or its folder on PYTHONPATH)"
                if isinstance(e, ModuleNotFoundError) else "")
        raise ServingError(f"serving: model {name!r}: cannot import module {mod_name!r} "
                           f"(from --model {name}={ref}): {type(e).__name__}: {e}{hint}"
                           ) from e
    cls = getattr(mod, cls_name, None)
    if not isinstance(cls, type):
        raise ServingError(f"serving: model {name!r}: module {mod_name!r} has no class "
                           f"{cls_name!r}")
    return cls


def _inside(path, root) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def folder_class(name: str, directory: str, config: dict):
    """The class of ``model.py`` in a repository folder (see the module doc)."""
    root = config.get(CODE_ROOT)
    path = os.path.join(directory, "model.py")
    if not root:
        raise ServingError(
            f"serving: model {name!r}: {path} is Python code, which is run only from a "
            f"folder of --repository DIR; serve it with --repository, or name its class "
            f"with --model {name}=pkg.module:Class")
    if not (_inside(directory, root) and _inside(path, root)):
        raise ServingError(f"serving: model {name!r}: {path} is not inside the model "
                           f"repository {root!r}; it is not run")
    if not os.path.isfile(path):
        raise ServingError(f"serving: model {name!r}: kind 'custom' needs a model.py in "
                           f"{directory}")
    mod_name = f"sampan_custom_model_{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{id(config):x}"
    spec = importlib.util.spec_from_file_location(mod_name, os.path.realpath(path))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod         # for pickling and dataclasses in the user's code
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 -- the user's file failed: say which, and why
        sys.modules.pop(mod_name, None)
        raise ServingError(f"serving: model {name!r}: {path} failed to load: "
                           f"{type(e).__name__}: {e}") from e
    want = config.get("class")
    names = [want] if want else ["Model", "TritonPythonModel"]
    for n in names:
        cls = getattr(mod, n, None) if isinstance(n, str) else None
        if isinstance(cls, type):
            return cls
    raise ServingError(f"serving: model {name!r}: {path} defines no class "
                       f"{' or '.join(map(repr, names))}")


# ------------------------------------------------------------------ metadata
def _datatype(name, where, dt):
    d = dt[5:] if isinstance(dt, str) and dt.startswith("TYPE_") else dt
    if d == "STRING":               # Triton's config name for BYTES
        d = "BYTES"
    if isinstance(d, str) and d in DATATYPES:
        return d
    raise ServingError(f"serving: model {name!r}: {where}: datatype {dt!r}; expected one of "
                       f"{', '.join(DATATYPES)}")


def _spec(name, where, e, batched):
    if isinstance(e, TensorSpec):
        return e
    if not isinstance(e, dict) or not isinstance(e.get("name"), str):
        raise ServingError(f"serving: model {name!r}: each of {where} must be an object with "
                           f"a 'name', 'datatype' and 'dims' or 'shape'; got {e!r:.80}")
    dims = e.get("dims", e.get("shape"))
    if not isinstance(dims, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in dims):
        raise ServingError(f"serving: model {name!r}: {where} {e['name']!r}: 'dims'/'shape' "
                           f"must be a list of ints (-1: any size); got {dims!r}")
    shape = tuple(int(d) for d in dims)
    if "dims" in e and batched:
        shape = (-1,) + shape
    elif batched and (not shape or shape[0] != -1):
        raise ServingError(f"serving: model {name!r}: {where} {e['name']!r}: the model "
                           f"batches (max_batch_size > 0), so its 'shape' {list(shape)} "
                           "must start with -1 (or give one row's 'dims')")
    return TensorSpec(e["name"], _datatype(name, f"{where} {e['name']!r}", e.get("datatype")),
                      shape)


def _specs(name, cls, config, key, batched):
    entries = config.get(key, getattr(cls, key, None))
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ServingError(f"serving: model {name!r}: no {key} declared: give the class an "
                           f"'{key}' attribute or config.json an '{key}' list of "
                           "{name, datatype, dims}")
    specs = [_spec(name, key[:-1], e, batched) for e in entries]
    seen = [s.name for s in specs]
    if len(set(seen)) != len(seen):
        raise ServingError(f"serving: model {name!r}: {key} {seen} repeat a name")
    return specs


# ------------------------------------------------------------------ the served model
class CustomModel(ServedModel):
    """A user class as a `ServedModel` (see the module doc)."""

    def __init__(self, name, cls, config, instance=None):
        cfg = dict(config or {})
        mbs = cfg.get("max_batch_size", getattr(cls, "max_batch_size", 0))
        if isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 0:
            raise ServingError(f"serving: model {name!r}: max_batch_size must be an int >= 0; "
                               f"got {mbs!r}")
        db = getattr(cls, "dynamic_batching", None)
        if (mbs > 0 and "dynamic_batching" not in cfg and db is not None
                and not cfg.get("_batching_off")):
            cfg["dynamic_batching"] = dict(db) if isinstance(db, dict) else {}
        super().__init__(name=name, inputs=_specs(name, cls, cfg, "inputs", mbs > 0),
                         outputs=_specs(name, cls, cfg, "outputs", mbs > 0),
                         max_batch_size=mbs, version=str(cfg.get("version", "1")),
                         platform="python", config=cfg)
        self.cls = cls
        self._dtypes = {s.name: DATATYPES[s.datatype] for s in self.outputs}
        self.obj = self._instance() if instance is None else instance
        self._clones = [self.obj]
        self._lock = threading.Lock()

    def _instance(self):
        try:
            obj = self.cls()
            load = getattr(obj, "load", None)
            if load is not None:
                load(dict(self.config))
        except Exception as e:  # noqa: BLE001 -- the user's code failed: say where
            raise ServingError(f"serving: model {self.name!r}: {self.cls.__qualname__}() "
                               f"or its load(config) failed: {type(e).__name__}: {e}") from e
        if not callable(getattr(obj, "infer", None)):
            raise ServingError(f"serving: model {self.name!r}: {self.cls.__qualname__} has no "
                               "infer(inputs) method")
        return obj

    def clone(self):
        """One more worker's model: a new instance of the class, loaded."""
        c = CustomModel.__new__(CustomModel)
        c.__dict__.update(self.__dict__)
        c.obj = self._instance()
        with self._lock:
            self._clones.append(c.obj)
        return c

    def infer(self, inputs):
        rows = next(iter(inputs.values())).shape[0] if self.max_batch_size else None
        try:
            out = self.obj.infer(inputs)
        except Exception:
            LOG.exception("model %r: %s.infer raised%s", self.name, self.cls.__qualname__,
                          "" if rows is None else f" (on {rows} rows)")
            raise
        if not isinstance(out, dict):
            raise ServingError(f"model {self.name!r}: {self.cls.__qualname__}.infer returned "
                               f"{type(out).__name__}; expected a dict of output name -> array")
        res = {}
        for n, dt in self._dtypes.items():
            if n not in out:
                raise ServingError(f"model {self.name!r}: {self.cls.__qualname__}.infer "
                                   f"returned no output {n!r} (it returned {sorted(out)})")
            a = np.asarray(out[n])
            if dt.kind == "O":          # BYTES: an object array of bytes (bytes_tensor.py)
                try:
                    res[n] = as_bytes_array(a)
                except BytesError as e:
                    raise ServingError(f"model {self.name!r}: {self.cls.__qualname__}.infer "
                                       f"output {n!r} (BYTES): {e}") from None
                continue
            res[n] = a if a.dtype == dt else a.astype(dt)
        return res

    def stop(self):
        for obj in self._clones:
            fn = getattr(obj, "unload", None)
            if fn is not None:
                try:
                    fn()
                except Exception:  # noqa: BLE001 -- one model's cleanup must not stop others
                    LOG.exception("model %r: unload() failed", self.name)


def from_class_ref(name: str, ref: str, config: dict | None = None) -> CustomModel:
    """The model of ``--model name=pkg.module:Class`` (`config`: the flags' overrides)."""
    return CustomModel(name, import_class(ref, name), config or {})


@register_kind("custom")
def load_folder(name: str, directory: str, config: dict) -> CustomModel:
    """Kind "custom": ``model.py`` of a repository folder (see the module doc)."""
    return CustomModel(name, folder_class(name, directory, config), config)
