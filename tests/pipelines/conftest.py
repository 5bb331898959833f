import pytest
from pipeline_runs import make_small_wikitext


@pytest.fixture(scope="session")
def small_wikitext(tmp_path_factory):
    """The first lines of the real validation and test splits, for quick runs."""
    return make_small_wikitext(tmp_path_factory.mktemp("wikitext-small"))
