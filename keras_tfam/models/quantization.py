"""The config of a quantized model: which of its layers are quantized, and how."""

import keras

from keras_tfam.keras_compat import give_own_dtype_policy
from keras_tfam.models.lora import sublayers


class QuantizedConfigMixin:
    """Mixed into the library's models: a `dtype` config that records quantized layers.

    A quantized model's `dtype` is a `DTypePolicyMap` from each quantized
    layer's path to its policy (as keras-hub's backbones save it): the
    model, rebuilt from its config, hands the map to every layer, and each
    layer built at that path is built quantized, ready for its weights.
    """

    def dtype_policy_config(self):
        """The serialized `dtype` of the model's config."""
        default = self.dtype_policy
        if isinstance(default, keras.dtype_policies.DTypePolicyMap):
            default = default.default_policy
        quantized = {layer.path: layer.dtype_policy for layer in sublayers(self) if layer.quantization_mode}
        if not quantized:
            return keras.dtype_policies.serialize(default)
        policy = keras.dtype_policies.DTypePolicyMap(default_policy=default)
        for path, layer_policy in quantized.items():
            # A layer of a loaded model that is not built yet still holds the whole map.
            if isinstance(layer_policy, keras.dtype_policies.DTypePolicyMap):
                layer_policy = layer_policy[path]
            policy[path] = layer_policy
        return keras.dtype_policies.serialize(policy)

    def resolve_dtype_policy_maps(self):
        """Gives each built layer its own policy out of a `DTypePolicyMap`.

        Every layer of a model rebuilt from a quantized config holds the whole
        map and looks its policy up at its path, which Keras' layers do in
        most places but not all: `Dense` and `Embedding.save_own_variables`
        read the map's own mode (`None`) and would save no scale, so a loaded
        quantized model could not be saved again. Once the layers are built
        at their paths, each keeps the one policy it was built with.
        """
        for layer in sublayers(self):
            policy = layer.dtype_policy
            if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.built and layer.path:
                give_own_dtype_policy(layer, policy[layer.path])
