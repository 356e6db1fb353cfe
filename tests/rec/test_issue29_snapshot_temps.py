"""Issue 29, item 10: snapshot writes follow the one temporary-file policy of
``sampan.io._atomic``: a write killed half way leaves a temporary that the next export
into the folder removes, while temporaries of writers still alive stay."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

from sampan.io import _atomic
from sampan.rec.snapshot import export_delta, export_full, read_snapshot, restore, \
    table_state
from sampan.rec.table import HashEmbeddingTable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _table(n=300):
    t = HashEmbeddingTable(4, seed=1)
    t.lookup(np.arange(n, dtype=np.int64), step=0)
    return t


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _same_state(a, b):
    for k, v in table_state(a).items():
        np.testing.assert_array_equal(table_state(b)[k], v, err_msg=k)


def test_export_removes_dead_writers_temporaries_and_keeps_live_ones(tmp_path):
    big = b"\0" * (1 << 16)
    # left by writers that died: the old naming (pid, thread) and an unlocked temporary
    # of another file of the folder (a delta whose name is never written again)
    dead = [f"emb.full.tmp-{_dead_pid()}-140230", ".emb.d7.0123456789abcdef.tmp"]
    for n in dead:
        (tmp_path / n).write_bytes(big)
    # writers alive now: an old-style name of this process, a locked new-style one
    live_old = f"emb.d9.tmp-{os.getpid()}-1"
    (tmp_path / live_old).write_bytes(big)
    fd, live_new = _atomic.create_file(str(tmp_path), lambda tok: f".emb.d8.{tok}.tmp")
    try:
        t = _table()
        export_full(t, str(tmp_path / "emb.full"))
        left = sorted(os.listdir(tmp_path))
        assert left == sorted(["emb.full", live_old, os.path.basename(live_new)]), left
        _same_state(restore(str(tmp_path / "emb.full")), t)
        read_snapshot(str(tmp_path / "emb.full"))            # checksum and all
    finally:
        os.close(fd)
    # once that writer is gone, its temporary goes with the next write
    t.lookup(np.arange(300, 320, dtype=np.int64), step=1)
    export_delta(t, str(tmp_path / "emb.d1"))
    assert sorted(os.listdir(tmp_path)) == sorted(["emb.full", "emb.d1", live_old])
    _same_state(restore(str(tmp_path / "emb.full"), [str(tmp_path / "emb.d1")]), t)


KILLED = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from sampan.rec.snapshot import export_full
    from sampan.rec.table import HashEmbeddingTable
    t = HashEmbeddingTable(4, seed=1)
    t.lookup(np.arange(5000, dtype=np.int64), step=0)
    def stall(fd):                     # the data is written; stop before the rename
        print("writing", flush=True)
        time.sleep(60)
    os.fsync = stall
    export_full(t, sys.argv[1])
""")


def test_a_write_killed_half_way_is_cleaned_by_the_next_export(tmp_path):
    target = tmp_path / "emb.full"
    p = subprocess.Popen([sys.executable, "-c", KILLED, str(target)], stdout=subprocess.PIPE,
                         env=dict(os.environ, PYTHONPATH=ROOT), text=True)
    try:
        assert p.stdout.readline().strip() == "writing"
        temps = os.listdir(tmp_path)
        assert len(temps) == 1 and temps[0] != "emb.full"
        assert os.path.getsize(tmp_path / temps[0]) > 5000 * 4 * 4   # the rows it wrote
        # while the writer lives, another export leaves its temporary alone
        other = _table(10)
        export_full(other, str(tmp_path / "other.full"))
        assert temps[0] in os.listdir(tmp_path)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    t = _table()
    export_full(t, str(target))
    assert sorted(os.listdir(tmp_path)) == ["emb.full", "other.full"]
    _same_state(restore(str(target)), t)
