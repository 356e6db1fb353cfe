"""Shared test setup: a fixed seed per test and a fast hypothesis profile."""
import numpy as np
import pytest

try:
    from hypothesis import settings
    settings.register_profile("sampan", max_examples=25, deadline=None)
    settings.load_profile("sampan")
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(autouse=True)
def _seed():
    import sampan
    sampan.manual_seed(0)
    np.random.seed(0)
    yield
