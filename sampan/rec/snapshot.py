"""Embedding snapshots: full exports, incremental deltas, restore, and a serving reader.

File layout (one file per export; read and written by `snapshot_file`)::

    b"SMPNEMB\\0" | u32 format version | u64 header length | header (JSON) | arrays | sha256

The trailing sha256 covers every byte before it, so truncation or a flipped bit anywhere
is caught before a single array is used. Files are written to a temporary name, fsynced,
and renamed into place, so a reader never sees half a file (``sampan.io._atomic``, whose
next write also removes the temporaries of writes that were killed).

The reader checks the prelude before reading further, checks the header's claims about
its arrays against the file size, and reads each array straight into its own buffer while
hashing, so a foreign file costs a few bytes and a snapshot about its own size.

An export copies ids, weights, optimiser slots and metadata inside the table lock: all of
them come from the same step. A delta holds the rows written since the previous export
(the table's dirty bits) and the ids evicted since then whose rows that export held (so
the eviction log is bounded by the table's size); each export records its sequence
number, the one it follows and the table's random ``lineage`` id, and a shard file also
its shard index and count. Restore and :class:`ServingTable` refuse a broken chain, a
delta of another table and a shard file in another shard's place.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from sampan import _recorder as _rec
from sampan.rec.dynwidth import DynamicWidthRows, dynamic_kwargs
from sampan.rec.hashtable import HashMap, hash_ids
from sampan.rec.snapshot_file import (FORMAT_VERSION, MAGIC, SnapshotError,  # noqa: F401
                                      _write_atomic, read_snapshot)
from sampan.rec.rowstore import make_rows
from sampan.rec.snapshot_check import _check_file, _want  # noqa: F401
from sampan.rec.table import META_FIELDS, HashEmbeddingTable

__all__ = [
    "ServingTable",
    "SnapshotError",
    "export_delta",
    "export_full",
    "export_sharded",
    "read_snapshot",
    "reshard",
    "restore",
    "restore_sharded",
    "table_state",
    "verify_snapshot",
]


def _capture(table: HashEmbeddingTable, rows: np.ndarray, ids: np.ndarray) -> dict:
    raw = table.weights.raw(rows)  # the stored form: compressed rows stay compressed
    arrays = {"ids": ids, "weights": raw["values"]}
    for name in ("scale", "width"):  # int8 scale; per-row widths (dynwidth)
        if name in raw:
            arrays[f"weights.{name}"] = raw[name]
    if table.slots is not None:
        arrays["slots"] = table.slots.gather(rows)
    for f in META_FIELDS:
        arrays[f"meta.{f}"] = table.meta[f][rows]
    return arrays


def _config(table: HashEmbeddingTable) -> dict:
    cfg = {"dim": table.dim, "seed": table.seed, "init_std": table.init_std,
           "default": table.default.tolist(), "chunk_shift": table.weights.shift,
           "slot_width": None if table.slots is None else table.slots.width,
           "slot_init": table.slot_init}
    if table.row_dtype != "float32":  # absent: float32, as every file before it
        cfg["row_dtype"] = table.row_dtype
    if getattr(table, "dynamic", False):  # absent: one width, as every file before it
        cfg.update(dynamic_kwargs(table.weights))
    return cfg


def _raw(arrays: dict) -> dict:
    """A file's weights in the form ``rowstore`` stores them."""
    raw = {"values": arrays["weights"]}
    for name in ("scale", "width"):
        if f"weights.{name}" in arrays:
            raw[name] = arrays[f"weights.{name}"]
    return raw


def _near_default(table: HashEmbeddingTable, rows: np.ndarray, below: float) -> np.ndarray:
    """Rows whose every weight is within ``below`` of the default vector."""
    if not rows.size:
        return np.zeros(0, np.bool_)
    return np.abs(table.weights.gather(rows) - table.default).max(axis=1) <= below


def _with_disk(table: HashEmbeddingTable, arrays: dict, kind: str, mark=True) -> dict:
    return arrays if table.tier is None else table.tier.with_disk(arrays, kind, mark)


