"""`keras.Model.export` (Keras' own serving export) of the library's decoder LMs, on the backend under test:
the SavedModel, loaded in a TensorFlow-only process, serves the model's logits for any sequence length
(learned positions included, whose JAX export failed on a symbolic length)."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_tfam.models import GPT2LM, from_huggingface

LLAMA = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf-llama-tiny")


@pytest.mark.parametrize("kind", ["gpt2_learned_positions", "llama"])
def test_exported_savedmodel_serves_the_model_s_logits_at_any_length(kind, tmp_path):
    pytest.importorskip("tensorflow")
    if kind == "llama":
        model = from_huggingface(LLAMA)
    else:
        model = GPT2LM.from_preset(
            "gpt2_tiny", vocabulary_size=64, num_layers=1, hidden_dim=32, num_heads=2, max_sequence_length=16
        )
    inputs = {length: np.random.default_rng(length).integers(0, 64, (2, length)).astype("int32") for length in (5, 9)}
    expected = {length: keras.ops.convert_to_numpy(model(ids)).tolist() for length, ids in inputs.items()}
    path = str(tmp_path / "export")
    model.export(path, format="tf_saved_model", verbose=False)
    script = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np
        import tensorflow as tf
        served = tf.saved_model.load({path!r})
        given = {json.dumps({k: v.tolist() for k, v in inputs.items()})}
        inputs = {{int(k): np.array(v, np.int32) for k, v in given.items()}}
        logits = {{k: np.asarray(served.serve(v)).tolist() for k, v in inputs.items()}}
        modules = [m for m in ("keras_tfam", "keras", "jax") if m in sys.modules]
        print(json.dumps(dict(logits=logits, modules=modules)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert "keras_tfam" not in served["modules"]
    for length in inputs:
        np.testing.assert_allclose(served["logits"][str(length)], expected[length], atol=1e-5)


def test_transformer_xl_and_the_encoder_decoder_export_too(tmp_path):
    # The two other shapes of model: Transformer-XL is no functional graph (its serving input is declared:
    # int32 token ids of any length), the encoder-decoder takes two inputs by name.
    pytest.importorskip("tensorflow")
    from keras_tfam.models import Transformer, TransformerXLLM

    rng = np.random.default_rng(0)
    xl = TransformerXLLM(
        vocabulary_size=64,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        memory_length=4,
        context_length=6,
    )
    seq2seq = Transformer(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32)
    inputs = {
        "xl": [rng.integers(0, 64, (2, length)).astype("int32") for length in (6, 9)],
        "seq2seq": [
            {
                "source": rng.integers(0, 64, (2, 7)).astype("int32"),
                "target": rng.integers(0, 64, (2, length)).astype("int32"),
            }
            for length in (3, 5)
        ],
    }
    expected = {
        "xl": [keras.ops.convert_to_numpy(xl(ids)).tolist() for ids in inputs["xl"]],
        "seq2seq": [keras.ops.convert_to_numpy(seq2seq(pair)).tolist() for pair in inputs["seq2seq"]],
    }
    for name, model in (("xl", xl), ("seq2seq", seq2seq)):
        model.export(str(tmp_path / name), format="tf_saved_model", verbose=False)
    as_lists = json.dumps(
        {
            "xl": [ids.tolist() for ids in inputs["xl"]],
            "seq2seq": [{key: value.tolist() for key, value in pair.items()} for pair in inputs["seq2seq"]],
        }
    )
    script = textwrap.dedent(
        f"""
        import json
        import numpy as np
        import tensorflow as tf
        inputs = json.loads({as_lists!r})
        xl = tf.saved_model.load({str(tmp_path / "xl")!r})
        seq2seq = tf.saved_model.load({str(tmp_path / "seq2seq")!r})
        print(json.dumps({{
            "xl": [np.asarray(xl.serve(np.array(ids, np.int32))).tolist() for ids in inputs["xl"]],
            "seq2seq": [np.asarray(seq2seq.serve({{k: np.array(v, np.int32) for k, v in pair.items()}})).tolist()
                        for pair in inputs["seq2seq"]],
        }}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    for name in expected:
        for got, want in zip(served[name], expected[name]):
            np.testing.assert_allclose(got, want, atol=1e-5)
