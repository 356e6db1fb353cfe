"""Trust in rec: snapshot lineage, atomic serving deltas, strict Parquet input, bounded memory.

Each test states the property it checks against an independent reference (the live
table, plain numpy, or pyarrow itself), not against sampan's own output.
"""

import json
import os
import struct
import tracemalloc

import numpy as np
import pytest

from sampan.errors import SampanError
from sampan.rec.optim import SparseAdagrad, SparseAdam, SparseFTRL, SparseSGD
from sampan.rec.policies import CallableEviction, TTLEviction
from sampan.rec.sharded import ShardedEmbedding
from sampan.rec.snapshot import (
    ServingTable,
    SnapshotError,
    export_delta,
    export_full,
    export_sharded,
    read_snapshot,
    restore,
    restore_sharded,
    table_state,
)
from sampan.rec.table import HashEmbeddingTable


def _trained(dim=4, n=200, seed=0, **kw):
    t = HashEmbeddingTable(dim, seed=seed, **kw)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10**6, n)
    t.lookup(ids, step=0)
    SparseAdagrad(0.1).apply(t, ids, rng.standard_normal((n, dim)), step=0)
    return t


def _same(a, b):
    sa, sb = table_state(a), table_state(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


# -- item 15: lineage --------------------------------------------------------------------


def test_delta_of_another_table_is_refused(tmp_path):
    a, b = _trained(seed=1), _trained(seed=2)
    export_full(a, str(tmp_path / "a.full"))
    export_full(b, str(tmp_path / "b.full"))
    b.lookup([5, 6, 7], step=1)
    export_delta(b, str(tmp_path / "b.d1"))  # seq 1 after seq 0: the chain numbers fit
    with pytest.raises(SnapshotError, match="lineage"):
        restore(str(tmp_path / "a.full"), [str(tmp_path / "b.d1")])
    serving = ServingTable(str(tmp_path / "a.full"))
    with pytest.raises(SnapshotError, match="lineage"):
        serving.apply_delta(str(tmp_path / "b.d1"))
    # the table's own chain still restores to the live table
    _same(restore(str(tmp_path / "b.full"), [str(tmp_path / "b.d1")]), b)


def test_lineage_survives_restore_and_is_recorded_in_every_file(tmp_path):
    a = _trained()
    h0 = export_full(a, str(tmp_path / "full"))
    back = restore(str(tmp_path / "full"))
    assert back.lineage == a.lineage == h0["lineage"]
    assert HashEmbeddingTable(4).lineage != a.lineage
    back.lookup([1, 2], step=3)
    h1 = export_delta(back, str(tmp_path / "d1"))  # the restored table continues the chain
    assert h1["lineage"] == a.lineage
    a2 = restore(str(tmp_path / "full"), [str(tmp_path / "d1")])
    _same(a2, back)


def _sharded(tmp_path):
    emb = ShardedEmbedding(4, n_shards=3, optimizer_factory=lambda: SparseAdagrad(0.1))
    rng = np.random.default_rng(0)
    for step in range(2):
        uniq, _, vec = emb.pull(rng.integers(0, 500, 300), step)
        emb.push(uniq, np.ones_like(vec), step)
    export_sharded(emb, str(tmp_path), "full")
    return emb


def test_swapped_shard_files_are_refused(tmp_path):
    emb = _sharded(tmp_path)
    p0, p1 = tmp_path / "shard_0.0.full", tmp_path / "shard_1.0.full"
    tmp = tmp_path / "swap"
    os.replace(p0, tmp)
    os.replace(p1, p0)
    os.replace(tmp, p1)
    with pytest.raises(SnapshotError, match="shard"):
        restore_sharded(str(tmp_path), [0])
    assert read_snapshot(str(p1))[0]["shard"] == {"index": 0, "count": 3}
    emb.close()


def test_shard_count_mismatch_is_refused(tmp_path):
    emb = _sharded(tmp_path)
    other = ShardedEmbedding(4, n_shards=2)
    other.pull(np.arange(50), 0)
    export_sharded(other, str(tmp_path / "two"), "full")
    # a two-shard file put in place of shard 1 of the three-shard export
    os.replace(tmp_path / "two" / "shard_1.0.full", tmp_path / "shard_1.0.full")
    with pytest.raises(SnapshotError, match="shard"):
        restore_sharded(str(tmp_path), [0])
    emb.close()
    other.close()


def _write_v1(path, header, arrays):
    """A version-1 file written by hand from the documented layout (no lineage)."""
    import hashlib

    specs, off, blobs = [], 0, []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape),
                      "offset": off, "nbytes": a.nbytes})
        off += a.nbytes
        blobs.append(a.tobytes())
    head = json.dumps({**header, "arrays": specs}, sort_keys=True).encode()
    body = struct.pack("<8sIQ", b"SMPNEMB\0", 1, len(head)) + head + b"".join(blobs)
    with open(path, "wb") as f:
        f.write(body + hashlib.sha256(body).digest())


