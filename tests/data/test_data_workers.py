"""DataLoader with worker threads and processes: order, errors, shutdown."""
import gc
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

from sampan.data import DataLoader, DataLoaderWorkerError, Dataset, IterableDataset, get_worker_info
from sampan.tensor import Tensor

MODES = [(0, "thread"), (2, "thread"), (2, "process")]


# datasets live at module level so process workers can unpickle them
class Items(Dataset):
    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(2, i, np.float32), "y": i}


class Slow(Items):
    def __getitem__(self, i):
        time.sleep(0.002 * (i % 3))  # uneven work so replies arrive out of order
        return super().__getitem__(i)


class Failing(Items):
    def __getitem__(self, i):
        if i == 13:
            raise ValueError(f"bad record {i}")
        return super().__getitem__(i)


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class Dies(Items):
    def __getitem__(self, i):
        if i == 5:
            os._exit(3)
        return super().__getitem__(i)


class Seeds(Items):
    def __getitem__(self, i):
        info = get_worker_info()
        return (info.id, info.seed, int(np.random.randint(1 << 30)))


def _order(loader):
    return [b["y"].numpy().tolist() for b in loader]


def _children():
    return [p for p in multiprocessing.active_children() if p.name.startswith("sampan-data")]


def _threads():
    return [t for t in threading.enumerate() if t.name.startswith("sampan-data")]


def _settle():
    """Wait for workers of closed loaders to finish their last poll."""
    deadline = time.monotonic() + 5
    while (_threads() or _children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _threads(), _children()


@pytest.mark.timeout(60)
def test_same_seed_same_order_every_worker_mode():
    orders = {}
    for nw, mode in MODES:
        dl = DataLoader(Slow(), batch_size=4, shuffle=True, seed=7, num_workers=nw,
                        worker_mode=mode, prefetch_factor=2)
        orders[(nw, mode)] = [_order(dl), _order(dl)]  # two epochs
    first = orders[MODES[0]]
    assert first[0] != first[1]  # epochs differ...
    assert sorted(v for b in first[0] for v in b) == list(range(37))
    for key, val in orders.items():
        assert val == first, key  # ...but every worker setup agrees
    assert _order(DataLoader(Items(), batch_size=4, shuffle=True, seed=8)) != first[0]
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw,mode", MODES[1:])
def test_tensors_cross_workers(nw, mode):
    dl = DataLoader(Items(9), batch_size=4, drop_last=True, num_workers=nw, worker_mode=mode)
    batches = list(dl)
    assert len(batches) == len(dl) == 2
    assert isinstance(batches[0]["x"], Tensor) and batches[0]["x"].dtype == np.float32
    assert batches[1]["x"].numpy()[:, 0].tolist() == [4, 5, 6, 7]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw,mode", MODES)
def test_failing_worker_surfaces_traceback(nw, mode):
    dl = DataLoader(Failing(), batch_size=4, num_workers=nw, worker_mode=mode)
    if nw == 0:
        with pytest.raises(ValueError, match="bad record 13"):
            list(dl)
        return
    got = []
    with pytest.raises(DataLoaderWorkerError) as info:
        for b in dl:
            got.append(b)  # noqa: PERF402
    msg = str(info.value)
    assert len(got) == 3  # the batches before the failing one still arrive in order
    assert f"DataLoader worker 1 ({mode}) raised ValueError while loading batch 3" in msg
    assert "indices [12, 13, 14, 15]" in msg
    assert "Traceback in the worker:" in msg
    assert 'raise ValueError(f"bad record {i}")' in msg  # the worker's own source line
    assert "in __getitem__" in msg
    assert info.value.exc_type == "ValueError" and info.value.worker_id == 1
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw,mode", MODES[1:])
def test_break_and_gc_shut_workers_down(nw, mode):
    dl = DataLoader(Items(200), batch_size=2, num_workers=nw, worker_mode=mode)
    for i, _ in enumerate(dl):
        if i == 3:
            break
    assert _settle() == ([], [])
    it = iter(dl)
    next(it)
    assert len(_threads()) + len(_children()) == 2
    del it, dl
    gc.collect()
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw,mode", MODES)
def test_iterable_dataset_round_robin(nw, mode):
    dl = DataLoader(Stream(11), batch_size=2, num_workers=nw, worker_mode=mode)
    flat = sorted(v for b in dl for v in b.numpy().tolist())
    assert flat == list(range(11))
    again = [b.numpy().tolist() for b in dl]
    assert again == [b.numpy().tolist() for b in dl]  # deterministic
    if nw:
        # worker 0 yields 0,2,4,...; worker 1 yields 1,3,5,...; batches alternate
        assert again[:3] == [[0, 2], [1, 3], [4, 6]]
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
def test_process_worker_death_is_reported():
    dl = DataLoader(Dies(), batch_size=2, num_workers=2, worker_mode="process")
    with pytest.raises(DataLoaderWorkerError, match="exited unexpectedly with exit code 3"):
        list(dl)
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
def test_worker_seeds_follow_loader_seed():
    def run():
        dl = DataLoader(Seeds(4), batch_size=None, num_workers=2, worker_mode="process", seed=3)
        return list(dl)

    a, b = run(), run()
    assert a == b
    assert [w for w, _, _ in a] == [0, 1, 0, 1]
    assert a[0][1] != a[1][1]  # each worker has its own seed


@pytest.mark.timeout(60)
def test_unpicklable_dataset_in_process_mode_is_explained():
    class Local(Items):  # defined in a function: cannot be pickled
        pass

    dl = DataLoader(Local(), batch_size=2, num_workers=1, worker_mode="process")
    with pytest.raises(DataLoaderWorkerError, match="must be picklable"):
        iter(dl)
    assert _settle() == ([], [])


class Sleepy(Items):
    def __getitem__(self, i):
        time.sleep(1.0)
        return i


def failing_init(worker_id):
    raise RuntimeError(f"init failed in {worker_id}")


@pytest.mark.timeout(60)
def test_timeout_and_worker_init_fn_errors():
    dl = DataLoader(Sleepy(4), batch_size=None, num_workers=1, timeout=0.3)
    with pytest.raises(DataLoaderWorkerError, match=r"timed out after 0.3 s waiting for batch 0"):
        next(iter(dl))
    dl = DataLoader(Items(4), batch_size=2, num_workers=2, worker_mode="process",
                    worker_init_fn=failing_init)
    with pytest.raises(DataLoaderWorkerError, match=r"RuntimeError in worker_init_fn(.|\n)*"
                                                    r"init failed in 0"):
        list(dl)
    assert _settle() == ([], [])


@pytest.mark.timeout(60)
def test_tensor_dataset_in_process_workers():
    from sampan.data import TensorDataset

    x = Tensor(np.arange(20, dtype=np.float32).reshape(10, 2), requires_grad=True)
    ds = TensorDataset(x, np.arange(10))
    dl = DataLoader(ds, batch_size=3, shuffle=True, seed=0, num_workers=2, worker_mode="process")
    ref = DataLoader(ds, batch_size=3, shuffle=True, seed=0)
    got, want = list(dl), list(ref)
    assert len(got) == 4
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx.numpy(), wx.numpy())
        np.testing.assert_array_equal(gy.numpy(), wy.numpy())
