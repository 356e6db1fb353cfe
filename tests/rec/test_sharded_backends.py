"""ShardedEmbedding(backend=name) finds its subclass in a table the backend's module
fills (sampan.rec.remote registers "ray"), so sharded.py does not import remote.py."""
import pytest

from sampan.rec import sharded
from sampan.rec.remote import RemoteShardedEmbedding
from sampan.rec.sharded import ShardedEmbedding


def test_ray_is_registered_by_importing_sampan_rec():
    assert sharded.BACKENDS["ray"] is RemoteShardedEmbedding


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"must be 'local' or 'ray', got 'gpu'"):
        ShardedEmbedding(4, n_shards=1, backend="gpu")


def test_a_registered_backend_makes_its_subclass(monkeypatch):
    class Mine(ShardedEmbedding):
        pass

    monkeypatch.setitem(sharded.BACKENDS, "mine", Mine)
    e = ShardedEmbedding(4, n_shards=1, backend="mine")
    assert type(e) is Mine
    assert type(ShardedEmbedding(4, n_shards=1)) is ShardedEmbedding