def test_version_1_full_reads_and_version_1_delta_is_refused_by_version(tmp_path):
    t = _trained()
    export_full(t, str(tmp_path / "v2"))
    header, arrays = read_snapshot(str(tmp_path / "v2"))
    v1 = {k: v for k, v in header.items() if k not in ("lineage", "format_version")}
    _write_v1(str(tmp_path / "v1.full"), v1, dict(arrays))
    back = restore(str(tmp_path / "v1.full"))
    _same(back, t)
    assert back.lineage != t.lineage  # a version-1 file names no lineage: a new one
    with pytest.raises(SnapshotError, match="export_full"):
        export_delta(back, str(tmp_path / "x"))  # no chain of the new lineage yet
    delta = {**v1, "kind": "delta", "seq": 1, "base_seq": 0}
    _write_v1(str(tmp_path / "v1.d1"), delta, {**arrays, "removed": np.empty(0, np.int64)})
    with pytest.raises(SnapshotError, match="version 1"):
        restore(str(tmp_path / "v1.full"), [str(tmp_path / "v1.d1")])
    with pytest.raises(SnapshotError, match="version 9"):
        raw = bytearray(open(tmp_path / "v2", "rb").read())
        raw[8:12] = struct.pack("<I", 9)
        (tmp_path / "v9").write_bytes(bytes(raw))
        read_snapshot(str(tmp_path / "v9"))


def test_restore_of_a_delta_with_slots_after_a_full_without_them(tmp_path):
    t = HashEmbeddingTable(4)
    t.lookup(np.arange(20), step=0)
    export_full(t, str(tmp_path / "full"))  # before the optimiser attached slots
    SparseAdagrad(0.1, initial_accumulator_value=0.5).apply(t, np.arange(5), np.ones((5, 4)))
    export_delta(t, str(tmp_path / "d1"))
    _same(restore(str(tmp_path / "full"), [str(tmp_path / "d1")]), t)


# -- item 16: atomic ServingTable.apply_delta -------------------------------------------


def test_failed_delta_leaves_the_serving_table_unchanged(tmp_path):
    t = _trained(dim=4)
    export_full(t, str(tmp_path / "full"))
    serving = ServingTable(str(tmp_path / "full"))
    t.remove(t.ids()[:50])
    t.lookup(np.arange(10**7, 10**7 + 80), step=1)
    export_delta(t, str(tmp_path / "d1"))
    header, arrays = read_snapshot(str(tmp_path / "d1"))
    # the same delta, rewritten as if of another dimension (weights 8 wide)
    from sampan.rec.snapshot import _write_atomic

    bad = dict(arrays)
    bad["weights"] = np.concatenate([arrays["weights"], arrays["weights"]], axis=1)
    bad_header = {k: v for k, v in header.items() if k != "format_version"}
    bad_header["table"] = {**header["table"], "dim": 8, "default": [0.0] * 8}
    _write_atomic(str(tmp_path / "bad"), bad_header, bad)
    probe = np.concatenate([t.ids(), np.arange(10**6), np.arange(10**7, 10**7 + 80)])
    before = serving.lookup(probe)
    n_before, seq_before = len(serving), serving.seq
    with pytest.raises(SnapshotError, match="dim"):
        serving.apply_delta(str(tmp_path / "bad"))
    np.testing.assert_array_equal(serving.lookup(probe), before)
    assert (len(serving), serving.seq) == (n_before, seq_before)
    # a delta whose weights disagree with its ids in length is refused the same way
    bad2 = dict(arrays)
    bad2["weights"] = arrays["weights"][:-3]
    _write_atomic(str(tmp_path / "bad2"), {**bad_header, "table": header["table"]}, bad2)
    with pytest.raises(SnapshotError, match="weights"):
        serving.apply_delta(str(tmp_path / "bad2"))
    np.testing.assert_array_equal(serving.lookup(probe), before)
    # the good delta then applies and serves exactly what the live table reads
    serving.apply_delta(str(tmp_path / "d1"))
    np.testing.assert_array_equal(serving.lookup(probe), t.read(probe))


