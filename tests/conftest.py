import os

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
        or (item.nodeid.startswith("tests/models/test_decoding_models.py") and "greedy" in item.name and "[gpt2_" in item.name)
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if runs_on_every_backend(item):
            item.add_marker("every_backend")


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
