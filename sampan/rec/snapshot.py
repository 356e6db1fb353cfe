"""Embedding snapshots: full exports, incremental deltas, restore, and a serving reader.

File layout (one file per export)::

    b"SMPNEMB\\0" | u32 format version | u64 header length | header (JSON) | arrays | sha256

The trailing sha256 covers every byte before it, so truncation or a flipped bit anywhere
is caught before a single array is used. Files are written to a temporary name, fsynced,
and renamed into place, so a reader never sees half a file.

An export copies ids, weights, optimiser slots and metadata inside the table lock: all of
them come from the same step. A delta holds the rows written since the previous export
(the table's dirty bits) and the ids evicted since then; each export records its
sequence number and the one it follows, and restore refuses a broken chain.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading

import numpy as np

from sampan.rec.hashtable import ChunkedRows, HashMap
from sampan.rec.table import META_FIELDS, HashEmbeddingTable

__all__ = [
    "ServingTable",
    "SnapshotError",
    "export_delta",
    "export_full",
    "export_sharded",
    "read_snapshot",
    "restore",
    "restore_sharded",
    "table_state",
]

MAGIC = b"SMPNEMB\0"
FORMAT_VERSION = 1
_PRE = struct.Struct("<8sIQ")


class SnapshotError(ValueError):
    """A snapshot file is damaged, of an unknown version, or out of sequence."""


def _write_atomic(path: str, header: dict, arrays: dict[str, np.ndarray]) -> None:
    specs, offset = [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        arrays[name] = a
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape),
                      "offset": offset, "nbytes": a.nbytes})
        offset += a.nbytes
    head = json.dumps({**header, "arrays": specs}, sort_keys=True).encode()
    digest = hashlib.sha256()
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            for chunk in [_PRE.pack(MAGIC, FORMAT_VERSION, len(head)), head,
                          *(memoryview(a).cast("B") for a in arrays.values() if a.nbytes)]:
                f.write(chunk)
                digest.update(chunk)
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_snapshot(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Read and verify one snapshot file: ``(header, arrays)``; raises SnapshotError."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _PRE.size + 32:
        raise SnapshotError(f"{path}: truncated ({len(data)} bytes), not a sampan snapshot")
    magic, version, head_len = _PRE.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError(f"{path}: bad magic {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise SnapshotError(f"{path}: format version {version}, this sampan reads "
                            f"{FORMAT_VERSION}")
    if hashlib.sha256(data[:-32]).digest() != data[-32:]:
        raise SnapshotError(f"{path}: checksum mismatch (file damaged or truncated)")
    start = _PRE.size + head_len
    header = json.loads(data[_PRE.size:start])
    arrays = {}
    for spec in header.pop("arrays"):
        a = np.frombuffer(data, np.dtype(spec["dtype"]), count=int(np.prod(spec["shape"])),
                          offset=start + spec["offset"])
        arrays[spec["name"]] = a.reshape(spec["shape"]).copy()
    return header, arrays


def _capture(table: HashEmbeddingTable, rows: np.ndarray, ids: np.ndarray) -> dict:
    arrays = {"ids": ids, "weights": table.weights.gather(rows)}
    if table.slots is not None:
        arrays["slots"] = table.slots.gather(rows)
    for f in META_FIELDS:
        arrays[f"meta.{f}"] = table.meta[f][rows]
    return arrays


def _config(table: HashEmbeddingTable) -> dict:
    return {"dim": table.dim, "seed": table.seed, "init_std": table.init_std,
            "default": table.default.tolist(), "chunk_shift": table.weights.shift,
            "slot_width": None if table.slots is None else table.slots.width,
            "slot_init": table.slot_init}


def _take_export(table: HashEmbeddingTable, kind: str) -> tuple[dict, dict]:
    """Capture a full or delta export; the caller holds ``table.lock``.

    Clears the dirty bits and eviction log; :func:`_undo_export` puts them back if
    writing the file fails, so the next delta still carries those rows.
    """
    if kind == "full":
        ids, rows = table.map.items()
        arrays = _capture(table, rows, ids)
        base = None
        seq = 0 if table.export_seq is None else table.export_seq + 1
    else:
        if table.export_seq is None:
            raise SnapshotError("export_delta needs a previous export_full of this table")
        n = table.alloc.next_row
        rows = np.flatnonzero(table.dirty[:n] & table.live[:n])
        arrays = _capture(table, rows, table.meta["key"][rows])
        arrays["removed"] = (np.concatenate(table.evicted) if table.evicted
                             else np.empty(0, np.int64))
        base, seq = table.export_seq, table.export_seq + 1
    header = {"kind": kind, "seq": seq, "base_seq": base, "step": table.step,
              "table": _config(table)}
    undo = {"seq": table.export_seq, "evicted": list(table.evicted)}
    table.dirty[:] = False
    table.evicted.clear()
    table.export_seq = seq
    return header, arrays, undo


def _undo_export(table: HashEmbeddingTable, arrays: dict, undo: dict) -> None:
    with table.lock:
        rows = table.map.get(arrays["ids"])
        table.dirty[rows[rows >= 0]] = True
        table.evicted[:0] = undo["evicted"]
        table.export_seq = undo["seq"]


def _export(table: HashEmbeddingTable, path: str, kind: str) -> dict:
    with table.lock:
        header, arrays, undo = _take_export(table, kind)
    try:
        _write_atomic(path, header, arrays)
    except BaseException:
        _undo_export(table, arrays, undo)
        raise
    return header


def export_full(table: HashEmbeddingTable, path: str) -> dict:
    """Write every row (weights, slots, metadata) at one consistent step; returns header."""
    return _export(table, path, "full")


def export_delta(table: HashEmbeddingTable, path: str) -> dict:
    """Write rows written and ids evicted since the previous export; returns header."""
    return _export(table, path, "delta")


def export_sharded(emb, directory: str, kind: str = "full") -> dict:
    """Export every shard of a ShardedEmbedding at one consistent cut.

    All shard locks are held while the shards are captured, so no push lands between
    two shards' copies. Writes ``shard_<i>.<seq>.<kind>`` files and then, atomically,
    ``manifest.<seq>.json`` naming them; returns the manifest.
    """
    if kind not in ("full", "delta"):
        raise ValueError(f"kind must be 'full' or 'delta', got {kind!r}")
    tables = [sh.table for sh in emb.shards]
    for t in tables:
        t.lock.acquire()
    try:
        taken = [_take_export(t, kind) for t in tables]
    finally:
        for t in reversed(tables):
            t.lock.release()
    os.makedirs(directory, exist_ok=True)
    seq = taken[0][0]["seq"]
    files = []
    try:
        for i, (header, arrays, _) in enumerate(taken):
            name = f"shard_{i}.{seq}.{kind}"
            _write_atomic(os.path.join(directory, name), header, arrays)
            files.append(name)
    except BaseException:
        for t, (_, arrays, undo) in zip(tables, taken):
            _undo_export(t, arrays, undo)
        raise
    manifest = {"kind": kind, "seq": seq, "n_shards": len(tables), "files": files,
                "steps": [h["step"] for h, _, _ in taken]}
    _write_atomic(os.path.join(directory, f"manifest.{seq}.json"), manifest, {})
    return manifest


def restore_sharded(directory: str, seqs, **shard_kwargs):
    """Tables of every shard from manifests ``seqs`` (a full one, then deltas), in order.

    Returns one restored :class:`HashEmbeddingTable` per shard; wrap them in
    ``LocalShard`` s to serve or train.
    """
    manifests = [read_snapshot(os.path.join(directory, f"manifest.{q}.json"))[0]
                 for q in seqs]
    n = {m["n_shards"] for m in manifests}
    if len(n) != 1:
        raise SnapshotError(f"manifests disagree on the number of shards: {sorted(n)}")
    paths = [[os.path.join(directory, m["files"][i]) for m in manifests]
             for i in range(n.pop())]
    for shard_paths in paths:  # verify everything before building anything
        _check_chain([(p, *read_snapshot(p)) for p in shard_paths])
    return [restore(p[0], p[1:], **shard_kwargs) for p in paths]


def _check_chain(loaded: list[tuple[str, dict, dict]]) -> None:
    path0, h0, _ = loaded[0]
    if h0["kind"] != "full":
        raise SnapshotError(f"{path0}: restore must start from a full snapshot, got a "
                            f"{h0['kind']}")
    prev = h0["seq"]
    for path, h, _ in loaded[1:]:
        if h["kind"] != "delta" or h["base_seq"] != prev:
            raise SnapshotError(f"{path}: delta follows export {h['base_seq']}, expected "
                                f"{prev} (deltas missing or out of order)")
        if h["table"]["dim"] != h0["table"]["dim"]:
            raise SnapshotError(f"{path}: dim {h['table']['dim']} != {h0['table']['dim']}")
        prev = h["seq"]


def _apply(table: HashEmbeddingTable, header: dict, arrays: dict) -> None:
    if "removed" in arrays and arrays["removed"].size:
        table.remove(arrays["removed"])
    ids = arrays["ids"]
    rows, _ = table.map.get_or_insert(ids, table.alloc)
    table._grow()
    table.weights.scatter(rows, arrays["weights"])
    if "slots" in arrays:
        table.slots.scatter(rows, arrays["slots"])
    for f in META_FIELDS:
        table.meta[f][rows] = arrays[f"meta.{f}"]
    table.live[rows] = True
    table.step = header["step"]
    table.export_seq = header["seq"]


def restore(full_path: str, delta_paths=(), **table_kwargs) -> HashEmbeddingTable:
    """A new table equal to the one exported: full snapshot plus deltas, in order.

    Every file is read and verified before the table is built, so a damaged file raises
    :class:`SnapshotError` and nothing is loaded.
    """
    loaded = [(p, *read_snapshot(p)) for p in [full_path, *delta_paths]]
    _check_chain(loaded)
    cfg = loaded[0][1]["table"]
    table = HashEmbeddingTable(cfg["dim"], seed=cfg["seed"], init_std=cfg["init_std"],
                               default=cfg["default"], chunk_shift=cfg["chunk_shift"],
                               **table_kwargs)
    if cfg["slot_width"] is not None:
        table.attach_slots(cfg["slot_width"], cfg["slot_init"])
    with table.lock:
        for _, header, arrays in loaded:
            _apply(table, header, arrays)
        table.dirty[:] = False
        table.evicted.clear()
    return table


def table_state(table: HashEmbeddingTable) -> dict[str, np.ndarray]:
    """Everything a snapshot holds, sorted by id, for comparing tables bit for bit."""
    with table.lock:
        ids, rows = table.map.items()
        order = np.argsort(ids, kind="stable")
        state = _capture(table, rows[order], ids[order])
        state["step"] = np.array([table.step])
    return state


class ServingTable:
    """Read-only lookups from an exported snapshot, updatable with deltas while serving.

    A delta is verified completely before any of it is applied, and applied under a lock
    that lookups share, so a reader sees the table before or after a delta, never half.

    >>> # ServingTable("emb.full").lookup([1, 2, 3]) -> (3, dim) float32
    """

    def __init__(self, full_path: str):
        header, arrays = read_snapshot(full_path)
        _check_chain([(full_path, header, arrays)])
        cfg = header["table"]
        self.dim = cfg["dim"]
        self.default = np.asarray(cfg["default"], np.float32)
        self.map = HashMap(max(len(arrays["ids"]), 1024))
        self.rows = ChunkedRows(self.dim, cfg["chunk_shift"])
        self.free: list[np.ndarray] = []
        self.next_row = 0
        self.lock = threading.Lock()
        self.seq = header["seq"]
        self.step = header["step"]
        self._upsert(arrays["ids"], arrays["weights"])

    def __len__(self) -> int:
        return len(self.map)

    def _upsert(self, ids: np.ndarray, weights: np.ndarray) -> None:
        rows = self.map.get(ids)
        new = rows < 0
        n_new = int(new.sum())
        reuse = np.concatenate(self.free) if self.free else np.empty(0, np.int64)
        take = reuse[:n_new]
        fresh = np.arange(self.next_row, self.next_row + n_new - take.size, dtype=np.int64)
        self.next_row += fresh.size
        self.free = [reuse[n_new:]] if reuse.size > n_new else []
        rows[new] = np.concatenate([take, fresh])
        self.map.put(ids[new], rows[new])
        self.rows.ensure(self.next_row)
        self.rows.scatter(rows, weights)

    def apply_delta(self, path: str) -> None:
        """Verify a delta and apply it atomically with respect to lookups."""
        header, arrays = read_snapshot(path)
        if header["kind"] != "delta" or header["base_seq"] != self.seq:
            raise SnapshotError(f"{path}: {header['kind']} following export "
                                f"{header['base_seq']}, serving table is at {self.seq}")
        with self.lock:
            old = self.map.remove(arrays["removed"]) if arrays["removed"].size else None
            if old is not None and (old >= 0).any():
                self.free.append(old[old >= 0])
            self._upsert(arrays["ids"], arrays["weights"])
            self.seq, self.step = header["seq"], header["step"]

    def lookup(self, ids) -> np.ndarray:
        """Vectors for ids (default vector where absent), shape ``ids.shape + (dim,)``."""
        shape = np.shape(ids)
        with self.lock:
            rows = self.map.get(ids)
            out = self.rows.gather(rows)
        out[rows < 0] = self.default
        return out.reshape(shape + (self.dim,))
