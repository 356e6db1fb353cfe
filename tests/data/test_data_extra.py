"""WeightedRandomSampler, SubsetRandomSampler, ChainDataset, StackDataset, the DataLoader's
persistent_workers / generator / pin_memory arguments, and the sampan.utils.data path."""
import gc
import os
import threading

import numpy as np
import pytest

import sampan
import sampan.data as sd
from sampan.data import DataLoader, Dataset, IterableDataset, get_worker_info


class WhoLoads(Dataset):  # module level: process workers unpickle it
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.array([i, os.getpid(), threading.get_ident() % 2**31], np.int64)


class Count(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))

    def __len__(self):
        return self.n


def test_utils_data_is_sampan_data():
    from sampan.utils.data import (
        BatchSampler,
        ChainDataset,
        ConcatDataset,
        DataLoader,
        Dataset,
        IterableDataset,
        RandomSampler,
        Sampler,
        SequentialSampler,
        StackDataset,
        Subset,
        SubsetRandomSampler,
        TensorDataset,
        WeightedRandomSampler,
        default_collate,
        get_worker_info,
        random_split,
    )
    for obj in (BatchSampler, ChainDataset, ConcatDataset, DataLoader, Dataset, IterableDataset,
                RandomSampler, Sampler, SequentialSampler, StackDataset, Subset,
                SubsetRandomSampler, TensorDataset, WeightedRandomSampler, default_collate,
                get_worker_info, random_split):
        assert getattr(sd, obj.__name__) is obj
    assert sampan.utils.data.DataLoader is sd.DataLoader and "utils" in sampan.__all__


def test_weighted_sampler_draws_by_weight_and_repeats_per_seed():
    w = [0.1, 0.0, 0.6, 0.3]
    s = sd.WeightedRandomSampler(w, 4000, generator=sampan.Generator(5))
    draws = np.array(list(s))
    assert len(s) == 4000 and draws.dtype == np.int64 and 1 not in draws
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / 4000, w, atol=0.03)
    again = sd.WeightedRandomSampler(w, 4000, generator=sampan.Generator(5))
    assert list(again) == draws.tolist()
    assert list(s) != draws.tolist()  # the next epoch draws afresh
    once = list(sd.WeightedRandomSampler(w, 3, replacement=False, generator=sampan.Generator(1)))
    assert sorted(once) == [0, 2, 3]
    with pytest.raises(sampan.SampanValueError, match="non-zero"):
        sd.WeightedRandomSampler(w, 4, replacement=False)
    with pytest.raises(sampan.SampanValueError, match="weights"):
        sd.WeightedRandomSampler([1.0, -1.0], 2)
    with pytest.raises(sampan.SampanValueError, match="num_samples"):
        sd.WeightedRandomSampler(w, 0)


def test_subset_random_sampler():
    s = sd.SubsetRandomSampler([3, 8, 11, 20], generator=sampan.Generator(0))
    a, b = list(s), list(s)
    assert sorted(a) == sorted(b) == [3, 8, 11, 20] and len(s) == 4
    assert list(sd.SubsetRandomSampler([3, 8, 11, 20], generator=sampan.Generator(0))) == a


def test_chain_and_stack_datasets():
    chain = sd.ChainDataset([Count(3), Count(2)])
    assert list(chain) == [0, 1, 2, 0, 1] and len(chain) == 5
    with pytest.raises(sampan.SampanValueError, match="IterableDataset"):
        list(sd.ChainDataset([Count(1), [1, 2]]))
    x, y = np.arange(6.0).reshape(3, 2), np.array([7, 8, 9])
    tup = sd.StackDataset(x, y)
    assert len(tup) == 3 and tup[1][0].tolist() == [2.0, 3.0] and tup[1][1] == 8
    dct = sd.StackDataset(image=x, label=y)
    batch = next(iter(DataLoader(dct, batch_size=2)))
    assert set(batch) == {"image", "label"} and batch["label"].numpy().tolist() == [7, 8]
    with pytest.raises(sampan.SampanValueError, match="equal lengths"):
        sd.StackDataset(x, y[:2])
    with pytest.raises(sampan.SampanValueError, match="one form"):
        sd.StackDataset(x, label=y)


def _order(loader):
    return [int(v) for b in loader for v in b[:, 0].numpy()]


def test_generator_drives_the_shuffle():
    ds = WhoLoads()
    a = _order(DataLoader(ds, batch_size=5, shuffle=True, generator=sampan.Generator(3)))
    b = _order(DataLoader(ds, batch_size=5, shuffle=True, generator=sampan.Generator(3)))
    c = _order(DataLoader(ds, batch_size=5, shuffle=True, generator=sampan.Generator(4)))
    assert a == b != c and sorted(a) == list(range(12))
    g = sampan.Generator(3)
    loader = DataLoader(ds, batch_size=5, shuffle=True, generator=g, num_workers=2)
    first, second = _order(loader), _order(loader)
    assert first == a and second != first and sorted(second) == list(range(12))


def test_pin_memory_and_torch_arguments_are_accepted():
    ds = WhoLoads()
    loader = DataLoader(ds, batch_size=4, pin_memory=True, pin_memory_device="cpu",
                        prefetch_factor=None, drop_last=True, timeout=5.0,
                        worker_init_fn=lambda wid: None, num_workers=1)
    assert _order(loader) == list(range(12))
    with pytest.raises(sampan.SampanValueError, match="persistent_workers"):
        DataLoader(ds, persistent_workers=True)


@pytest.mark.parametrize("mode,col", [("thread", 2), ("process", 1)])
def test_persistent_workers_survive_epochs_and_stop_on_close(mode, col):
    loader = DataLoader(WhoLoads(), batch_size=3, num_workers=2, worker_mode=mode,
                        persistent_workers=True, seed=0, shuffle=True)
    e1 = [b.numpy() for b in loader]
    pool = loader._pool
    e2 = [b.numpy() for b in loader]
    assert loader._pool is pool  # the same workers served both epochs
    who1 = {int(r[col]) for b in e1 for r in b}
    who2 = {int(r[col]) for b in e2 for r in b}
    assert who1 == who2 and len(who1) == 2
    assert sorted(int(r[0]) for b in e2 for r in b) == list(range(12))
    it = iter(loader)  # an epoch abandoned half way: the next one is still whole
    next(it)
    del it
    assert sorted(int(r[0]) for b in loader for r in b.numpy()) == list(range(12))
    workers = list(pool.workers)
    assert all(w.is_alive() for w in workers)
    loader.close()
    assert not any(w.is_alive() for w in workers)


def test_persistent_workers_stop_when_the_loader_is_collected():
    loader = DataLoader(Count(10), batch_size=2, num_workers=2, persistent_workers=True)
    assert sorted(int(v) for b in loader for v in b.numpy()) == list(range(10))
    assert sorted(int(v) for b in loader for v in b.numpy()) == list(range(10))  # restarts
    workers = list(loader._pool.workers)
    del loader
    gc.collect()
    for w in workers:
        w.join(3.0)
    assert not any(w.is_alive() for w in workers)


def test_random_split_takes_a_sampan_generator():
    a = [s.indices for s in sd.random_split(range(10), [6, 4], generator=sampan.Generator(2))]
    b = [s.indices for s in sd.random_split(range(10), [6, 4], generator=sampan.Generator(2))]
    assert a == b and sorted(a[0] + a[1]) == list(range(10))
    with pytest.raises(sampan.SampanValueError, match="generator"):
        sd.RandomSampler(range(3), generator=3).__iter__()