# -- item 19: strict Parquet input, integer ids ------------------------------------------


def _pq(path, **cols):
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = {"label": pa.array([1.0, 0.0, 1.0], pa.float32()),
            "dense_0": pa.array([0.5, 1.5, 2.5], pa.float32()),
            "sparse_0": pa.array([1, 2, 3], pa.int64()),
            "sparse_1": pa.array([7, 8, 9], pa.int64())}
    base.update(cols)
    pq.write_table(pa.table({k: v for k, v in base.items() if v is not None}), str(path))
    return str(path)


def _read(path, **kw):
    from sampan.rec.data import ParquetCTRReader

    return list(ParquetCTRReader(path, batch_size=8, shuffle_buffer=0, background=False, **kw))


@pytest.mark.parametrize("column, values, match", [
    ("sparse_0", ("float64", [1.5, 2.0, 3.0]), "sparse_0.*double"),
    ("sparse_0", ("bool_", [True, False, True]), "sparse_0.*bool"),
    ("sparse_0", ("string", ["1", "2", "3"]), "sparse_0.*string"),
    ("sparse_0", ("int64", [1, None, 3]), "sparse_0.*null"),
    ("sparse_0", ("uint64", [1, 2**63 + 5, 3]), "sparse_0.*2\\^63"),
    ("label", ("float32", [1.0, None, 0.0]), "label.*null"),
    ("label", ("float32", [1.0, 2.0, 0.0]), "label.*\\[0, 1\\]"),
    ("label", ("string", ["1", "0", "1"]), "label.*string"),
    ("dense_0", ("float32", [0.5, None, 1.0]), "dense_0.*null"),
])
def test_bad_parquet_columns_are_refused_by_name(tmp_path, column, values, match):
    import pyarrow as pa

    typ, vals = values
    path = _pq(tmp_path / "bad.parquet", **{column: pa.array(vals, getattr(pa, typ)())})
    with pytest.raises(SampanError, match=match) as info:
        _read(path)
    assert "bad.parquet" in str(info.value)


