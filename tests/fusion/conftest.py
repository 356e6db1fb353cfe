"""Fusion tests share one kernel cache directory per session (numba compiles are slow)."""
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("kernels"))
    old = os.environ.get("SAMPAN_CACHE_DIR")
    os.environ["SAMPAN_CACHE_DIR"] = d
    yield d
    if old is None:
        os.environ.pop("SAMPAN_CACHE_DIR", None)
    else:
        os.environ["SAMPAN_CACHE_DIR"] = old
