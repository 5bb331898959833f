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


# The files that take longest (about 30 to 130 s each on 2 cores, TensorFlow and JAX phases), longest
# first. scripts/test.sh's two workers take a file at a time in collection order
# (`--dist loadfile --no-loadscope-reorder`): started first, the long files leave only short ones for
# the end, and neither worker waits long for the other (a long file started last kept one waiting 30 s).
LONGEST_FIRST = (
    "tests/pipelines/test_training.py",
    "tests/models/test_gpt2_lm.py",
    "tests/layers/attention/test_attention_contract.py",
    "tests/pipelines/test_export_and_cli.py",
    "tests/docs/test_readme_examples.py",
    "tests/models/test_early_exit_lm.py",
    "tests/models/test_decoding_models.py",
    "tests/docs/test_docstrings.py",
    "tests/pipelines/test_kill_anywhere.py",
    "tests/models/test_keras_export.py",
    "tests/pipelines/test_init_from.py",
    "tests/pipelines/test_early_exit_and_knn.py",
    "tests/models/test_transformer_xl_lm.py",
    "tests/pipelines/test_export_bpe.py",
    "tests/layers/adaptive/test_universal_transformer.py",
    "tests/models/test_cross_backend.py",
    "tests/pipelines/data/test_graph_tokenizer.py",
    "tests/models/test_quantization_and_lora.py",
    "tests/pipelines/test_recovery.py",
    "tests/generation/test_sliding_window.py",
    "tests/generation/test_search.py",
    "tests/ops/test_banded.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if runs_on_every_backend(item):
            item.add_marker("every_backend")
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
