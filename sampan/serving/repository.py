"""The model repository of `sampan serve --model-repository DIR` (Triton's repository API).

Every folder of DIR is a model of that name: a saved program, a folder holding an ONNX
file, a DLRM snapshot (`rec.export_dlrm`), a custom model (a ``model.py``), each with an
optional ``config.json`` (see `model.py`; its ``"kind"`` wins over what the folder holds).
At start every folder is loaded; one that fails is listed with its reason and does not
stop the others. The data plane answers the repository calls through `ModelRepository`:

    index(ready_only)        [{"name", "version", "state", "reason"}]: every folder of DIR
                             and every model served (READY, UNAVAILABLE with the reason,
                             LOADING, UNLOADING)
    load(name, parameters)   (re)load folder `name`: a new model replaces the served one
                             once it is ready; ``{"config": "<json object>"}`` replaces
                             keys of its config.json for this load
    unload(name)             stop serving `name`: new requests get 404 at once, the
                             requests already in flight are answered, then it is freed

Load and unload are refused (403) unless the server runs with ``allow_model_control``
(``--allow-model-control``). Names are confined to DIR: a name that is empty, hidden,
holds a path separator or ``..``, is absolute, or whose real path (symlinks resolved)
lies outside DIR is refused (400) and nothing outside DIR is read. Both run in a worker
thread (the front ends call them so), one at a time.

    >>> # repo = ModelRepository("models/", allow_control=True)
    >>> # loaded = repo.load_all()          # {name: ServedModel}; failures in repo.index()
"""
from __future__ import annotations

import inspect
import json
import os
import threading
import time

from .errors import ModelNotFound, RequestError
from .model import ServingError, load_model, read_config

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
UNLOAD_WAIT_S = 30.0      # s an unload waits for the model's in-flight requests at most


