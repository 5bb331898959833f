import pytest
from pipeline_runs import TRAINED_RUN_OPTIONS, make_small_wikitext, run_tfam, tiny_args


@pytest.fixture(scope="session")
def small_wikitext(tmp_path_factory):
    """The first lines of the real validation and test splits, for quick runs."""
    return make_small_wikitext(tmp_path_factory.mktemp("wikitext-small"))


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, small_wikitext):
    """A finished 4-step run (2 backups, best and final checkpoints, export 1). Copy it to change it."""
    run = str(tmp_path_factory.mktemp("run") / "gpt2")
    run_tfam(tiny_args(small_wikitext, run, **TRAINED_RUN_OPTIONS))
    return run
