import collections
import json
import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

# The backend-neutral library, run on JAX as well by scripts/test.sh (`-m every_backend`): every layer
# through the shared harness, the ops, the losses, generation, the attention contract, GPT-2 (cached == uncached, a
# GPT-2 of every attention kind decoding the argmax of its full pass) and Hugging Face parity. The
# layers' NumPy references run on TensorFlow; the math they check is keras.ops, the same everywhere.
EVERY_BACKEND_FILES = (
    "tests/ops/",
    "tests/generation/",
    "tests/losses/",
    "tests/layers/attention/test_attention_contract.py",
    "tests/models/test_gpt2_lm.py",
    "tests/convert/test_huggingface_gpt2.py",
    "tests/convert/test_huggingface_llama.py",
    "tests/models/test_keras_export.py",
    "tests/test_backend_neutral.py",
    "tests/test_engine.py",
    "tests/layers/core/test_dense.py::test_quantize_frees_the_float_weights_without_a_collection",
    "tests/test_cpu.py::test_asking_for_wide_vectors_sets_the_width_xla_compiles_with",
)


# Tests of those files that check what no backend changes. GPT-2 small's parameter count is its variables'
# shapes, from backend-neutral code; on JAX the build also draws its 124M initial values with threefry,
# 24 s under the suite's XLA -O0 (on TensorFlow it builds in a stateless scope, without drawing them).
SAME_ON_EVERY_BACKEND = ("tests/models/test_gpt2_lm.py::test_gpt2_small_has_the_original_parameter_count",)


def runs_on_every_backend(item):
    if item.nodeid in SAME_ON_EVERY_BACKEND:
        return False
    return (
        item.nodeid.startswith(EVERY_BACKEND_FILES)
        or (item.cls is not None and item.cls.__name__.endswith("Harness"))
        or (
            item.nodeid.startswith("tests/models/test_decoding_models.py")
            and "greedy" in item.name
            and "[gpt2_" in item.name
        )
    )


# The order the test files run in. Two pytest-xdist workers take whole files from one queue
# (`--dist loadfile --no-loadscope-reorder`); a file that starts last and runs a minute leaves the other
# core idle for that minute. So the queue starts with the files that took longest on this backend in a
# recorded run (tests/file_seconds.json, longest first: the short ones fill in at the end). A file not
# recorded yet counts as UNRECORDED_FILE_SECONDS. The order changes no result, only the idle tail; to
# record a run: TFAM_RECORD_FILE_SECONDS=tests/file_seconds.json bash scripts/test.sh
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
UNRECORDED_FILE_SECONDS = 10.0


def _backend():
    return os.environ["KERAS_BACKEND"]


def _file_of(nodeid):
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if runs_on_every_backend(item):
            item.add_marker("every_backend")
    seconds = json.loads(FILE_SECONDS.read_text()).get(_backend(), {}) if FILE_SECONDS.exists() else {}
    # A stable sort: the tests of one file stay together and in their own order.
    items.sort(key=lambda item: -seconds.get(_file_of(item.nodeid), UNRECORDED_FILE_SECONDS))


class _FileSecondsRecorder:
    """Sums each file's setup, call and teardown seconds and merges them into `path` at the end of the
    session, under the backend's name (a run of part of the suite updates only the files it ran)."""

    def __init__(self, path):
        self.path = Path(path)
        self.seconds = collections.defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[_file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session):
        recorded = json.loads(self.path.read_text()) if self.path.exists() else {}
        backend = recorded.setdefault(_backend(), {})
        backend.update({name: round(s, 1) for name, s in self.seconds.items()})
        recorded[_backend()] = dict(sorted(backend.items(), key=lambda kv: -kv[1]))
        self.path.write_text(json.dumps(recorded, indent=1) + "\n")


def pytest_configure(config):
    path = os.environ.get("TFAM_RECORD_FILE_SECONDS")
    # The controller of a run whose xdist workers take a file at a time records (they report to it); a run
    # that hands out single tests (the training phase) or has no workers records nothing.
    distributed = config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None)
    if path and distributed and config.getoption("dist") == "loadfile" and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_FileSecondsRecorder(path), "tfam_file_seconds")


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
