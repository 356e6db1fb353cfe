"""The ``dlrm`` model kind: a trained :class:`sampan.rec.DLRM` served with its embeddings
read from a :class:`sampan.rec.ServingTable`, updated online from delta exports.

A ``dlrm`` model directory (:func:`export_dlrm` writes one)::

    config.json        {"kind": "dlrm", "n_fields": 26, "n_dense": 13, "dim": 16,
                        "dense_program": "dense.program", "embeddings": "embeddings.full",
                        "snapshot_dir": "deltas", "poll_interval_ms": 200,
                        "max_held_deltas": 32, "max_held_seconds": 300,
                        "max_batch_size": 256, "dynamic_batching": {...}}
    dense.program/     the bottom MLP, pairwise dots and top MLP as a saved jit program
    embeddings.full    the table's full export (sampan.rec.export_full)
    deltas/            the watched snapshot directory (relative paths are inside the model
                       directory; an absolute path anywhere)

Inputs: ``dense_features`` FP32 ``[-1, n_dense]`` and ``sparse_ids`` INT64
``[-1, n_fields]`` (one raw id per field, as the DLRM trains on); output ``probability``
FP32 ``[-1, 1]``. A directory with ``"features": "features.json"`` (a saved
:class:`sampan.rec.features.FeatureSpec`, ``export_dlrm(..., features=spec)``) takes the
spec's raw fields instead (INT64 / FP32, ``[-1]``, lists ``[-1, -1]``) and transforms them
as the Parquet reader did in training.

Online updates: ``start()`` runs a thread that polls ``snapshot_dir`` for ``*.delta`` (and
``*.full``) files, verifies each completely (checksum, header, arrays) outside any lock,
and applies them in sequence order. A batch holds the model's lock shared over its table
lookups, applying an update takes it exclusively, so every batch sees one snapshot.
A delta that follows a newer export than the one served (its predecessor has not
arrived: a parallel copy drops files in any order) is held, verified, and applied once
the chain reaches it; at most ``max_held_deltas`` (default 32, the lowest sequences kept)
for at most ``max_held_seconds`` (default 300) each, then it is refused. Held deltas
are logged, counted as ``held_deltas`` in the metadata and on ``/metrics``
(``sampan_model_held_deltas``). A corrupt file, a delta of another table, a duplicate or
stale delta, and a delta held too long are refused for good (a warning on the
``sampan.serving`` logger, and ``refused_deltas`` / ``last_refused`` in the metadata)
and leave the table as it was. A full export of the same table with a newer sequence
replaces the table, which is how a broken chain is repaired. The dense weights are those
saved in the directory: deltas carry embeddings only.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import os
import threading
import time

import numpy as np

from sampan.serving._rec_features import feature_inputs, load_features
from sampan.serving._rwlock import _RWLock
from sampan.serving.model import ServedModel, ServingError, TensorSpec, register_kind
from sampan.serving.padding import bucket_of, buckets, pad_rows, preferred_sizes

__all__ = ["DLRMModel", "SnapshotWatcher", "demo_inputs", "export_demo_dlrm", "export_dlrm"]

log = logging.getLogger("sampan.serving")

INPUTS = ("dense_features", "sparse_ids")
OUTPUT = "probability"


def _int(cfg: dict, key: str, where: str, low: int = 1) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ServingError(f"serving: {where}: config key {key!r} must be an integer >= "
                           f"{low}, got {v!r}")
    return v


class SnapshotWatcher:
    """A :class:`sampan.rec.ServingTable` kept current from a snapshot directory.

    `lookup` reads every field of a batch under the shared side of a reader/writer lock;
    `poll` applies new exports under the exclusive side, after verifying each file
    outside the lock. `start` polls on a daemon thread every `poll_interval` seconds.
    A delta whose predecessor is missing is held (at most `max_held`, each for at most
    `max_held_seconds`) and applied when the chain reaches it.

    >>> # w = SnapshotWatcher(ServingTable("emb.full"), "deltas/"); w.poll()
    >>> # [('deltas/000001.delta', 'applied')]
    """

    def __init__(self, table, directory: str | None, poll_interval: float = 0.2,
                 name: str = "model", max_held: int = 32, max_held_seconds: float = 300.0):
        self.table = table
        self.directory = directory
        self.poll_interval = float(poll_interval)
        self.name = name
        self.max_held = int(max_held)
        self.max_held_seconds = float(max_held_seconds)
        self.stats = {"applied_deltas": 0, "refused_deltas": 0, "held_deltas": 0,
                      "last_refused": None}
        self._held: dict = {}   # path -> (header, arrays, time first seen): waiting deltas
        self._stats_lock = threading.Lock()  # a reader sees a count with its reason
        self._rw = _RWLock()
        self._seen: dict[str, tuple] = {}    # file -> (size, mtime, inode) already handled
        self._poll_lock = threading.Lock()   # one poller at a time (thread or a caller)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Vectors of a ``(B, F)`` id batch, all from one snapshot: ``(B, F, dim)``."""
        with self._rw.shared():
            return self.table.lookup(ids)

    def state(self) -> dict:
        """The snapshot served (sequence, step, lineage) and the update counters."""
        with self._rw.shared():
            t = self.table
            out = {"snapshot_sequence": t.seq, "snapshot_step": t.step,
                   "snapshot_lineage": t.lineage, **getattr(t, "info", dict)()}
        with self._stats_lock:
            out.update(self.stats)
        out["snapshot_dir"] = self.directory
        return out

    def start(self) -> None:
        """Catch up with the directory, then watch it on a daemon thread."""
        if self.directory is None or self._thread is not None:
            return
        self.poll()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"sampan-serving-{self.name}-snapshots")
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (an update being applied finishes first)."""
        t, self._thread = self._thread, None
        if t is not None:
            self._stop.set()
            t.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.poll()
            except Exception:  # a bug here must not end the watching silently
                log.exception("model %r: snapshot watcher failed; retrying", self.name)

    def poll(self) -> list:
        """Handle the directory's new files once; returns ``(file, outcome)`` pairs, the
        outcome ``"applied"``, ``"held"`` (a delta whose predecessor has not arrived),
        ``"ignored"`` (an older full) or ``"refused: <reason>"``."""
        if self.directory is None:
            return []
        with self._poll_lock:
            done: list = []
            self._progress(self._read_new(done), done)
            if self._held:
                # one listing may miss a file renamed in while it ran: look once more
                # before reporting a delta as held
                self._progress(self._read_new(done), done)
            self._bound_held(done)
            first = {}
            for i, (path, outcome) in enumerate(done):   # one outcome a file: the last
                first.setdefault(path, i)
            last = dict(done)
            out = [(p, last[p]) for p in sorted(first, key=first.get)]
            with self._stats_lock:
                self.stats["held_deltas"] = len(self._held)
            return out

    def _bound_held(self, done: list) -> None:
        """Refuse held deltas past `max_held_seconds`, and beyond the `max_held` with the
        lowest sequence numbers (the ones a missing delta lets through first)."""
        now = time.monotonic()
        for path, (header, _arrays, since) in sorted(self._held.items(),
                                                     key=lambda kv: kv[1][0]["seq"]):
            waited = now - since
            if waited > self.max_held_seconds:
                del self._held[path]
                self._refuse(done, path, f"out of order: it follows export "
                                         f"{header['base_seq']}, and the model still "
                                         f"serves {self.table.seq} after it waited "
                                         f"{waited:.1f} s (max_held_seconds) for the "
                                         f"missing delta")
        if len(self._held) > self.max_held:
            ordered = sorted(self._held.items(), key=lambda kv: kv[1][0]["seq"])
            for path, (header, _arrays, _since) in ordered[self.max_held:]:
                del self._held[path]
                self._refuse(done, path, f"out of order: it follows export "
                                         f"{header['base_seq']}, the model serves "
                                         f"{self.table.seq}, and {self.max_held} earlier "
                                         f"deltas are already held (max_held)")

    def _read_new(self, done: list) -> list:
        from sampan.rec.snapshot import verify_snapshot
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        listed = {os.path.join(self.directory, n) for n in names}
        for gone in [p for p in self._seen if p not in listed]:
            del self._seen[gone]  # a file removed and written again is read again
        found = []
        for n in names:
            if not n.endswith((".delta", ".full")):
                continue  # the exporters' temporary files among them
            path = os.path.join(self.directory, n)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            sig = (st.st_size, st.st_mtime_ns, st.st_ino)
            if self._seen.get(path) == sig:
                continue
            self._seen[path] = sig
            try:
                header, arrays = verify_snapshot(path)
            except FileNotFoundError:
                self._seen.pop(path, None)
                continue
            except (OSError, ValueError) as e:  # SnapshotError is a ValueError
                self._refuse(done, path, f"corrupt: {e}")
                continue
            found.append((path, header, arrays))
        return found

    def _progress(self, files: list, done: list) -> None:
        """Apply, in sequence order, what follows the served snapshot among `files` and
        the held deltas; hold a delta whose predecessor has not arrived (it follows a
        newer export than the one served); refuse foreign, corrupt, duplicate and stale
        files."""
        from sampan.rec.snapshot import ServingTable, SnapshotError
        now = time.monotonic()
        fresh = {p for p, _, _ in files}
        # a held file removed from the directory is dropped; one written again is new
        pending = [(p, h, a, since) for p, (h, a, since) in self._held.items()
                   if p not in fresh and os.path.exists(p)]
        pending += [(p, h, a, now) for p, h, a in files]
        pending.sort(key=lambda f: (f[1]["seq"], f[1]["kind"] != "full"))
        held: dict = {}
        for path, header, arrays, since in pending:
            t = self.table
            if header.get("lineage") is None or header.get("lineage") != t.lineage:
                self._refuse(done, path, f"of table lineage {header.get('lineage')}, the "
                                         f"model serves lineage {t.lineage}")
            elif header["kind"] == "full":
                if header["seq"] <= t.seq:
                    done.append((path, "ignored"))  # an older full: the chain starts there
                    continue
                try:
                    new = ServingTable(path, (header, arrays))
                except (SnapshotError, ValueError) as e:
                    self._refuse(done, path, f"corrupt: {e}")
                    continue
                with self._rw.exclusive():
                    self.table = new
                self._applied(done, path, header)
            elif header["seq"] <= t.seq:
                self._refuse(done, path, f"duplicate or stale: export {header['seq']} "
                                         f"after the model already serves {t.seq}")
            elif header["base_seq"] < t.seq:
                self._refuse(done, path, f"stale: it follows export {header['base_seq']}, "
                                         f"older than the served {t.seq}")
            elif header["base_seq"] > t.seq:
                # its predecessor has not arrived (a parallel copy drops files in any
                # order): hold it until the chain reaches it (bounded, see _bound_held)
                held[path] = (header, arrays, since)
                if path not in self._held:
                    done.append((path, "held"))
                    log.info("model %r: holding %s (export %d follows export %d; the model "
                             "serves %d) until the deltas between arrive", self.name,
                             path, header["seq"], header["base_seq"], t.seq)
            else:
                try:
                    with self._rw.exclusive():
                        t.apply_delta(path, (header, arrays))
                except (SnapshotError, ValueError) as e:
                    self._refuse(done, path, str(e))
                    continue
                self._applied(done, path, header)
        self._held = held

    def _applied(self, done: list, path: str, header: dict) -> None:
        with self._stats_lock:
            self.stats["applied_deltas"] += 1
        done.append((path, "applied"))
        log.info("model %r: applied %s export %d (step %d) from %s", self.name,
                 header["kind"], header["seq"], header["step"], path)

    def _refuse(self, done: list, path: str, reason: str) -> None:
        with self._stats_lock:
            self.stats["refused_deltas"] += 1
            self.stats["last_refused"] = {"file": os.path.basename(path), "reason": reason}
        done.append((path, f"refused: {reason}"))
        log.warning("model %r: refused snapshot %s: %s; still serving export %d",
                    self.name, path, reason, self.table.seq)


class DLRMModel(ServedModel):
    """A served DLRM; made by the ``dlrm`` kind's loader from a model directory. Clones
    share the table and its watcher and own a Predictor of the dense program each.

    >>> # m = sampan.serving.model.load_model("ctr", "ctr_dir"); m.start()
    >>> # m.infer({"dense_features": x, "sparse_ids": ids})["probability"]  # (B, 1)
    """

    def __init__(self, name: str, directory: str, config: dict):
        from sampan import inference
        from sampan.rec.snapshot import ServingTable

        where = f"model {name!r} ({directory}/config.json)"
        self.n_fields = _int(config, "n_fields", where)
        self.n_dense = _int(config, "n_dense", where)
        mbs = _int(dict(config, max_batch_size=config.get("max_batch_size", 0)),
                   "max_batch_size", where, 0)
        self.features = load_features(config, directory, where, self.n_fields, self.n_dense)
        super().__init__(
            name=name, max_batch_size=mbs, platform="sampan_dlrm", config=config,
            inputs=[TensorSpec(INPUTS[0], "FP32", (-1, self.n_dense)),
                    TensorSpec(INPUTS[1], "INT64", (-1, self.n_fields))]
            if self.features is None else feature_inputs(self.features),
            outputs=[TensorSpec(OUTPUT, "FP32", (-1, 1))])

        def path(key, default):
            p = config.get(key, default)
            if not isinstance(p, str):
                raise ServingError(f"serving: {where}: {key!r} must be a path, got {p!r}")
            return os.path.abspath(os.path.join(directory, p))  # an absolute p stays

        try:
            table = ServingTable(path("embeddings", "embeddings.full"))
            pred = inference.create_predictor(inference.Config(path("dense_program",
                                                                    "dense.program")))
        except (OSError, ValueError) as e:  # SnapshotError and sampan errors included
            raise ServingError(f"serving: {where}: cannot load: {e}") from None
        if table.dim != config.get("dim", table.dim):
            raise ServingError(f"serving: {where}: embeddings have dim {table.dim}, the "
                               f"config says {config['dim']}")
        if len(pred.get_input_names()) != 2 or len(pred.get_output_names()) != 1:
            raise ServingError(f"serving: {where}: the dense program takes "
                               f"{pred.get_input_names()} and gives "
                               f"{pred.get_output_names()}; expected (dense, emb) -> prob")
        interval = config.get("poll_interval_ms", 200)
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) \
                or interval <= 0:
            raise ServingError(f"serving: {where}: poll_interval_ms must be a positive "
                               f"number, got {interval!r}")
        max_held = _int(dict(config, max_held_deltas=config.get("max_held_deltas", 32)),
                        "max_held_deltas", where, 0)
        max_age = config.get("max_held_seconds", 300)
        if not isinstance(max_age, (int, float)) or isinstance(max_age, bool) \
                or not max_age >= 0:
            raise ServingError(f"serving: {where}: max_held_seconds must be a number >= 0, "
                               f"got {max_age!r}")
        watched = path("snapshot_dir", "") if config.get("snapshot_dir") else None
        self.watcher = SnapshotWatcher(table, watched, interval / 1000.0, name,
                                       max_held=max_held, max_held_seconds=max_age)
        self._predictor = pred
        self._run_lock = threading.Lock()  # uncontended when each worker has its clone
        # a few executors of the dense program, not one a batch size (see padding.py)
        self._buckets = buckets(mbs, preferred_sizes(config)) if mbs > 0 else None

    def batch_sizes(self) -> list | None:
        return self._buckets

    def clone(self) -> DLRMModel:
        c = copy.copy(self)
        c._predictor = self._predictor.clone()
        c._run_lock = threading.Lock()
        return c

    def _input(self, inputs: dict, name: str, dtype, width: int) -> np.ndarray:
        a = inputs.get(name)
        if a is None:
            raise ServingError(f"model {self.name!r}: input {name!r} is missing; the model "
                               f"takes {list(INPUTS)}")
        a = np.asarray(a)
        if a.dtype != dtype or a.ndim != 2 or a.shape[1] != width:
            raise ServingError(f"model {self.name!r}: input {name!r} is {a.dtype}"
                               f"{list(a.shape)}, expected {np.dtype(dtype)}[-1, {width}]")
        return np.ascontiguousarray(a)

    def infer(self, inputs: dict) -> dict:
        """``{"dense_features": (B, n_dense) f32, "sparse_ids": (B, n_fields) i64}`` ->
        ``{"probability": (B, 1) f32}``; all B rows see the same snapshot. A model saved
        with a feature spec takes the spec's raw fields instead and transforms them."""
        if self.features is not None:
            inputs = self._transform(inputs)
        extra = sorted(set(inputs) - set(INPUTS))
        if extra:
            raise ServingError(f"model {self.name!r}: unknown input(s) {extra}; the model "
                               f"takes {list(INPUTS)}")
        dense = self._input(inputs, INPUTS[0], np.float32, self.n_dense)
        ids = self._input(inputs, INPUTS[1], np.int64, self.n_fields)
        n = len(ids)
        if len(dense) != n:
            raise ServingError(f"model {self.name!r}: {INPUTS[0]} has {len(dense)} rows, "
                               f"{INPUTS[1]} has {n}; they must agree")
        if not n:
            return {OUTPUT: np.zeros((0, 1), np.float32)}
        emb = self.watcher.lookup(ids)
        return {OUTPUT: self._dense(dense, emb)[:n]}

    def _transform(self, inputs: dict) -> dict:
        """Raw request fields -> the dense features and ids, by the saved feature spec."""
        names = list(self.features.inputs)
        extra = sorted(set(inputs) - set(names))
        if extra:
            raise ServingError(f"model {self.name!r}: unknown input(s) {extra}; the model "
                               f"takes the raw fields {names}")
        try:
            out = self.features.apply({k: inputs[k] for k in names if k in inputs})
            return {INPUTS[0]: out.dense_matrix(), INPUTS[1]: out.ids_matrix()}
        except (TypeError, ValueError) as e:  # sampan errors name the feature and field
            raise ServingError(f"model {self.name!r}: {e}") from None

    def _dense(self, dense: np.ndarray, emb: np.ndarray) -> np.ndarray:
        size = bucket_of(self._buckets, len(dense))
        dense, emb = pad_rows(dense, size), pad_rows(emb, size)  # the caller crops the rows
        with self._run_lock:
            out = self._predictor.run([dense, emb])[0]
        return np.asarray(out, np.float32).reshape(-1, 1)

    def warmup(self) -> None:
        """Compile the dense program for every batch bucket before traffic."""
        for b in self._buckets or (1,):
            self._dense(np.zeros((b, self.n_dense), np.float32),
                        np.zeros((b, self.n_fields, self.watcher.table.dim), np.float32))

    def metadata(self) -> dict:
        """``snapshot_sequence`` (the export served), ``snapshot_step``, the lineage,
        ``applied_deltas``, ``refused_deltas``, ``held_deltas`` (waiting for a missing
        predecessor) and ``last_refused`` (file, reason)."""
        return self.watcher.state()

    def gauges(self) -> dict:
        """The snapshot served and the update counters, for ``/metrics``."""
        st = self.watcher.state()
        return {k: st[k] for k in ("snapshot_sequence", "applied_deltas", "refused_deltas",
                                   "held_deltas")}

    def start(self) -> None:
        self.watcher.start()

    def stop(self) -> None:
        self.watcher.stop()