def test_sparse_columns_are_matched_by_name_not_position(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    a = _pq(tmp_path / "a.parquet")
    t = pq.read_table(a)
    swapped = pa.table({n: t[n] for n in ["sparse_1", "label", "sparse_0", "dense_0"]})
    pq.write_table(swapped, str(tmp_path / "b.parquet"))
    (ba,), (bb,) = _read(a), _read(str(tmp_path / "b.parquet"))
    for b in (ba, bb):  # field 0 is sparse_0 in both files
        by_dense = dict(zip(b.dense[:, 0].tolist(), b.ids_matrix().tolist()))
        assert by_dense == {0.5: [1, 7], 1.5: [2, 8], 2.5: [3, 9]}
    missing = _pq(tmp_path / "c.parquet", sparse_1=None)
    with pytest.raises(SampanError, match="c.parquet.*sparse_1"):
        _read([a, missing])


def test_parquet_is_written_and_read_with_page_checksums(tmp_path):
    import pyarrow.parquet as pq

    from sampan.rec.data import ClickStream, write_parquet

    path = str(tmp_path / "w.parquet")
    write_parquet(path, [ClickStream(seed=0, n_fields=3, n_dense=2).batch(0, 64)])
    meta = pq.ParquetFile(path).metadata
    assert meta.num_rows == 64
    data = bytearray(open(path, "rb").read())
    # a flipped byte inside the first data page (past the 4-byte magic) must be caught
    col = meta.row_group(0).column(0)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data[start + col.total_compressed_size - 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(Exception, match="(?i)crc|checksum"):
        _read(path)


@pytest.mark.parametrize("bad", [np.array([1.7, 2.2]), np.array([True, False]),
                                 np.array([2**63 + 1], np.uint64), np.array(["1", "2"])])
def test_tables_and_sparse_optimisers_refuse_non_integer_ids(bad):
    t = HashEmbeddingTable(2)
    for call in (lambda: t.lookup(bad), lambda: t.rows_for(bad), lambda: t.read(bad)):
        with pytest.raises(SampanError, match="ids"):
            call()
    assert len(t) == 0
    for opt in (SparseSGD(0.1), SparseAdagrad(0.1), SparseAdam(0.1), SparseFTRL(0.1)):
        with pytest.raises(SampanError, match="ids"):
            opt.apply(t, bad, np.ones((bad.size, 2)))
    # integer ids of any width, and an empty list, are fine
    assert t.lookup(np.array([3], np.int8)).shape == (1, 2)
    assert t.lookup([]).shape == (0, 2)


# -- item 20: memory --------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["ttl", "callable"])
def test_ttl_eviction_keeps_up_with_a_flood_of_new_ids(policy):
    n_new, steps, ttl = 20_000, 12, 1
    ev = TTLEviction(ttl=ttl, window=1024) if policy == "ttl" else \
        CallableEviction(lambda m, s: s - m["last_seen"] > ttl, window=1024)
    t = HashEmbeddingTable(2, eviction=ev, chunk_shift=12)
    for step in range(steps):
        ids = np.arange(step * n_new, (step + 1) * n_new)
        t.lookup(ids, step=step)
        # reference: no id seen within the last ttl steps may be gone
        recent = np.arange(max(0, step - ttl) * n_new, (step + 1) * n_new)
        assert (t.rows_for(recent, create=False) >= 0).all()
    # a bounded table: the (ttl + 1) steps of ids not expired, at most twice that while
    # expired ones await the sweep (on main: every one of the 240k ids kept a row)
    assert len(t) <= 2 * (ttl + 1) * n_new, len(t)
    assert t.alloc.next_row <= 2 * (ttl + 1) * n_new


def test_each_shard_sweeps_with_its_own_eviction_policy():
    emb = ShardedEmbedding(2, n_shards=3, eviction=TTLEviction(ttl=1, window=256))
    policies = [sh.table.eviction for sh in emb.shards]
    assert len({id(p) for p in policies}) == 3 and all(p.ttl == 1 for p in policies)
    for step in range(8):
        emb.pull(np.arange(step * 9000, (step + 1) * 9000), step)
    assert len(emb) <= 2 * 2 * 9000, len(emb)
    emb.close()


def test_evicted_id_log_is_bounded_and_deltas_stay_exact(tmp_path):
    t = HashEmbeddingTable(2, eviction=TTLEviction(ttl=0, window=4096), chunk_shift=10)
    t.lookup(np.arange(500), step=0)
    export_full(t, str(tmp_path / "full"))
    for step in range(1, 40):  # 40k ids inserted and evicted between two exports
        t.lookup(np.arange(step * 1000, step * 1000 + 1000), step=step)
    logged = sum(a.size for a in t.evicted)
    assert logged <= 500, logged  # only ids that a snapshot holds need a removal entry
    export_delta(t, str(tmp_path / "d1"))
    _same(restore(str(tmp_path / "full"), [str(tmp_path / "d1")]), t)
    serving = ServingTable(str(tmp_path / "full"))
    serving.apply_delta(str(tmp_path / "d1"))
    probe = np.arange(41_000)
    np.testing.assert_array_equal(serving.lookup(probe), t.read(probe))


def test_snapshot_loader_checks_the_header_first_and_reads_without_copies(tmp_path):
    t = HashEmbeddingTable(32, chunk_shift=12)
    t.lookup(np.arange(40_000))  # about 6 MB of weights and metadata
    path = str(tmp_path / "full")
    export_full(t, path)
    size = os.path.getsize(path)
    tracemalloc.start()
    try:
        header, arrays = read_snapshot(path)
        _, peak = tracemalloc.get_traced_memory()
        del arrays
        assert peak < 1.15 * size, (peak, size)
        junk = str(tmp_path / "junk")
        with open(junk, "wb") as f:
            f.write(b"\x00" * size)
        tracemalloc.reset_peak()
        with pytest.raises(SnapshotError, match="magic"):
            read_snapshot(junk)
        _, peak = tracemalloc.get_traced_memory()
        assert peak < 64 * 1024, peak
    finally:
        tracemalloc.stop()


def test_header_claims_are_checked_against_the_file(tmp_path):
    t = _trained()
    path = str(tmp_path / "full")
    export_full(t, path)
    raw = open(path, "rb").read()
    (head_len,) = struct.unpack_from("<Q", raw, 12)
    head = json.loads(raw[20:20 + head_len])
    head["arrays"][0]["dtype"] = "|O"  # an object array would read pointers from disk
    new = json.dumps(head, sort_keys=True).encode()
    import hashlib

    body = struct.pack("<8sIQ", b"SMPNEMB\0", 2, len(new)) + new + raw[20 + head_len:-32]
    open(path, "wb").write(body + hashlib.sha256(body).digest())
    with pytest.raises(SnapshotError, match="dtype"):
        read_snapshot(path)
