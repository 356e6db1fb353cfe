"""The log store under the disk tier (sampan.rec.logstore): rows against a dict reference
across merges and rebuilds, crash consistency (a SIGKILLed writer mid-demotion, a torn
last log entry), damage refused with a clear error, and compaction keeping every row."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sampan.rec.disktier import DiskTierError
from sampan.rec.logstore import LogStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rec(ids, k, slots=4, dim=4):
    n = ids.size
    meta = np.stack([ids, ids * 3 + k, np.full(n, k), -ids, ids ^ 5, np.full(n, 7)], 1)
    flags = np.zeros((n, 8), np.uint8)
    flags[:, 0] = ids % 2
    flags[:, 1] = (ids // 2) % 2
    vals = (ids[:, None] * 0.25 + k + np.arange(dim)).astype(np.float32)
    return {"meta": meta.astype(np.int64), "flags": flags, "values": vals,
            "slots": None if not slots else np.full((n, slots), k + 0.5, np.float32)}


def _all(store):
    got = {}
    for ids, rec in store.scan():
        for j, i in enumerate(ids.tolist()):
            assert i not in got, "an id listed twice"
            got[i] = (rec["values"][j].copy(), rec["meta"][j].copy(), rec["flags"][j, :2].copy(),
                      None if rec["slots"] is None else rec["slots"][j].copy())
    return got


def _check_against(store, ref):
    got = _all(store)
    assert sorted(got) == sorted(ref) and len(store) == len(ref)
    for i, (v, m, f, s) in ref.items():
        gv, gm, gf, gs = got[i]
        np.testing.assert_array_equal(gv, v)
        np.testing.assert_array_equal(gm, m)
        np.testing.assert_array_equal(gf, f)
        np.testing.assert_array_equal(gs, s)
    ids = np.array(sorted(ref) + [10**12, -5], np.int64)
    fids, groups = store.take(ids, delete=False)
    assert sorted(fids.tolist()) == sorted(ref)
    for gids, rec in groups:
        for j, i in enumerate(gids.tolist()):
            np.testing.assert_array_equal(rec["values"][j], ref[i][0])


def test_rows_match_a_dict_through_merges_rebuilds_and_reopen(tmp_path):
    s = LogStore(str(tmp_path / "s"), 4, "float32", "t", index_entries=64, slot_width=4)
    rng = np.random.default_rng(0)
    ref = {}
    for k in range(60):
        ids = np.unique(rng.integers(-12000, 12000, rng.integers(1, 600)))
        if k % 5 == 4:  # deletions of present and absent ids
            fids, _ = s.take(ids, delete=True)
            assert sorted(fids.tolist()) == sorted(i for i in ids.tolist() if i in ref)
            for i in ids.tolist():
                ref.pop(i, None)
        else:
            rec = _rec(ids, k)
            known = np.array([i in ref for i in ids.tolist()]) if k % 2 else None
            s.put(ids, rec, known=known)
            for j, i in enumerate(ids.tolist()):
                ref[i] = (rec["values"][j], rec["meta"][j], rec["flags"][j, :2],
                          rec["slots"][j])
        assert len(s) == len(ref)
    assert s.merges > 3 and s.rebuilds >= 1  # the log went into the base, which grew
    _check_against(s, ref)
    s.close()
    again = LogStore(str(tmp_path / "s"), 4, "float32", "t", index_entries=64)
    _check_against(again, ref)
    # a new slot width: rows stay, their slots (of the old optimiser) do not
    again.reshape(8)
    got = _all(again)
    assert sorted(got) == sorted(ref) and all(v[3] is None for v in got.values())
    for i, (v, m, f, _) in ref.items():
        np.testing.assert_array_equal(got[i][0], v)
        np.testing.assert_array_equal(got[i][1], m)
    again.close()


def test_int8_rows_keep_their_scale(tmp_path):
    s = LogStore(str(tmp_path / "s"), 5, "int8", "t", index_entries=64)
    ids = np.arange(300, dtype=np.int64) * 11
    rec = {"meta": np.zeros((300, 6), np.int64), "flags": np.zeros((300, 8), np.uint8),
           "values": (np.arange(1500) % 200 - 100).astype(np.int8).reshape(300, 5),
           "scale": np.arange(300, dtype=np.uint16) + 1000, "slots": None}
    rec["meta"][:, 0] = ids
    s.put(ids, rec)
    s.flush_log()
    fids, groups = s.take(ids[::-1], delete=False)
    (gids, got), = groups
    order = np.searchsorted(ids, gids)
    np.testing.assert_array_equal(got["values"], rec["values"][order])
    np.testing.assert_array_equal(got["scale"], rec["scale"][order])


def test_damage_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "s"
    s = LogStore(str(path), 4, "float32", "t", index_entries=1024)
    ids = np.arange(200, dtype=np.int64)
    s.put(ids, _rec(ids, 1, slots=0))
    s.flush_log()  # these rows in the base
    s.put(ids[:50], _rec(ids[:50], 2, slots=0))  # two log entries
    s.put(ids[50:60], _rec(ids[50:60], 3, slots=0))
    s.close()
    m = json.loads((path / "MANIFEST").read_text())
    # a flipped bit in a base record: its read names the id and the checksum
    base = path / f"base.{m['gen']}"
    data = bytearray(base.read_bytes())
    pat = (np.arange(4, dtype=np.float32) + np.float32(150 * 0.25 + 1)).tobytes()
    pos = data.find(pat)
    assert pos > 0
    data[pos] ^= 0x10
    base.write_bytes(bytes(data))
    s = LogStore(str(path), 4, "float32", "t", index_entries=1024)
    with pytest.raises(DiskTierError, match="id 150 fails its checksum"):
        s.take(np.array([150]), delete=False)
    np.testing.assert_array_equal(s.take(np.array([3]), delete=False)[0], [3])
    s.close()
    # a flipped bit in the first of two log entries: damage, not a torn write
    log = path / f"log.{m['log']}"
    data = bytearray(log.read_bytes())
    data[8 * 6 + 8 * 8] ^= 0x01  # the first record's first weight
    log.write_bytes(bytes(data))
    with pytest.raises(DiskTierError, match="fails its checksum"):
        LogStore(str(path), 4, "float32", "t")
    # a manifest edited by hand
    (path / "MANIFEST").write_text(json.dumps(dict(m, pages=m["pages"] * 2)))
    with pytest.raises(DiskTierError, match="MANIFEST fails its checksum"):
        LogStore(str(path), 4, "float32", "t")
    (path / "MANIFEST").write_text(json.dumps(m))
    with pytest.raises(DiskTierError, match="dim=4"):
        LogStore(str(path), 8, "float32", "t")


def test_a_torn_last_entry_is_cut_off(tmp_path):
    path = tmp_path / "s"
    s = LogStore(str(path), 4, "float32", "t")
    ids = np.arange(100, dtype=np.int64)
    s.put(ids, _rec(ids, 1, slots=0))
    s.put(ids + 100, _rec(ids + 100, 2, slots=0))
    s.close()
    m = json.loads((path / "MANIFEST").read_text())
    log = path / f"log.{m['log']}"
    size = log.stat().st_size
    with open(log, "r+b") as f:  # the second entry cut short, as a kill mid-write leaves it
        f.truncate(size - 8 * 37)
    s = LogStore(str(path), 4, "float32", "t")
    assert len(s) == 100 and sorted(_all(s)) == list(range(100))
    assert log.stat().st_size == size // 2  # cut at the entry's start
    s.put(ids + 500, _rec(ids + 500, 3, slots=0))  # and the log goes on from there
    s.close()
    assert len(LogStore(str(path), 4, "float32", "t")) == 200


_WRITER = """
import sys, numpy as np
from sampan.rec.logstore import LogStore
s = LogStore(sys.argv[1], 8, "float32", "w", index_entries=3000, slot_width=8)
B = 1000
for k in range(10**6):
    # batch k: ids [0, B) rewritten with k, and B new ids; small index: merges, rebuilds
    ids = np.concatenate([np.arange(B), np.arange((k + 1) * B, (k + 2) * B)]).astype(np.int64)
    n = ids.size
    meta = np.zeros((n, 6), np.int64)
    meta[:, 0], meta[:, 1] = ids, k
    s.put(ids, {"meta": meta, "flags": np.zeros((n, 8), np.uint8),
                "values": np.full((n, 8), k, np.float32),
                "slots": np.full((n, 8), k, np.float32)})
    print(k, s.merges, s.rebuilds, flush=True)