@register_kind("dlrm")
def load(name: str, directory: str, config: dict) -> DLRMModel:
    """The ``dlrm`` kind's loader (see the module docstring for the directory)."""
    return DLRMModel(name, directory, config)


# -------------------------------------------------------------------- writing a directory
def _dense_layer(model):
    """The DLRM's dense part as a layer of (dense features, looked-up vectors) -> prob."""
    import sampan
    from sampan import nn
    from sampan.ops.sparse import pair_dots

    class DenseDLRM(nn.Layer):
        def __init__(self):
            super().__init__()
            self.bottom, self.top = model.bottom, model.top

        def forward(self, dense, emb):
            x = self.bottom(dense)
            t = sampan.concat([sampan.unsqueeze(x, 1), emb], axis=1)
            return sampan.sigmoid(self.top(sampan.concat([x, pair_dots(t)], axis=1)))

    return DenseDLRM()


def export_dlrm(model, directory: str, *, snapshot_dir: str | None = "deltas",
                max_batch_size: int = 256, dynamic_batching: dict | None = None,
                poll_interval_ms: float = 200, instance_count: int | None = None,
                prune_below: float | None = None, features=None) -> dict:
    """Write a ``dlrm`` model directory from a trained one-shard :class:`sampan.rec.DLRM`:
    the dense part as a saved program, the table's full export, ``config.json``.
    Rows keep the table's ``row_dtype``; ``prune_below`` leaves out near-zero rows
    (``sampan.rec.export_full``), which the server answers with the default vector.

    The full export continues the table's snapshot chain: later
    ``sampan.rec.export_delta(table, f"{directory}/{snapshot_dir}/<name>.delta")`` calls
    reach a running server. With ``features`` (the :class:`sampan.rec.features.FeatureSpec`
    the model trained through) the directory carries the spec (``features.json``) and the
    served model takes the spec's raw fields. Returns the config.

    >>> # cfg = export_dlrm(model, "ctr"); export_delta(table, "ctr/deltas/000001.delta")
    """
    import sampan
    from sampan.io._atomic import write_file
    from sampan.rec.snapshot import export_full

    emb = model.embedding.emb
    if len(emb.shards) != 1:
        raise ServingError(f"export_dlrm: the DLRM's table has {len(emb.shards)} shards; a "
                           f"served DLRM reads one table (train with n_shards=1)")
    dim = model.embedding.dim
    n_dense = model.bottom[0].in_features
    pairs = model.top[0].in_features - dim
    k = (1 + math.isqrt(1 + 8 * pairs)) // 2  # the top MLP sees k(k-1)/2 dots, k = F + 1
    if k * (k - 1) // 2 != pairs:
        raise ServingError(f"export_dlrm: the top MLP takes {pairs + dim} features, which "
                           f"is no DLRM's dim {dim} + F(F+1)/2")
    n_fields = k - 1
    os.makedirs(directory, exist_ok=True)
    if snapshot_dir:
        os.makedirs(os.path.join(directory, snapshot_dir), exist_ok=True)
    layer = _dense_layer(model)
    was_training = model.training
    model.eval()
    try:
        ex = (sampan.zeros(2, n_dense), sampan.zeros(2, n_fields, dim))
        sampan.jit.save(layer, os.path.join(directory, "dense.program"), ex,
                        dynamic={"dense": {0: "batch"}, "emb": {0: "batch"}})
    finally:
        model.train(was_training)
    export_full(emb.shards[0].table, os.path.join(directory, "embeddings.full"),
                prune_below=prune_below)
    cfg = {"kind": "dlrm", "n_fields": n_fields, "n_dense": n_dense, "dim": dim,
           "dense_program": "dense.program", "embeddings": "embeddings.full",
           "max_batch_size": max_batch_size, "poll_interval_ms": poll_interval_ms,
           "dynamic_batching": dynamic_batching if dynamic_batching is not None else
           {"max_queue_delay_us": 500, "max_queue_size": 1024, "timeout_ms": 10000}}
    if snapshot_dir:
        cfg["snapshot_dir"] = snapshot_dir
    if features is not None:
        features.save(os.path.join(directory, "features.json"))
        cfg["features"] = "features.json"
        load_features(cfg, directory, "export_dlrm", n_fields, n_dense)  # fits, reads back
    if instance_count is not None:
        cfg["instance_count"] = instance_count
    body = json.dumps(cfg, indent=2, sort_keys=True).encode() + b"\n"
    write_file(os.path.join(directory, "config.json"), lambda f: f.write(body))
    return cfg


