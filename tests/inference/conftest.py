import pytest

from ._models import save_all


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """(models, {name: saved program path}), saved once for the inference tests."""
    return save_all(tmp_path_factory.mktemp("predictor"))
