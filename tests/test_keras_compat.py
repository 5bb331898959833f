"""Each work-around of `keras_tfam.keras_compat` against the Keras behaviour it exists for: these fail when
Keras changes it, and the work-around goes then."""

import gc
import weakref

import keras
import numpy as np

from keras_tfam.keras_compat import FreesDeletedVariables, give_own_dtype_policy


def _layer_holding_a_map():
    policies = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
    policies["dense"] = keras.dtype_policies.get("int8_from_float32")
    layer = keras.layers.Dense(4, dtype=policies, name="dense")
    layer.build((None, 3))
    return layer, policies


def test_keras_setter_writes_into_the_map_a_layer_holds():
    # Why `give_own_dtype_policy` exists: the public setter leaves the layer holding the whole map.
    layer, policies = _layer_holding_a_map()
    assert layer.path == "dense"
    layer.dtype_policy = policies["dense"]
    assert isinstance(layer.dtype_policy, keras.dtype_policies.DTypePolicyMap)


def test_give_own_dtype_policy_replaces_the_map():
    layer, policies = _layer_holding_a_map()
    give_own_dtype_policy(layer, policies["dense"])
    assert layer.dtype_policy is policies["dense"] and layer.quantization_mode == "int8"


class _Holder(keras.layers.Layer):
    def build(self, input_shape):
        self.table = self.add_weight(shape=(2, 3), initializer="ones")


class _FreeingHolder(FreesDeletedVariables, _Holder):
    pass


def _collections_while(action):
    """How many garbage collections `action()` ran (Python's public `gc.callbacks`)."""
    runs = []

    def count(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    gc.callbacks.append(count)
    try:
        action()
    finally:
        gc.callbacks.remove(count)
    return runs


def test_keras_collects_garbage_when_a_variable_attribute_is_deleted():
    # Why `FreesDeletedVariables` exists: a full collection per deleted variable.
    layer = _Holder()
    layer.build(None)
    assert 2 in _collections_while(lambda: delattr(layer, "table"))
    assert layer.weights == []


def test_frees_deleted_variables_untracks_without_a_collection_and_frees_the_buffer():
    layer = _FreeingHolder()
    layer.build(None)
    reference = weakref.ref(layer.table)
    assert 2 not in _collections_while(lambda: delattr(layer, "table"))
    assert layer.weights == [] and not hasattr(layer, "table")
    assert reference() is None  # no cycle held it: freed with its last reference


def _quantized_dense_with_trained_factors(cls):
    keras.utils.set_random_seed(0)
    layer = cls(8)
    layer.build((None, 16))
    layer.quantize("int8")
    layer.enable_lora(2)
    layer.lora_kernel_b.assign(keras.random.normal((2, 8), seed=1))  # as if trained
    return layer


def _saved_and_loaded(layer, path):
    inputs = keras.Input((16,))
    keras.Model(inputs, layer(inputs)).save(path)
    return keras.saving.load_model(path).layers[-1]


def test_keras_saves_a_quantized_layer_with_factors_merged_and_quantized_again(tmp_path):
    # Why `SavesQuantizedLora` exists: the loaded layer is another layer than the one saved.
    layer = _quantized_dense_with_trained_factors(keras.layers.Dense)
    x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    loaded = _saved_and_loaded(layer, str(tmp_path / "keras.keras"))
    assert np.abs(np.asarray(loaded(x)) - np.asarray(layer(x))).max() > 1e-4


def test_saves_quantized_lora_keeps_the_weights_and_the_factors_as_they_are(tmp_path):
    from keras_tfam.layers import Dense

    layer = _quantized_dense_with_trained_factors(Dense)
    x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    loaded = _saved_and_loaded(layer, str(tmp_path / "ours.keras"))
    assert loaded.lora_enabled and loaded.lora_rank == 2 and loaded.quantization_mode == "int8"
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(layer(x)))
