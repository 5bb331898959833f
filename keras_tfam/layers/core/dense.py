"""Keras' `Dense`, whose products an entered engine may compute in its own form (`keras_tfam.engine`)."""

import keras

from keras_tfam.engine import current_engine
from keras_tfam.keras_compat import FreesDeletedVariables, SavesQuantizedLora


@keras.saving.register_keras_serializable(package="keras_tfam")
class Dense(SavesQuantizedLora, FreesDeletedVariables, keras.layers.Dense):
    """Keras' `Dense` layer: `activation(x @ kernel + bias)`.

    Outside an entered engine it computes what Keras' `Dense` computes. Inside one (the generator's decoding
    loop), the engine may compute the product in another form (`keras_tfam.engine.Engine.dense`, and
    `Engine.int8_dense` once quantized), the same sums within float32 rounding.

    `quantize(mode)` is Keras' quantization (its quantizers, its kernel layout, its saved files).

    Args:
        units: output width.
        **kwargs: every other argument of `keras.layers.Dense`
            (`activation`, `use_bias`, initializers, `lora_rank`, `dtype`, ...).

    Examples:
        >>> layer = Dense(4, bias_initializer="ones")
        >>> x = keras.ops.ones((1, 1, 3))
        >>> bool(keras.ops.all(layer(x) == keras.ops.matmul(x, layer.kernel) + layer.bias))
        True
    """

    def call(self, inputs, training=None):
        outputs = current_engine().dense(self, inputs)
        return super().call(inputs, training=training) if outputs is None else outputs

    def _int8_call(self, inputs, training=None):
        outputs = current_engine().int8_dense(self, inputs)
        return super()._int8_call(inputs, training=training) if outputs is None else outputs

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses subclasses unless they opt in: `call` above keeps Keras' `Dense.call` contract.
        super().quantize(mode, type_check=False, config=config)
