"""Models saved on TensorFlow load on JAX and PyTorch with the same logits and the same greedy tokens.

The `.keras` files are written here (the suite runs on TensorFlow); each other
backend reads them in its own process (TensorFlow and PyTorch in one process
crash). PyTorch is not part of the test install: its half runs where it is
installed (`pip install -e '.[bench]'`).
"""

import importlib.util
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_tfam.models import GPT2LM, Transformer, TransformerXLLM

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BOS, EOS = 1, 2

# What each model computes, on the backend that runs it: full-pass logits and greedy tokens.
PROBE = r"""
import json, sys
import numpy as np
import keras
import keras_tfam  # noqa: F401  (registers the classes)


def probe(folder):
    tokens = np.load(f"{folder}/tokens.npy")
    source = np.load(f"{folder}/source.npy")
    out = {}
    gpt2 = keras.saving.load_model(f"{folder}/gpt2.keras")
    out["gpt2_logits"] = keras.ops.convert_to_numpy(gpt2(tokens)).tolist()
    out["gpt2_greedy"] = gpt2.generate([[3, 1, 4], [5, 9]], 12).tolist()
    xl = keras.saving.load_model(f"{folder}/xl.keras")
    out["xl_logits"] = keras.ops.convert_to_numpy(xl(tokens)).tolist()
    out["xl_greedy"] = xl.generate([[3, 1, 4], [5, 9]], 12).tolist()
    transformer = keras.saving.load_model(f"{folder}/transformer.keras")
    target = np.concatenate([np.full((len(source), 1), 1), source[:, :4]], axis=1).astype("int32")
    out["transformer_logits"] = keras.ops.convert_to_numpy(transformer({"source": source, "target": target})).tolist()
    out["transformer_greedy"] = np.asarray(transformer.generate(source, 1, 2, max_length=8)).tolist()
    return out
"""


def run_probe(backend, folder):
    environment = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE + "\nprint(json.dumps(probe(sys.argv[1])))", folder],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The three models saved on TensorFlow, and what they compute there."""
    folder = tmp_path_factory.mktemp("cross_backend")
    rng = np.random.default_rng(0)
    tokens, source = rng.integers(0, 31, size=(2, 10)).astype("int32"), rng.integers(3, 23, size=(2, 6)).astype("int32")
    np.save(folder / "tokens.npy", tokens)
    np.save(folder / "source.npy", source)
    keras.utils.set_random_seed(0)
    GPT2LM(vocabulary_size=31, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=32).save(
        folder / "gpt2.keras"
    )
    xl = TransformerXLLM(vocabulary_size=31, num_layers=2, num_heads=2, hidden_dim=16, memory_length=6)
    xl(tokens)
    xl.save(folder / "xl.keras")
    Transformer(vocabulary_size=23, num_layers=1, num_heads=2, hidden_dim=16).save(folder / "transformer.keras")
    namespace = {}
    exec(PROBE, namespace)  # the suite's own backend, in this process
    return str(folder), namespace["probe"](str(folder))


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_weights_saved_on_tensorflow_give_the_same_logits_and_tokens(saved, backend):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed here")
    folder, expected = saved
    received = run_probe(backend, folder)
    for model in ("gpt2", "xl", "transformer"):
        np.testing.assert_allclose(received[f"{model}_logits"], expected[f"{model}_logits"], atol=1e-5, err_msg=model)
        assert received[f"{model}_greedy"] == expected[f"{model}_greedy"], model
