"""Issue 29 item 8: a program loaded while another thread re-saves it comes back whole,
old or new, never "damaged". The reader is slowed between its file opens (a hook on
`serialize._open`) so that saves land between them on every run."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import sampan
from sampan.io import _atomic
from sampan.jit import serialize as S


@pytest.mark.parametrize("publish", ["exchange", "two renames"])
def test_load_while_resaving_gives_old_or_new(tmp_path, monkeypatch, publish):
    if publish == "two renames":    # as where renameat2 is missing
        monkeypatch.setattr(_atomic, "exchange", lambda a, b: False)
    path = str(tmp_path / "m.sampan")
    x = sampan.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    ws = [np.full((3, 4), k, np.float32) for k in (1.0, 2.0)]
    wants = [x.numpy() @ w for w in ws]
    fns = []
    for w in ws:
        t = sampan.tensor(w)
        fns.append(lambda a, t=t: a @ t)
    S.save(fns[0], path, (x,))

    real_open = S._open

    def slow_open(*a, **k):
        time.sleep(0.002)      # a busy machine: a save finishes between two opens
        return real_open(*a, **k)
    monkeypatch.setattr(S, "_open", slow_open)

    stop = threading.Event()
    saves = [0]
    errors = []

    # the saver traces on a tensor of its own: tracing swaps the data of the tensors it
    # traces for IR values while it runs, so a tensor read by another thread meanwhile
    # would not be an array (tracing shares no tensor across threads, as in torch.jit)
    xs = sampan.tensor(x.numpy().copy())

    def saver():
        try:
            while not stop.is_set():
                S.save(fns[saves[0] % 2], path, (xs,))
                saves[0] += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
    th = threading.Thread(target=saver)
    th.start()
    failures = []
    n, t_end = 0, time.monotonic() + 2.0
    try:
        while n < 150 and time.monotonic() < t_end:
            try:
                y = S.load(path)(x).numpy()
                k = [i for i, w in enumerate(wants) if np.array_equal(y, w)]
                assert k, y
            except S.LoadError as e:
                failures.append(str(e))
            n += 1
    finally:
        stop.set()
        th.join()
    assert not errors, errors
    assert saves[0] >= 5, saves          # the folder really was swapped while loading
    assert not failures, (len(failures), n, failures[:3])
    # folders a reader held when they were replaced go with the next save
    S.save(fns[0], path, (x,))
    assert os.listdir(tmp_path) == ["m.sampan"], os.listdir(tmp_path)