def _take_export(table: HashEmbeddingTable, kind: str,
                 prune_below: float | None = None) -> tuple[dict, dict, dict]:
    """Capture a full or delta export; the caller holds ``table.lock``.

    Clears the dirty bits and eviction log; :func:`_undo_export` puts them back if
    writing the file fails, so the next delta still carries those rows.
    """
    pruned = np.empty(0, np.int64)
    if kind == "full":
        ids, rows = table.map.items()
        if prune_below is not None:
            near = _near_default(table, rows, prune_below)
            pruned, ids, rows = rows[near], ids[~near], rows[~near]
        arrays = _with_disk(table, _capture(table, rows, ids), kind)
        base = None
        seq = 0 if table.export_seq is None else table.export_seq + 1
    else:
        if table.export_seq is None:
            raise SnapshotError("export_delta needs a previous export_full of this table")
        n = table.alloc.next_row
        rows = np.flatnonzero(table.dirty[:n] & table.live[:n])
        arrays = _with_disk(table, _capture(table, rows, table.meta["key"][rows]), kind)
        arrays["removed"] = (np.concatenate(table.evicted) if table.evicted
                             else np.empty(0, np.int64))
        base, seq = table.export_seq, table.export_seq + 1
    header = {"kind": kind, "seq": seq, "base_seq": base, "step": table.step,
              "lineage": table.lineage, "table": _config(table)}
    if prune_below is not None:
        header["pruned"] = {"below": float(prune_below), "rows": int(pruned.size)}
    undo = {"seq": table.export_seq, "evicted": list(table.evicted), "pruned": pruned}
    n = table.alloc.next_row
    table.dirty[:] = False
    # Every live row is now in the chain; only these rows' removal must reach a delta.
    # A failed write leaves more rows marked than the chain holds: a removal entry for an
    # id the reader never had is a no-op, so that errs on the safe side.
    table.exported[:n] = table.live[:n]
    table.exported[pruned] = False  # no reader holds them: their removal needs no entry
    table.evicted.clear()
    table.export_seq = seq
    return header, arrays, undo


def _undo_export(table: HashEmbeddingTable, arrays: dict, undo: dict) -> None:
    with table.lock:
        rows = table.map.get(arrays["ids"])
        table.dirty[rows[rows >= 0]] = True
        if table.tier is not None:
            table.tier.mark_dirty(arrays["ids"][rows < 0])
        table.dirty[undo.get("pruned", rows[:0])] = True
        table.evicted[:0] = undo["evicted"]
        table.export_seq = undo["seq"]


def _export(table: HashEmbeddingTable, path: str, kind: str, prune_below=None) -> dict:
    with _rec.span("snapshot_export", "rec", kind=kind, path=os.path.basename(path)):
        return _export_one(table, path, kind, prune_below)


def _export_one(table: HashEmbeddingTable, path: str, kind: str, prune_below=None) -> dict:
    with table.lock:
        header, arrays, undo = _take_export(table, kind, prune_below)
    try:
        _write_atomic(path, header, arrays)
    except BaseException:
        _undo_export(table, arrays, undo)
        raise
    return header


def export_full(table: HashEmbeddingTable, path: str,
                prune_below: float | None = None) -> dict:
    """Write every row (weights, slots, metadata) at one consistent step; returns header.

    The header names the table's ``lineage``; its deltas name the same one. Rows are
    written as the table stores them (``row_dtype``). ``prune_below`` (for serving)
    leaves out rows whose weights are all within that of the default vector, which a
    :class:`ServingTable` then answers with the default; the header records how many
    (``pruned``), and :func:`restore` refuses such a file (those rows are gone).

    >>> # export_full(table, "emb.full")["lineage"] == table.lineage
    """
    if prune_below is not None and not prune_below >= 0:
        raise SnapshotError(f"export_full: prune_below must be >= 0, got {prune_below!r}")
    return _export(table, path, "full", prune_below)


