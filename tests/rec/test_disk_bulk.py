"""The log store's bulk fill (sampan.rec._logstore_bulk, HashEmbeddingTable.bulk_fill):
the same rows as the one-by-one path (over a base and a log that hold rows already), ids
spooled twice refused with the store left as it was, and a writer SIGKILLed while it
spools or while it writes the new base leaving the old store whole."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sampan.rec import _logstore_bulk
from sampan.rec.disktier import DiskTierError
from sampan.rec.logstore import LogStore
from sampan.rec.table import HashEmbeddingTable

from .test_disk_logstore import _all, _rec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for i in a:
        for x, y in zip(a[i], b[i]):
            np.testing.assert_array_equal(x, y)


def _history(stores, rng):
    """Rows in base and log of every store alike: puts, overwrites and deletions."""
    ids0 = np.unique(rng.integers(-10**6, 10**6, 3000))
    for s in stores:
        s.put(ids0, _rec(ids0, 1))
        s.put(ids0[::3], _rec(ids0[::3], 2))
        s.take(ids0[1::7])
    return ids0


def test_bulk_fill_gives_the_rows_of_the_one_by_one_path(tmp_path):
    rng = np.random.default_rng(0)
    one = LogStore(str(tmp_path / "one"), 4, "float32", "t", index_entries=1024,
                   slot_width=4)
    bulk = LogStore(str(tmp_path / "bulk"), 4, "float32", "t", index_entries=1024,
                    slot_width=4)
    ids0 = _history((one, bulk), rng)
    held = np.setdiff1d(ids0, ids0[1::7])
    new = np.setdiff1d(np.unique(rng.integers(-10**7, 10**7, 7000)), ids0)
    bulk.bulk_begin()
    for k, s in enumerate(range(0, new.size, 499)):
        ids = new[s:s + 499]
        for st in (one, bulk):
            st.put(ids, _rec(ids, 3 + k), known=np.zeros(ids.size, bool))
        old = held[k * 40:(k + 1) * 40]  # known ids during the fill go through the log
        for st in (one, bulk):
            st.put(old, _rec(old, 40 + k), known=np.ones(old.size, bool))
    assert len(bulk) == len(one)
    with pytest.raises(DiskTierError, match="bulk fill is open"):
        next(iter(bulk.scan()))
    bulk.bulk_end()
    assert bulk.bulk_builds == 1 and bulk.m["pages"] > 256  # the base grew in one pass
    assert not [n for n in os.listdir(bulk.path) if n.startswith("spool")]
    ref = _all(one)
    _same(_all(bulk), ref)
    bulk.close()
    again = LogStore(str(tmp_path / "bulk"), 4, "float32", "t", index_entries=256)
    _same(_all(again), ref)
    assert len(again) == len(ref)
    probe = np.r_[new[::5], ids0, np.array([10**12], np.int64)]
    fids, groups = again.take(probe, delete=False)
    assert sorted(fids.tolist()) == sorted(set(probe.tolist()) & set(ref))
    for gids, rec in groups:
        for j, i in enumerate(gids.tolist()):
            np.testing.assert_array_equal(rec["values"][j], ref[i][0])
    again.close()
    one.close()


def test_an_id_spooled_twice_is_refused_and_the_store_kept(tmp_path):
    s = LogStore(str(tmp_path / "s"), 4, "float32", "t", index_entries=256, slot_width=4)
    ids0 = _history((s,), np.random.default_rng(1))
    ref = _all(s)
    s.bulk_begin()
    new = np.arange(10**8, 10**8 + 500, dtype=np.int64)
    s.put(new, _rec(new, 5), known=np.zeros(new.size, bool))
    s.put(ids0[:3], _rec(ids0[:3], 6), known=np.zeros(3, bool))  # held already: a lie
    with pytest.raises(DiskTierError, match="ids twice"):
        s.bulk_end()
    assert s.spool is None and len(s) == len(ref)
    _same(_all(s), ref)
    s.close()
    _same(_all(LogStore(str(tmp_path / "s"), 4, "float32", "t")), ref)


_WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    from sampan.rec import _logstore_bulk
    from sampan.rec.logstore import LogStore
    from tests.rec.test_disk_logstore import _rec
    s = LogStore({path!r}, 4, "float32", "t", index_entries=256, slot_width=4)
    where = {where!r}
    kill = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
    if where == "build":
        _logstore_bulk._HOOK = lambda r: r == 100 and kill()
    s.bulk_begin()
    new = np.arange(10**9, 10**9 + 8000, dtype=np.int64)
    for k in range(0, new.size, 1000):
        s.put(new[k:k + 1000], _rec(new[k:k + 1000], 9), known=np.zeros(1000, bool))
        if where == "spool" and k == 5000:
            kill()
    s.bulk_end()
    raise SystemExit("not killed")
""")


@pytest.mark.parametrize("where", ["spool", "build"])
def test_a_writer_killed_mid_bulk_leaves_the_old_store(tmp_path, where):
    path = str(tmp_path / "s")
    s = LogStore(path, 4, "float32", "t", index_entries=256, slot_width=4)
    _history((s,), np.random.default_rng(2))
    ref = _all(s)
    s.close()
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", _WRITER.format(root=ROOT, path=path,
                                                             where=where)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert [n for n in os.listdir(path) if n.startswith(("spool", "base.1"))]
    back = LogStore(path, 4, "float32", "t", index_entries=256)
    _same(_all(back), ref)  # the old manifest, base and log: the rows as before the fill
    assert len(back) == len(ref)
    assert sorted(os.listdir(path)) == ["MANIFEST", "base.0", f"log.{back.m['log']}"]
    back.close()


def _fill(tmp_path, name, bulk):
    t = HashEmbeddingTable(16, chunk_shift=10, memory_budget_mb=0.5,
                           spill_dir=str(tmp_path / name))
    t.attach_slots(16)
    ids = (np.arange(30000, dtype=np.int64) * 0x9E3779B1 + 7) % (1 << 62)
    with t.bulk_fill() if bulk else _null():
        for s in range(0, ids.size, 1000):
            t.lookup(ids[s:s + 1000], step=0)
    return t, ids


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_table_bulk_fill_reads_like_the_plain_fill(tmp_path, monkeypatch):
    monkeypatch.setattr(_logstore_bulk, "SPOOL_BUFFER", 1 << 16)  # many spool flushes
    a, ids = _fill(tmp_path, "a", False)
    b, _ = _fill(tmp_path, "b", True)
    assert len(a) == len(b) == ids.size and b.tier.store.bulk_builds == 1
    assert b.tier.store.merges == 0 and a.tier.store.merges > 0
    np.testing.assert_array_equal(b.lookup(ids, create=False), a.lookup(ids, create=False))
    # the rows' inits, from an all-RAM table
    ref = np.asarray(HashEmbeddingTable(16, chunk_shift=10).lookup(ids), np.float64)
    np.testing.assert_allclose(np.asarray(b.lookup(ids, create=False), np.float64), ref)
    v = b.lookup(ids[:800], step=1)  # and training goes on over the new base
    np.testing.assert_allclose(np.asarray(v, np.float64), ref[:800])
