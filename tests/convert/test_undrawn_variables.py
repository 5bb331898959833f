"""Loaders build a model and give each variable its checkpoint value: filled variables hold the checkpoint's
tensors, the others keep their draws, and the model runs like any other."""

import os

import keras
import numpy as np
import pytest

from keras_tfam.convert.undrawn_variables import build_and_fill, fill
from keras_tfam.models import GPT2LM, from_huggingface

LLAMA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "hf-llama-tiny")


def test_filled_variables_hold_the_values_and_the_rest_are_drawn():
    values = {}

    def fill_half(model):
        for i, variable in enumerate(model.weights):
            if i % 2 == 0:
                values[variable.path] = np.full(variable.shape, i, variable.dtype)
                fill(variable, values[variable.path])

    model = build_and_fill(lambda: GPT2LM(vocabulary_size=16, num_layers=1, num_heads=2, hidden_dim=8), fill_half)
    for i, variable in enumerate(model.weights):
        value = keras.ops.convert_to_numpy(variable)
        if i % 2 == 0:
            np.testing.assert_array_equal(value, values[variable.path])
        else:
            assert np.isfinite(value).all()
    with keras.StatelessScope():  # what a JAX generate does
        model(np.zeros((1, 3), "int32"))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.weights[0]), values[model.weights[0].path])


def test_a_failed_fill_raises_its_error():
    def broken(model):
        raise ValueError("a tensor of the wrong shape")

    with pytest.raises(ValueError, match="wrong shape"):
        build_and_fill(lambda: GPT2LM(vocabulary_size=16, num_layers=1, num_heads=2, hidden_dim=8), broken)


def test_an_imported_checkpoint_is_its_tensors():
    from keras_tfam.convert import SafetensorsCheckpoint

    model = from_huggingface(LLAMA)
    stored = SafetensorsCheckpoint(LLAMA).tensor("model.layers.1.mlp.down_proj.weight")
    kernel = model.transformer_blocks[1].feed_forward.output_dense.kernel
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(kernel), np.asarray(stored).T)
