"""The library runs on JAX without TensorFlow: a fresh process imports it, builds models and generates."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_library_imports_and_generates_on_jax_without_tensorflow():
    script = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        import keras_tfam
        from keras_tfam.models import GPT2LM, Transformer
        gpt = GPT2LM(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=8,
                     position="rotary", context_length=8)
        sampled = gpt.generate([[1, 2, 3], [4]], 20, sampler="top_p", seed=3)
        seq2seq = Transformer(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=16)
        beams = seq2seq.generate(np.array([[3, 4, 5]]), 1, 2, max_length=5, beam_size=3)
        print(json.dumps({"backend": keras_tfam.keras_backend(), "shapes": [sampled.shape, beams.shape],
                          "tensorflow": [m for m in sys.modules if m.split(".")[0] == "tensorflow"][:3]}))
        """
    )
    environment = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO, env=environment
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"backend": "jax", "shapes": [[2, 23], [1, 5]], "tensorflow": []}


def test_no_tensorflow_import_in_the_library_sources():
    """`tf.*` belongs to pipelines/; the library's backend-specific spots are the compiler choice, the VJP
    and in-place row writes into a variable.

    Each imports the backend's own module inside the branch for that backend.
    """
    dispatch = {
        os.path.join("generation", "generator.py"),
        os.path.join("ops", "autodiff.py"),
        os.path.join("ops", "in_place.py"),
    }
    offenders = []
    for folder, _, files in os.walk(os.path.join(REPO, "keras_tfam")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        if (
                            "import tensorflow" in line
                            and os.path.relpath(path, os.path.join(REPO, "keras_tfam")) not in dispatch
                        ):
                            offenders.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    assert offenders == []
