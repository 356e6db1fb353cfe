"""Datasets, samplers and collation (no workers)."""
from collections import namedtuple

import numpy as np
import pytest

from sampan.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    RandomSampler,
    SequentialSampler,
    ShardSampler,
    Subset,
    TensorDataset,
    default_collate,
    random_split,
)
from sampan.errors import SampanError
from sampan.tensor import Tensor


def test_tensor_dataset_rows_and_length_check():
    x = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    y = np.arange(4)
    ds = TensorDataset(x, y)
    assert len(ds) == 4
    xr, yr = ds[2]
    assert isinstance(xr, Tensor) and xr.numpy().tolist() == [6, 7, 8]
    assert isinstance(yr, np.integer) and yr == 2
    with pytest.raises(SampanError, match=r"shapes \(4, 3\), \(5,\)"):
        TensorDataset(x, np.arange(5))


def test_subset_concat_and_random_split():
    ds = TensorDataset(np.arange(10))
    sub = Subset(ds, [9, 0, 3])
    assert [int(sub[i][0]) for i in range(3)] == [9, 0, 3]
    both = ConcatDataset([sub, ds])
    assert len(both) == 13 and int(both[3][0]) == 0 and int(both[-1][0]) == 9
    a, b = random_split(ds, [7, 3], seed=0)
    a2, b2 = random_split(ds, [0.7, 0.3], seed=0)
    assert a.indices == a2.indices and b.indices == b2.indices
    assert sorted(a.indices + b.indices) == list(range(10))
    with pytest.raises(SampanError, match="summing to 10"):
        random_split(ds, [3, 3])


def test_samplers():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3]
    s = RandomSampler(range(20), seed=5)
    e0, e1 = list(s), list(s)
    assert sorted(e0) == list(range(20)) and e0 != e1
    s.set_epoch(0)
    assert list(s) == e0
    assert list(RandomSampler(range(20), seed=5)) == e0
    r = list(RandomSampler(range(3), replacement=True, num_samples=50, seed=1))
    assert len(r) == 50 and set(r) <= {0, 1, 2}
    assert len(list(RandomSampler(range(3), num_samples=7, seed=1))) == 7
    bs = BatchSampler(SequentialSampler(range(7)), 3, drop_last=True)
    assert list(bs) == [[0, 1, 2], [3, 4, 5]] and len(bs) == 2


@pytest.mark.parametrize("shuffle,drop_last", [(False, False), (True, False), (True, True)])
def test_shard_sampler_partitions(shuffle, drop_last):
    n, reps = 11, 3
    shards = [list(ShardSampler(range(n), reps, r, shuffle=shuffle, seed=3, drop_last=drop_last))
              for r in range(reps)]
    assert len({len(s) for s in shards}) == 1
    assert len(shards[0]) == len(ShardSampler(range(n), reps, 0, drop_last=drop_last))
    flat = [i for s in shards for i in s]
    if drop_last:
        assert len(set(flat)) == len(flat) == 9
    else:
        assert set(flat) == set(range(n)) and len(flat) == 12
    with pytest.raises(SampanError, match="rank"):
        ShardSampler(range(4), 2, 2)


Point = namedtuple("Point", "x y")


def test_default_collate_structures():
    batch = default_collate([{"img": np.ones((2, 2), np.float32), "label": 1, "w": 0.5,
                              "name": "a", "p": Point(np.int32(1), True)},
                             {"img": np.zeros((2, 2), np.float32), "label": 0, "w": 1.5,
                              "name": "b", "p": Point(np.int32(2), False)}])
    assert isinstance(batch["img"], Tensor) and batch["img"].shape == (2, 2, 2)
    assert batch["label"].dtype == np.int64 and batch["label"].numpy().tolist() == [1, 0]
    assert batch["w"].dtype == np.float32
    assert batch["name"] == ["a", "b"]
    assert isinstance(batch["p"], Point) and batch["p"].x.dtype == np.int32
    assert batch["p"].y.dtype == np.bool_
    tup = default_collate([(Tensor(np.ones(3, np.float32)), 2), (Tensor(np.ones(3)), 3)])
    assert isinstance(tup, tuple) and tup[0].shape == (2, 3)


def test_default_collate_errors_name_the_field():
    with pytest.raises(SampanError, match=r"different shapes at 'x'.*\(3,\).*\(4,\)"):
        default_collate([{"x": np.ones(3)}, {"x": np.ones(4)}])
    with pytest.raises(SampanError, match="cannot batch samples of type object"):
        default_collate([object(), object()])


class Squares(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return i * i


def test_loader_without_workers():
    dl = DataLoader(Squares(), batch_size=4)
    assert len(dl) == 3
    assert [b.numpy().tolist() for b in dl] == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]
    assert len(DataLoader(Squares(), batch_size=4, drop_last=True)) == 2
    assert [int(x) for x in DataLoader(Squares(), batch_size=None)][:3] == [0, 1, 4]
    bs = BatchSampler(SequentialSampler(range(10)), 5)
    assert len(list(DataLoader(Squares(), batch_sampler=bs))) == 2
    with pytest.raises(SampanError, match="batch_sampler excludes"):
        DataLoader(Squares(), batch_sampler=bs, shuffle=True)
    with pytest.raises(SampanError, match="worker_mode"):
        DataLoader(Squares(), worker_mode="fiber")
    raw = DataLoader(Squares(), batch_size=3, collate_fn=list)
    assert next(iter(raw)) == [0, 1, 4]