def export_delta(table: HashEmbeddingTable, path: str) -> dict:
    """Write rows written and ids evicted since the previous export; returns header.

    >>> # export_delta(table, "emb.d1")["base_seq"]  # the export it follows
    """
    return _export(table, path, "delta")


def export_sharded(emb, directory: str, kind: str = "full") -> dict:
    """Export every shard of a ShardedEmbedding at one consistent cut.

    All shard locks are held while the shards are captured, so no push lands between
    two shards' copies. Writes ``shard_<i>.<seq>.<kind>`` files, each naming its shard
    index, the shard count and its table's lineage, and then, atomically,
    ``manifest.<seq>.json`` naming them; returns the manifest.

    >>> # export_sharded(emb, "snap/", "full")["files"][0] == "shard_0.0.full"
    """
    if kind not in ("full", "delta"):
        raise ValueError(f"kind must be 'full' or 'delta', got {kind!r}")
    with _rec.span("snapshot_export", "rec", kind=kind, shards=len(emb.shards)):
        return _export_sharded(emb, directory, kind)


def _export_sharded(emb, directory: str, kind: str) -> dict:
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
            header["shard"] = {"index": i, "count": len(tables)}
            name = f"shard_{i}.{seq}.{kind}"
            _write_atomic(os.path.join(directory, name), header, arrays)
            files.append(name)
    except BaseException:
        for t, (_, arrays, undo) in zip(tables, taken):
            _undo_export(t, arrays, undo)
        raise
    manifest = {"kind": kind, "seq": seq, "n_shards": len(tables), "files": files,
                "steps": [h["step"] for h, _, _ in taken],
                "lineages": [h["lineage"] for h, _, _ in taken]}
    _write_atomic(os.path.join(directory, f"manifest.{seq}.json"), manifest, {})
    return manifest


def _check_shard(path: str, header: dict, index: int, count: int, lineage) -> None:
    if header["format_version"] < 2:  # version 1 wrote no shard fields; the manifest orders
        return
    got = header.get("shard")
    if got != {"index": index, "count": count}:
        where = "no shard index" if got is None else \
            f"shard {got.get('index')} of {got.get('count')}"
        raise SnapshotError(f"{path}: file holds {where}, the manifest puts it at shard "
                            f"{index} of {count} (shard files swapped or mixed)")
    if lineage is not None and header.get("lineage") != lineage:
        raise SnapshotError(f"{path}: table lineage {header.get('lineage')}, the manifest "
                            f"names {lineage} for shard {index}")


def restore_sharded(directory: str, seqs, n_shards: int | None = None, **shard_kwargs):
    """Tables of every shard from manifests ``seqs`` (a full one, then deltas), in order.

    Returns one restored :class:`HashEmbeddingTable` per shard; wrap them in
    ``LocalShard`` s to serve or train. Every file must sit at the shard index and shard
    count it records. ``n_shards`` other than the exported count re-hashes every row
    onto that many new tables (:func:`reshard`).

    >>> # tables = restore_sharded("snap/", [0, 1]); len(tables) == emb_shards
    """
    manifests = []
    for q in seqs:
        path = os.path.join(directory, f"manifest.{q}.json")
        m = read_snapshot(path)[0]
        if not isinstance(m.get("files"), list) or m.get("n_shards") != len(m["files"]):
            raise SnapshotError(f"{path}: not a shard manifest")
        manifests.append(m)
    n = {m["n_shards"] for m in manifests}
    if len(n) != 1:
        raise SnapshotError(f"manifests disagree on the number of shards: {sorted(n)}")
    count = n.pop()
    paths = [[os.path.join(directory, m["files"][i]) for m in manifests]
             for i in range(count)]
    loaded = []
    for i, shard_paths in enumerate(paths):  # verify everything before building anything
        chain = [(p, *read_snapshot(p)) for p in shard_paths]
        for m, (p, h, _) in zip(manifests, chain):
            _check_shard(p, h, i, count, (m.get("lineages") or [None] * count)[i])
        _check_chain(chain)
        loaded.append(chain)
    tables = [_build(chain, shard_kwargs) for chain in loaded]
    if n_shards is not None and n_shards != count:
        return reshard(tables, n_shards, **shard_kwargs)
    return tables