def _confined_name(name) -> str:
    """`name` when it can only name a folder directly inside the repository (400 else)."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise RequestError(f"model repository: {name!r} is not a model name", 400)
    if (os.path.isabs(name) or "/" in name or "\\" in name or "\0" in name
            or name.startswith(".") or ".." in name.split(os.sep)):
        raise RequestError(f"model repository: model name {name!r} tries to leave the "
                           "repository (a name is one folder of it: no '/', no '..', not "
                           "absolute, not hidden)", 400)
    return name


class ModelRepository:
    """The folder `root` as a model repository (module doc). `overrides` are the CLI's
    config keys for every model (as `Server`'s); `plane` is set by the server once its
    `DataPlane` exists (`load`/`unload` add and remove entries there)."""

    def __init__(self, root, allow_control=False, overrides=None, merge=None):
        if not os.path.isdir(root):
            raise ServingError(f"serving: model repository {root!r} is not a directory")
        self.root = os.path.realpath(root)
        self.allow_control = bool(allow_control)
        self.overrides = dict(overrides or {})
        self._merge = merge            # server._merge (config.json + overrides)
        self.plane = None
        self.states: dict = {}         # name -> (state, reason), for folders and unloads
        self._lock = threading.Lock()  # one load/unload at a time

    # ------------------------------------------------------------ names and folders
    def folders(self) -> list:
        """The model names of the repository: its folders (hidden ones skipped)."""
        return sorted(d for d in os.listdir(self.root) if not d.startswith(".")
                      and os.path.isdir(os.path.join(self.root, d)))

    def path_of(self, name) -> str:
        """The folder of model `name`, confined to the repository (module doc)."""
        _confined_name(name)
        path = os.path.join(self.root, name)
        real = os.path.realpath(path)
        if os.path.commonpath([real, self.root]) != self.root or real == self.root:
            raise RequestError(f"model repository: {name!r} leads outside the repository "
                               f"({path} resolves to {real})", 400)
        if not os.path.isdir(real):
            raise ModelNotFound(f"model repository: no model folder {name!r} in "
                                f"{self.root}; its models are {self.folders()}")
        return real

    # ------------------------------------------------------------ loading
    def _config(self, name, directory, parameters):
        cfg = read_config(directory)
        text = (parameters or {}).get("config")
        for key in parameters or {}:
            if key != "config":
                raise RequestError(f"model repository: load of {name!r}: unknown parameter "
                                   f"{key!r}; the one parameter taken is 'config' (a JSON "
                                   "object replacing keys of config.json)", 400)
        if text is not None:
            try:
                extra = json.loads(text)
            except (TypeError, ValueError) as e:
                raise RequestError(f"model repository: load of {name!r}: parameter 'config' "
                                   f"is not JSON: {e}", 400) from None
            if not isinstance(extra, dict):
                raise RequestError(f"model repository: load of {name!r}: parameter 'config' "
                                   f"must be a JSON object; got {type(extra).__name__}", 400)
            cfg.update(extra)
        if "kind" not in cfg and not os.path.exists(os.path.join(directory, "meta.json")) \
                and not os.path.exists(os.path.join(directory, "model.py")) \
                and any(f.endswith(".onnx") for f in os.listdir(directory)):
            cfg["kind"] = "onnxruntime"          # a folder holding an ONNX file
        if self.overrides:
            cfg = self._merge(cfg, self.overrides) if self._merge else {**cfg,
                                                                        **self.overrides}
        return cfg

    def _load_one(self, name, parameters=None):
        """The ServedModel of folder `name` (raises `ServingError` naming why not)."""
        directory = self.path_of(name)
        cfg = self._config(name, directory, parameters)
        # a custom model's model.py may run only from inside the repository the user named
        if "code_root" in inspect.signature(load_model).parameters:
            return load_model(name, directory, cfg, code_root=self.root)
        return load_model(name, directory, cfg)

    def load_all(self) -> dict:
        """{name: ServedModel} of every folder that loads; the others are UNAVAILABLE in
        the index with their reason (the server starts with what loaded)."""
        from .ops import LOG
        models = {}
        for name in self.folders():
            try:
                models[name] = self._load_one(name)
            except RequestError as e:           # a symlink out of the repository
                self.states[name] = (UNAVAILABLE, str(e))
            except Exception as e:  # noqa: BLE001 -- any loader's failure is reported
                self.states[name] = (UNAVAILABLE, _reason(e))
                LOG.warning("model %r failed to load: %s", name, _reason(e))
        return models

    # ------------------------------------------------------------ the repository API
    def index(self, ready_only=False) -> list:
        """The index (module doc), sorted by name."""
        served = self.plane.entries if self.plane is not None else {}
        rows = {}
        for name in set(self.folders()) | set(self.states) | set(served):
            e = served.get(name)
            state, reason = self.states.get(name, (None, ""))
            if state is None:
                if e is not None:
                    state = READY if e.model.ready() else UNAVAILABLE
                else:
                    state, reason = UNAVAILABLE, "not loaded"
            version = str(e.model.version) if e is not None else ""
            rows[name] = {"name": name, "version": version, "state": state,
                          "reason": reason}
        out = [rows[n] for n in sorted(rows)]
        return [r for r in out if r["state"] == READY] if ready_only else out

    def _control(self, what, name):
        if not self.allow_control:
            raise RequestError(f"model repository: {what} of model {name!r} refused: the "
                               "server was started without --allow-model-control", 403)

    def load(self, name, parameters=None) -> None:
        """(Re)load folder `name` and serve it (module doc); a failure is a 400 naming
        why and leaves the model UNAVAILABLE with that reason (a served one is unloaded
        only when its replacement is ready, so a failed reload keeps the old one)."""
        self._control("load", name)
        self.path_of(name)
        with self._lock:
            old = self.plane.entries.get(name)
            self.states[name] = (LOADING, "")
            try:
                model = self._load_one(name, parameters)
                self.plane.add(name, model)
            except Exception as e:  # noqa: BLE001 -- any loader's failure is answered
                reason = str(e) if isinstance(e, RequestError) else _reason(e)
                if old is None:
                    self.states[name] = (UNAVAILABLE, reason)
                else:
                    self.states.pop(name, None)     # the old model still serves
                if isinstance(e, RequestError):
                    raise
                raise RequestError(f"model repository: failed to load model {name!r}: "
                                   f"{reason}", 400) from None
            self.states.pop(name, None)
        if old is not None:
            self.plane.retire(old, UNLOAD_WAIT_S)

    def unload(self, name, parameters=None) -> None:
        """Stop serving `name` once its in-flight requests are answered (module doc)."""
        self._control("unload", name)
        _confined_name(name)
        with self._lock:
            if name not in self.plane.entries:
                if name in self.states or name in self.folders():
                    return              # not served: nothing to do (as Triton)
                raise ModelNotFound(f"model repository: unknown model {name!r}")
            self.states[name] = (UNLOADING, "")
            try:
                self.plane.remove(name, UNLOAD_WAIT_S)
            finally:
                self.states[name] = (UNAVAILABLE, "unloaded")


def _reason(e) -> str:
    msg = str(e) or type(e).__name__
    return msg if isinstance(e, ServingError) else f"{type(e).__name__}: {msg}"


def wait_until_idle(batcher, timeout) -> bool:
    """Wait (polling) until no request is being read or decoded for `batcher`'s model;
    False when `timeout` seconds passed first."""
    end = time.monotonic() + timeout
    while batcher.arriving > 0:
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True
