"""DataLoader failures arrive on time and name the batch: hung, killed and vanished workers."""
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

from sampan.data import DataLoader, DataLoaderWorkerError, Dataset

HANG_AT = 2  # the index a hanging dataset blocks on
TIMEOUT = 0.3


# datasets live at module level so process workers can unpickle them
class Hangs(Dataset):
    """Blocks on one index: long in a process (it gets terminated), briefly in a thread
    (a thread cannot be stopped from outside, so it must end on its own). Each index
    leaves a file in `seen` when its loading starts."""

    def __init__(self, hang_s, seen):
        self.hang_s, self.seen = hang_s, seen

    def __len__(self):
        return 8

    def __getitem__(self, i):
        open(os.path.join(self.seen, str(i)), "w").close()
        if i == HANG_AT:
            time.sleep(self.hang_s)
        return np.full(2, i, np.float32)


class Killed(Dataset):
    """The worker process dies on index 5, by SIGKILL or by os._exit; index 9 is slow, so
    the other worker's first batch comes after the death."""

    def __init__(self, how):
        self.how = how

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 5:
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(7)
        if i == 9:
            time.sleep(0.5)
        return np.full(2, i, np.float32)


class DiesWhileSending(Dataset):
    """Worker 0 loads indices 0, 2, 4: index 2 is a 4 MB reply, which a 64 KiB pipe only
    takes in part while the main side is busy; the worker dies on index 4 meanwhile."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 4:
            time.sleep(0.3)
            os._exit(5)
        return np.full(1 << 20 if i == 2 else 2, i, np.float32)


class Exits(Dataset):
    """sys.exit() (not an Exception) in the dataset, or a KeyboardInterrupt in a thread
    worker, which the worker takes as "stop" and so ends."""

    def __init__(self, exc):
        self.exc = exc

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 5:
            raise self.exc
        return np.full(2, i, np.float32)


class Fails(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i == 77:
            raise KeyError(f"record {i} is missing")
        return np.float32(i)


def _workers():
    return ([t for t in threading.enumerate() if t.name.startswith("sampan-data")],
            [p for p in multiprocessing.active_children() if p.name.startswith("sampan-data")])


def _settle(limit=3.0):
    deadline = time.monotonic() + limit
    while any(_workers()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return _workers()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,hang_s", [("thread", 1.5), ("process", 30.0)])
def test_hung_worker_times_out_on_time_and_names_the_batch(mode, hang_s, tmp_path):
    dl = DataLoader(Hangs(hang_s, str(tmp_path)), batch_size=2, num_workers=2,
                    worker_mode=mode, timeout=TIMEOUT)
    it = iter(dl)
    # wait until both workers are at work, so that starting a process (an import in a
    # fresh interpreter, slow on a busy machine) is not part of what the timeout bounds
    deadline = time.monotonic() + 20
    while not all((tmp_path / i).exists() for i in ("0", str(HANG_AT))):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.01)
    np.testing.assert_array_equal(next(it).numpy(), [[0, 0], [1, 1]])  # worker 0 is fine
    t0 = time.monotonic()
    with pytest.raises(DataLoaderWorkerError) as info:
        next(it)  # batch 1, indices [2, 3], is worker 1's: it hangs on index 2
    elapsed = time.monotonic() - t0
    # the error comes when the timeout is up, not after waiting for the hung worker
    assert TIMEOUT - 0.05 <= elapsed < TIMEOUT + 0.7, elapsed
    msg = str(info.value)
    assert f"timed out after {TIMEOUT} s waiting for batch 1 (indices [2, 3]) from worker 1 " \
           f"({mode}): the worker is still loading it" in msg
    assert info.value.worker_id == 1 and info.value.indices == [2, 3]
    # a hung process is terminated; a hung thread finishes its sleep and exits by itself
    assert _settle() == ([], [])


def slow_init(worker_id):
    time.sleep(0.8)


@pytest.mark.timeout(60)
def test_timeout_says_when_the_worker_never_started():
    dl = DataLoader(Fails(), batch_size=2, num_workers=1, timeout=0.2, worker_init_fn=slow_init)
    with pytest.raises(DataLoaderWorkerError, match=r"waiting for batch 0 \(indices \[0, 1\]\) "
                                                    r"from worker 0 \(thread\): the worker has "
                                                    r"not started any task yet"):
        list(dl)
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how,code", [("sigkill", "-9 (signal SIGKILL)"), ("exit", "7")])
def test_killed_worker_names_the_batch_it_was_loading(how, code):
    # index 5 is in batch 1, which worker 1 loads; worker 0's batches 0 and 2 are fine
    order = [[9, 3], [5, 1], [7, 2], [0, 8]]
    dl = DataLoader(Killed(how), batch_sampler=order, num_workers=2, worker_mode="process")
    got = []
    with pytest.raises(DataLoaderWorkerError) as info:
        for b in dl:
            got.append(b.numpy()[:, 0].tolist())
    msg = str(info.value)
    assert got == [[9, 3]]  # the batch before the lost one still arrives, even when slow
    assert f"DataLoader worker 1 (process) exited unexpectedly with exit code {code} while " \
           "loading batch 1 (indices [5, 1])" in msg, msg
    assert info.value.worker_id == 1 and info.value.indices == [5, 1]
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
def test_a_worker_dying_mid_reply_stalls_no_one():
    # before: the workers shared one reply queue; a worker that died while its feeder
    # thread was writing left half a message in the pipe, which the main side then
    # waited on forever (and held the queue's write lock, so the other worker could
    # send nothing either); CI hung on this
    dl = DataLoader(DiesWhileSending(), batch_size=None, num_workers=2, worker_mode="process",
                    timeout=30)
    got = []
    t0 = time.monotonic()
    with pytest.raises(DataLoaderWorkerError) as info:
        for b in dl:
            got.append(int(b.numpy()[0]))
            if len(got) == 1:
                time.sleep(1.0)  # busy: worker 0's 4 MB reply stalls half-written
    assert time.monotonic() - t0 < 20  # the death, not the timeout
    assert "DataLoader worker 0 (process) exited unexpectedly with exit code 5 while " \
           "loading batch 4" in str(info.value), str(info.value)
    assert got == [0, 1]  # the other worker's batch before the lost ones still arrives
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_sys_exit_in_the_dataset_is_reported_with_its_traceback(mode):
    # before: a thread ended silently and the loader waited for its batch forever; a
    # process exited with code 0 and no traceback
    dl = DataLoader(Exits(SystemExit(4)), batch_size=2, num_workers=2, worker_mode=mode,
                    timeout=20)
    t0 = time.monotonic()
    with pytest.raises(DataLoaderWorkerError) as info:
        list(dl)
    assert time.monotonic() - t0 < 2.0
    msg = str(info.value)
    assert f"DataLoader worker 0 ({mode}) raised SystemExit while loading batch 2 " \
           "(indices [4, 5])" in msg, msg
    assert "raise self.exc" in msg  # the worker's own line
    assert info.value.indices == [4, 5]
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
def test_thread_worker_that_ends_is_reported_not_waited_on():
    dl = DataLoader(Exits(KeyboardInterrupt()), batch_size=2, num_workers=2, timeout=20)
    t0 = time.monotonic()
    with pytest.raises(DataLoaderWorkerError) as info:
        list(dl)
    assert time.monotonic() - t0 < 2.0
    assert "DataLoader worker 0 (thread) ended unexpectedly while loading batch 2 " \
           "(indices [4, 5])" in str(info.value), str(info.value)
    assert info.value.worker_id == 0 and info.value.indices == [4, 5]
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
def test_long_batch_is_shortened_in_the_message_and_kept_whole_on_the_error():
    dl = DataLoader(Fails(), batch_size=40, num_workers=1)
    with pytest.raises(DataLoaderWorkerError) as info:
        list(dl)
    msg = str(info.value)
    assert "raised KeyError while loading batch 1 (indices [40, 41, " in msg
    assert ", 71, ...]: 40 in all, see the error's .indices)" in msg
    assert info.value.indices == list(range(40, 80))
    assert "record 77 is missing" in msg
    assert _settle() == ([], [])