"""


@pytest.mark.parametrize("batches", [3, 7, 12])
def test_sigkilled_writer_mid_demotion_leaves_whole_batches(tmp_path, batches):
    path = str(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER), path], env=env,
                         stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(batches):  # then kill while it appends, merges or rebuilds
            line = p.stdout.readline()
            assert line, "writer died"
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(30)
        p.stdout.close()
    s = LogStore(path, 8, "float32", "w", index_entries=3000)
    n = len(s)
    assert n % 1000 == 0 and n >= 1000 * (batches + 1)
    last = n // 1000 - 2  # the last batch that is there
    got = _all(s)
    assert sorted(got) == list(range(n))
    for i, (v, m, _, sl) in got.items():
        want = last if i < 1000 else i // 1000 - 1
        assert m[1] == want and (v == want).all() and (sl == want).all(), (i, m[1], want)
    assert line.split()[0] in {str(last), str(last - 1)}


def test_a_damaged_entry_header_is_refused_not_cut(tmp_path):
    """A header whose count was flipped would read as a torn tail and drop the entries
    after it: its own checksum tells damage from a torn write."""
    path = tmp_path / "s"
    s = LogStore(str(path), 4, "float32", "t")
    ids = np.arange(100, dtype=np.int64)
    s.put(ids, _rec(ids, 1, slots=0))
    s.put(ids + 100, _rec(ids + 100, 2, slots=0))
    s.close()
    m = json.loads((path / "MANIFEST").read_text())
    log = path / f"log.{m['log']}"
    data = bytearray(log.read_bytes())
    data[2 * 8 + 3] ^= 0x40  # the first entry's record count, now far past the file
    log.write_bytes(bytes(data))
    with pytest.raises(DiskTierError, match="damaged header"):
        LogStore(str(path), 4, "float32", "t")
    assert log.stat().st_size == len(data)  # nothing cut


def test_unique_ids_matches_numpy():
    from sampan.rec._logstore_kernels import unique_ids
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 5000):
        ids = rng.integers(-40, 40, n) * 0x9E3779B1 + (1 << 61)
        assert np.array_equal(unique_ids(ids), np.unique(ids))
    assert unique_ids(np.array([[3, 1], [3, 2]])).tolist() == [1, 2, 3]


def test_threaded_base_reads_match_one_thread(tmp_path, monkeypatch):
    """READ_THREADS=2 (off by default) splits a batch's base search over two threads:
    the same found masks, records and in-base flags as the caller's thread alone."""
    import sampan.rec.logstore as ls
    s = LogStore(str(tmp_path / "s"), 4, "float32", "t", index_entries=64, slot_width=4)
    ids = np.arange(-3000, 3000, 7)
    s.put(ids, _rec(ids, 1))
    s.flush_log()
    ask = np.concatenate([ids[::3], np.arange(10**6, 10**6 + 200)])  # some absent
    monkeypatch.setattr(ls, "READ_THREADS", 1)
    want = s._lookup(np.unique(ask))
    monkeypatch.setattr(ls, "READ_THREADS", 2)
    got = s._lookup(np.unique(ask))
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    assert want[0].sum() == ids[::3].size
    s.close()
