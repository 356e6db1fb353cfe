"""With SAMPAN_OMP_SPIN=auto (off by default) sampan's OpenMP wait policy goes with the
GEMM pool (sampan/_threads.py): PASSIVE where
OpenBLAS may run its own threads, a bounded spin where the "onednn" pool (OpenBLAS on
one thread) owns the cores, read from the kernel choice cache before libgomp loads; a
process that spins by sampan's choice keeps the "onednn" pool (backends/pool.py)."""
import json

import pytest

from sampan import _threads
from sampan.backends import cache as kcache, choice, onednn, pool


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    for k in ("SAMPAN_OMP_SPIN", "SAMPAN_GEMM_POOL", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(k, raising=False)
    path = tmp_path / "kernels.json"
    monkeypatch.setenv("SAMPAN_KERNEL_CACHE", str(path))
    return path


def _write_pools(path, winners, model=None):
    model = model or _threads.cpu_model()
    machines = {f"{model}|abc|numpy=1|threads={i + 2}": {pool.POOL_KEY: {"winner": w}}
                for i, w in enumerate(winners)}
    path.write_text(json.dumps({"format": 1, "machines": machines, "sha256": "x"}))


def test_the_cached_onednn_pool_asks_for_a_bounded_spin(clean_env, monkeypatch):
    _write_pools(clean_env, ["onednn"])
    assert _threads.sampan_policy() == _threads.PASSIVE_POLICY          # off by default
    monkeypatch.setenv("SAMPAN_OMP_SPIN", "auto")
    clean_env.unlink()
    assert _threads.sampan_policy() == _threads.PASSIVE_POLICY          # no cache yet
    _write_pools(clean_env, ["onednn"])
    assert _threads.one_pool_hint()
    assert _threads.sampan_policy() == _threads.SPIN_POLICY
    _write_pools(clean_env, ["onednn", "openblas"])       # two sections that disagree
    assert _threads.sampan_policy() == _threads.PASSIVE_POLICY
    _write_pools(clean_env, ["onednn"], model="another CPU")
    assert _threads.sampan_policy() == _threads.PASSIVE_POLICY
    clean_env.write_text("{not json")
    assert _threads.sampan_policy() == _threads.PASSIVE_POLICY


def test_the_environment_decides_first(clean_env, monkeypatch):
    _write_pools(clean_env, ["onednn"])
    monkeypatch.setenv("SAMPAN_OMP_SPIN", "auto")
    monkeypatch.setenv("SAMPAN_GEMM_POOL", "openblas")
    assert _threads.sampan_policy() == _threads.PASSIVE_POLICY
    monkeypatch.setenv("SAMPAN_OMP_SPIN", "1")
    assert _threads.sampan_policy() == _threads.SPIN_POLICY
    monkeypatch.delenv("SAMPAN_GEMM_POOL")
    monkeypatch.setenv("SAMPAN_OMP_SPIN", "0")
    assert _threads.sampan_policy() == _threads.PASSIVE_POLICY
    monkeypatch.setenv("SAMPAN_OMP_SPIN", "auto")
    monkeypatch.setenv("SAMPAN_GEMM_POOL", "onednn")
    assert _threads.sampan_policy() == _threads.SPIN_POLICY
    monkeypatch.delenv("SAMPAN_OMP_SPIN")                                # default: off
    assert _threads.sampan_policy() == _threads.PASSIVE_POLICY


def test_the_kernel_cache_reads_the_same_file(clean_env):
    assert kcache.cache_path() == _threads.kernel_cache_path() == str(clean_env)


def test_which_policies_spin(monkeypatch):
    for shown, spins in (("OMP_WAIT_POLICY=PASSIVE", False), ("GOMP_SPINCOUNT=10000", True),
                         ("GOMP_SPINCOUNT=0", False), ("OMP_WAIT_POLICY=ACTIVE", True),
                         ("OMP_WAIT_POLICY=PASSIVE (a libgomp loaded before sampan keeps "
                          "its default)", False)):
        monkeypatch.setattr(_threads, "openmp_wait_policy", lambda s=shown: s)
        assert _threads.openmp_spins() is spins, shown


@pytest.mark.skipif(not onednn.available(),
                    reason=f"oneDNN unavailable: {onednn.why_unavailable()}")
def test_sampans_spin_keeps_the_onednn_pool_without_calibrating(cache, monkeypatch):
    monkeypatch.setattr(pool, "calibrate", lambda: pytest.fail("spinning: no calibration"))
    monkeypatch.setattr(pool, "spin_owns_cores", lambda: True)
    choice.reset()
    assert pool.decide() == "onednn"
    assert _threads.blas_cap() == 1          # OpenBLAS on one thread beside the spin
    monkeypatch.setenv("SAMPAN_GEMM_POOL", "openblas")      # forcing still wins
    choice.reset()
    assert pool.decide() == "openblas" and _threads.blas_cap() is None


def test_spin_owns_cores_only_when_the_spin_is_sampans(monkeypatch):
    monkeypatch.setitem(_threads._POLICY, "sampan_spin", True)
    assert pool.spin_owns_cores()
    monkeypatch.setitem(_threads._POLICY, "sampan_spin", False)    # e.g. the user's spin
    assert not pool.spin_owns_cores()