# The demo DLRM: small enough to train in about a second, W4's click stream shape scaled down.
DEMO = {"n_fields": 8, "n_dense": 4, "dim": 8, "bottom": (16, 8), "top": (32,)}


def demo_inputs(batch_size: int, seed: int = 0) -> dict:
    """Request inputs for the demo DLRM: ``batch_size`` click-stream samples (rows of
    ``dense_features`` and ``sparse_ids``), deterministic in `seed`.

    >>> sorted(demo_inputs(2))
    ['dense_features', 'sparse_ids']
    """
    from sampan.rec.data import ClickStream
    b = ClickStream(seed=0, n_fields=DEMO["n_fields"],
                    n_dense=DEMO["n_dense"]).batch(10**6 + seed, batch_size)
    return {INPUTS[0]: b.dense, INPUTS[1]: b.ids_matrix()}


def export_demo_dlrm(directory: str, steps: int = 20, n_deltas: int = 3) -> None:
    """Train the small demo DLRM `steps` steps on the synthetic click stream and write a
    servable ``dlrm`` directory (watching ``deltas/``), plus `n_deltas` later exports,
    each after a few more steps, in ``spare_deltas/`` (``000001.delta`` ...): move them
    into ``deltas/`` (``os.replace``, in order) to update a running server.

    >>> # export_demo_dlrm("demo_dlrm"); sampan serve --model ctr=demo_dlrm
    """
    import sampan
    from sampan.rec.data import ClickStream
    from sampan.rec.models import DLRM, train_step
    from sampan.rec.snapshot import export_delta

    sampan.manual_seed(0)
    model = DLRM(**DEMO)
    opt = sampan.optim.Adagrad(model.parameters(), lr=0.05)
    stream = ClickStream(seed=0, n_fields=DEMO["n_fields"], n_dense=DEMO["n_dense"])
    i = 0

    def train(n):
        nonlocal i
        for _ in range(n):
            b = stream.batch(i, 256)
            train_step(model, opt, b.ids_matrix(), b.dense, b.labels)
            i += 1

    train(steps)
    export_dlrm(model, directory, max_batch_size=128,
                dynamic_batching={"max_queue_delay_us": 1000, "max_queue_size": 1024,
                                  "timeout_ms": 10000})
    spare = os.path.join(directory, "spare_deltas")
    os.makedirs(spare, exist_ok=True)
    table = model.embedding.emb.shards[0].table
    for _ in range(n_deltas):
        train(2)
        seq = table.export_seq + 1
        export_delta(table, os.path.join(spare, f"{seq:06d}.delta"))
