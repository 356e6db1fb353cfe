"""The kernel-choice tests' shared fixture: a fresh choice cache file, a quiet machine
(the load average made quiet and steady) and no pool forced from the environment or by
sampan's spinning OpenMP policy."""
import pytest

from sampan.backends import cache as kcache, choice, pool


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "kernels.json"
    monkeypatch.setenv("SAMPAN_KERNEL_CACHE", str(path))
    monkeypatch.delenv("SAMPAN_GEMM_POOL", raising=False)
    monkeypatch.delenv("SAMPAN_GEMM_POOL_BF16", raising=False)
    monkeypatch.setattr(kcache, "busy", lambda: False)
    monkeypatch.setattr(kcache, "load_per_core", lambda: 0.5)
    # the pool is measured here even where sampan's spinning policy holds "onednn"
    monkeypatch.setattr(pool, "spin_owns_cores", lambda: False)
    choice.reset()
    yield path
    choice.reset()