def reshard(tables, n_shards: int, **table_kwargs) -> list[HashEmbeddingTable]:
    """The rows of ``tables`` (weights, slots, metadata) moved onto ``n_shards`` new tables,
    each row on the shard ``ShardedEmbedding.shard_of`` gives its id for that count.

    The new tables start new lineages (their chains begin with the next ``export_full``).

    >>> # three = reshard(restore_sharded("snap/", [0, 1]), 3)
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    t0 = tables[0]
    cfgs = {json.dumps(_config(t), sort_keys=True) for t in tables}
    if len(cfgs) != 1:
        raise SnapshotError(f"reshard: the shards' tables differ in configuration: {cfgs}")
    parts = []
    for t in tables:
        with t.lock:
            ids, rows = t.map.items()
            parts.append(_capture(t, rows, ids))
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    dest = ((hash_ids(arrays["ids"]) >> np.uint64(40)) % np.uint64(n_shards)).astype(np.int64)
    step = max(t.step for t in tables)
    out = []
    for i in range(n_shards):
        sel = np.flatnonzero(dest == i)
        table = HashEmbeddingTable(t0.dim, seed=t0.seed, init_std=t0.init_std,
                                   default=t0.default, chunk_shift=t0.weights.shift,
                                   row_dtype=t0.row_dtype, **dynamic_kwargs(t0.weights),
                                   **table_kwargs)
        if t0.slots is not None:
            table.attach_slots(t0.slots.width, t0.slot_init)
        with table.lock:
            _apply(table, {"step": step, "seq": None}, {k: a[sel] for k, a in arrays.items()},
                   slots=True)
        out.append(table)
    return out


def _check_follows(path: str, header: dict, lineage, seq: int, dim: int, against: str,
                   row_dtype: str = "float32"):
    """A delta continues the chain ``against`` (a file or a serving table) is at."""
    if header["kind"] != "delta":
        raise SnapshotError(f"{path}: a {header['kind']} snapshot where a delta belongs")
    if header["format_version"] < 2:
        raise SnapshotError(f"{path}: format version 1 delta: it names no table lineage, "
                            f"so nothing shows it belongs to {against}; restore the full "
                            f"snapshot alone and export_full again")
    if lineage is None:
        raise SnapshotError(f"{path}: {against} was read from a format version 1 full "
                            f"snapshot, which names no lineage to check deltas against")
    if header.get("lineage") != lineage:
        raise SnapshotError(f"{path}: delta of table lineage {header.get('lineage')}, "
                            f"{against} is of lineage {lineage} (a delta of another table)")
    if header["base_seq"] != seq:
        raise SnapshotError(f"{path}: delta follows export {header['base_seq']}, expected "
                            f"{seq} (deltas missing or out of order)")
    if header["table"]["dim"] != dim:
        raise SnapshotError(f"{path}: dim {header['table']['dim']}, {against} has dim {dim}")
    if header["table"].get("row_dtype", "float32") != row_dtype:
        raise SnapshotError(f"{path}: rows of {header['table'].get('row_dtype', 'float32')}, "
                            f"{against} holds {row_dtype} rows")


def _check_chain(loaded: list[tuple[str, dict, dict]]) -> None:
    path0, h0, _ = loaded[0]
    for path, h, arrays in loaded:
        _check_file(path, h, arrays)
    if h0["kind"] != "full":
        raise SnapshotError(f"{path0}: restore must start from a full snapshot, got a "
                            f"{h0['kind']}")
    prev = h0["seq"]
    for path, h, _ in loaded[1:]:
        _check_follows(path, h, h0.get("lineage"), prev, h0["table"]["dim"], path0,
                       h0["table"].get("row_dtype", "float32"))
        prev = h["seq"]


def _apply(table: HashEmbeddingTable, header: dict, arrays: dict, slots: bool) -> None:
    if "removed" in arrays and arrays["removed"].size:
        table.remove(arrays["removed"])
    ids = arrays["ids"]
    if table.tier is not None:
        table.tier.load_snapshot(arrays, slots)  # RAM to the budget, the rest to disk
        table.step, table.export_seq = header["step"], header["seq"]
        return
    rows, _ = table.map.get_or_insert(ids, table.alloc)
    table._grow()
    table.weights.set_raw(rows, _raw(arrays))
    if table.slots is not None:
        # Slots written under an older optimiser configuration were reset when the live
        # table attached the new one: such rows hold the initial value.
        table.slots.scatter(rows, arrays["slots"] if slots and "slots" in arrays else
                            np.full((rows.size, table.slots.width), table.slot_init,
                                    np.float32))
    for f in META_FIELDS:
        table.meta[f][rows] = arrays[f"meta.{f}"]
    table.live[rows] = True
    table.step = header["step"]
    table.export_seq = header["seq"]


def _build(loaded: list, table_kwargs: dict) -> HashEmbeddingTable:
    """The table a verified chain describes."""
    cfg, last = loaded[0][1]["table"], loaded[-1][1]["table"]
    table = HashEmbeddingTable(cfg["dim"], seed=cfg["seed"], init_std=cfg["init_std"],
                               default=cfg["default"], chunk_shift=cfg["chunk_shift"],
                               row_dtype=cfg.get("row_dtype", "float32"),
                               **dynamic_kwargs(cfg), **table_kwargs)
    if last["slot_width"] is not None:
        table.attach_slots(last["slot_width"], last["slot_init"])
    # files from `first` on share the final slot layout; earlier slots were reset since
    slot_key = [(h["table"]["slot_width"], h["table"]["slot_init"]) for _, h, _ in loaded]
    first = len(loaded) - 1
    while first > 0 and slot_key[first - 1] == slot_key[-1]:
        first -= 1
    with table.lock:
        for i, (_, header, arrays) in enumerate(loaded):
            _apply(table, header, arrays, slots=i >= first)
        n = table.alloc.next_row
        table.dirty[:] = False
        table.exported[:n] = table.live[:n]
        table.evicted.clear()
        if loaded[0][1].get("lineage") is not None:
            table.lineage = loaded[0][1]["lineage"]
        else:  # version 1: a new lineage, whose chain starts at the next export_full
            table.export_seq = None
    return table


def restore(full_path: str, delta_paths=(), **table_kwargs) -> HashEmbeddingTable:
    """A new table equal to the one exported: full snapshot plus deltas, in order.

    Every file is read and verified before the table is built, so a damaged file, a
    delta of another table (lineage) or a broken chain raises :class:`SnapshotError` and
    nothing is loaded. The restored table keeps the lineage and continues the chain.

    >>> # t = restore("emb.full", ["emb.d1", "emb.d2"])
    """
    loaded = [(p, *read_snapshot(p)) for p in [full_path, *delta_paths]]
    _check_chain(loaded)
    if loaded[0][1].get("pruned", {}).get("rows"):
        raise SnapshotError(f"{full_path}: a pruned export (for serving: "
                            f"{loaded[0][1]['pruned'].get('rows')} near-zero rows left out) "
                            f"cannot restore a table; restore an export_full without "
                            f"prune_below")
    return _build(loaded, table_kwargs)


def verify_snapshot(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """:func:`read_snapshot` plus the checks of a table file (header fields, array dtypes
    and shapes, unique ids), for a full or a delta: ``(header, arrays)``.

    >>> # header, arrays = verify_snapshot("emb.d1"); header["seq"], header["base_seq"]
    """
    header, arrays = read_snapshot(path)
    _check_file(path, header, arrays)
    return header, arrays


def table_state(table: HashEmbeddingTable) -> dict[str, np.ndarray]:
    """Everything a snapshot holds, sorted by id, for comparing tables bit for bit."""
    with table.lock:
        ids, rows = table.map.items()
        order = np.argsort(ids, kind="stable")
        state = _capture(table, rows[order], ids[order])
        if table.tier is not None:  # the disk rows too, all in one id order
            state = _with_disk(table, state, "full", mark=False)
            order = np.argsort(state["ids"], kind="stable")
            state = {k: v[order] for k, v in state.items()}
        state["step"] = np.array([table.step])
    return state


class ServingTable:
    """Read-only lookups from an exported snapshot, updatable with deltas while serving.

    A delta is verified completely (checksum, lineage, sequence, dimension, array
    shapes) before any of it is applied, and applied under a lock that lookups share,
    so a reader sees the table before or after a delta, never half; a refused delta
    leaves the table as it was.

    >>> # ServingTable("emb.full").lookup([1, 2, 3]) -> (3, dim) float32
    """

    def __init__(self, full_path: str, loaded: tuple[dict, dict] | None = None):
        header, arrays = read_snapshot(full_path) if loaded is None else loaded
        _check_chain([(full_path, header, arrays)])
        cfg = header["table"]
        self.dim = cfg["dim"]
        self.default = np.asarray(cfg["default"], np.float32)
        self.lineage = header.get("lineage")
        self.map = HashMap(max(len(arrays["ids"]), 1024))
        self.row_dtype = cfg.get("row_dtype", "float32")
        self.pruned = header.get("pruned", {}).get("rows", 0)  # rows left out at export
        self.rows = make_rows(self.dim, cfg["chunk_shift"], self.row_dtype) \
            if "dynamic_dims" not in cfg else DynamicWidthRows(
                self.dim, cfg["chunk_shift"], cfg["dynamic_dims"], cfg["dim_thresholds"])
        self.free: list[np.ndarray] = []
        self.next_row = 0
        self.lock = threading.Lock()
        self.seq = header["seq"]
        self.step = header["step"]
        self._upsert(arrays["ids"], _raw(arrays))

    def __len__(self) -> int:
        return len(self.map)

    @property
    def bytes_per_row(self) -> int:
        """Bytes one served row's weights take (as stored: ``row_dtype``)."""
        return self.rows.bytes_per_row

    def info(self) -> dict:
        """Rows served, their dtype and bytes per row, rows pruned at export."""
        return {"embedding_rows": len(self), "embedding_row_dtype": self.row_dtype,
                "embedding_bytes_per_row": self.bytes_per_row,
                "embedding_pruned_rows": self.pruned}

    def _upsert(self, ids: np.ndarray, raw: dict) -> None:
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
        self.rows.set_raw(rows, raw)

    def apply_delta(self, path: str, loaded: tuple[dict, dict] | None = None) -> None:
        """Verify a delta completely, then apply it atomically with respect to lookups.

        ``loaded``: what :func:`verify_snapshot` returned for `path`, so a server can read
        the file outside its own locks (sequence, lineage and dimension are checked here
        either way)."""
        header, arrays = verify_snapshot(path) if loaded is None else loaded
        ids, removed = arrays["ids"], arrays["removed"]
        with self.lock:  # the sequence check too, so two appliers cannot both pass it
            _check_follows(path, header, self.lineage, self.seq, self.dim,
                           "the serving table", self.row_dtype)
            # Allocate up front: past this point only the writes below remain.
            self.map.reserve(ids.size)
            self.rows.ensure(self.next_row + ids.size)
            old = self.map.remove(removed) if removed.size else None
            if old is not None and (old >= 0).any():
                self.free.append(old[old >= 0])
            self._upsert(ids, _raw(arrays))
            self.seq, self.step = header["seq"], header["step"]

    def lookup(self, ids) -> np.ndarray:
        """Vectors for ids (default vector where absent), shape ``ids.shape + (dim,)``."""
        shape = np.shape(ids)
        with self.lock:
            rows = self.map.get(ids)
            out = self.rows.gather(rows)
        out[rows < 0] = self.default
        return out.reshape(shape + (self.dim,))
