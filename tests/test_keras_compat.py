"""Each work-around of `keras_tfam.keras_compat` against the Keras behaviour it exists for: these fail when
Keras changes it, and the work-around goes then."""

import gc
import weakref

import keras

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
