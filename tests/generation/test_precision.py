"""Reduced-precision decoding copies: same model, bfloat16 weights, nearly the same choices."""

import keras
import numpy as np
import pytest
from backend import forward

from keras_tfam.generation import with_dtype
from keras_tfam.models import GPT2LM


def test_bfloat16_copy_decodes_nearly_as_float32():
    keras.utils.set_random_seed(2)
    model = GPT2LM(vocabulary_size=97, num_layers=2, num_heads=4, hidden_dim=64, max_sequence_length=64)
    copy = with_dtype(model, "bfloat16")
    assert {str(w.dtype) for w in copy.weights} == {"bfloat16"} and copy.count_params() == model.count_params()
    expected = model.token_embedding.embeddings.numpy().astype("bfloat16")
    np.testing.assert_array_equal(copy.token_embedding.embeddings, expected)
    tokens = model.generate(np.random.default_rng(0).integers(0, 97, size=(4, 8)), 40)
    expected, logits = forward(model, tokens), forward(copy, tokens)
    assert logits.dtype == np.float32
    scale = np.abs(expected).max()
    assert np.abs(logits - expected).max() < 0.05 * scale
    # Teacher-forced on the float32 output: the same greedy choice at almost every position.
    assert np.mean(logits.argmax(-1) == expected.argmax(-1)) >= 0.95
    # The copy's own cached greedy decoding of 4 rows (on a CPU, in the XLA-CPU engine, a few rows multiply
    # float32 copies of its kernels) picks, at each step, a token its own full pass scores within bfloat16
    # rounding of the best.
    decoded = np.asarray(copy.generate(tokens[:, :8], 40))
    assert decoded.shape == tokens.shape
    full = forward(copy, decoded)[:, 7:-1]  # the logits that chose tokens 8..47
    chosen = np.take_along_axis(full, decoded[:, 8:, None], axis=-1)[..., 0]
    assert np.all(chosen >= full.max(-1) - 0.02 * scale)
    assert np.mean(full.argmax(-1) == decoded[:, 8:]) >= 0.95


def test_bad_dtype():
    model = GPT2LM(vocabulary_size=11, num_layers=1, num_heads=2, hidden_dim=8)
    with pytest.raises(ValueError, match="Received: dtype='int4'"):
        with_dtype(model, "int4")
