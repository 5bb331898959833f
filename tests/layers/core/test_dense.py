import keras
import numpy as np
import pytest
from backend import BACKEND, compiled, optimized_hlo
from harness import LayerHarness

from keras_tfam.layers import Dense

rng = np.random.default_rng(0)


class TestDenseHarness(LayerHarness):
    layer_cls = Dense
    init_kwargs = {"units": 6, "activation": "gelu", "bias_initializer": "random_normal"}

    def make_inputs(self):
        # One row: the eager calls take the layer's own path, the functional model (batch unknown) Keras'.
        return {"inputs": rng.normal(size=(1, 1, 8)).astype("float32")}


def _pair(units=6, **kwargs):
    """Our `Dense` and Keras' with the same weights."""
    ours = Dense(units, bias_initializer="random_normal", **kwargs)
    theirs = keras.layers.Dense(units, **kwargs)
    ours.build((None, 8))
    theirs.build((None, 8))
    theirs.set_weights(ours.get_weights())
    return ours, theirs


@pytest.mark.parametrize("shape", [(1, 8), (1, 1, 8), (3, 8), (2, 1, 8)])
def test_equals_keras_dense_and_the_formula_bit_for_bit(shape):
    ours, theirs = _pair()
    x = rng.normal(size=shape).astype("float32")
    kernel, bias = (np.asarray(w) for w in ours.get_weights())
    out = keras.ops.convert_to_numpy(ours(x))
    # x - (-b) == x + b exactly: negation only flips the sign bit.
    np.testing.assert_array_equal(out, keras.ops.convert_to_numpy(theirs(x)))
    np.testing.assert_allclose(out, x @ kernel + bias, rtol=1e-6, atol=1e-6)
    step = compiled(lambda x: ours(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(step(x)), x @ kernel + bias, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(BACKEND not in ("tensorflow", "jax"), reason="XLA's CPU fusion decisions")
def test_one_row_product_is_not_output_fused_with_its_bias():
    """XLA's CPU backend emits `dot + bias` of one row as a single-threaded "output fusion"; ours stays a dot."""
    x = rng.normal(size=(1, 1, 64)).astype("float32")
    ours = Dense(128)
    ours.build((None, 64))
    assert "kind=kOutput" not in optimized_hlo(ours, x)
    if BACKEND == "tensorflow":  # Keras' Dense is fused there (JAX's lowering leaves its add apart)
        theirs = keras.layers.Dense(128)
        theirs.build((None, 64))
        assert "kind=kOutput" in optimized_hlo(theirs, x)


def test_quantized_and_lora_layers_take_keras_paths():
    x = rng.normal(size=(1, 1, 8)).astype("float32")
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.quantize("int8")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours(x)), keras.ops.convert_to_numpy(theirs(x)))

    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.enable_lora(2)
        layer.lora_kernel_b.assign(rng.normal(size=(2, 6)).astype("float32"))
    theirs.lora_kernel_a.assign(ours.lora_kernel_a)
    theirs.lora_kernel_b.assign(ours.lora_kernel_b)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours(x)), keras.ops.convert_to_numpy(theirs(x)), rtol=1e-6, atol=1e-6
    )
