"""The kernel-choice tests' shared fixture: a fresh choice cache file, a quiet machine
(the load average made quiet and steady) and no pool forced from the environment."""
import pytest

from sampan.backends import cache as kcache, choice


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "kernels.json"
    monkeypatch.setenv("SAMPAN_KERNEL_CACHE", str(path))
    monkeypatch.delenv("SAMPAN_GEMM_POOL", raising=False)
    monkeypatch.delenv("SAMPAN_GEMM_POOL_BF16", raising=False)
    monkeypatch.setattr(kcache, "busy", lambda: False)
    monkeypatch.setattr(kcache, "load_per_core", lambda: 0.5)
    choice.reset()
    yield path
    choice.reset()
