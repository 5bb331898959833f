"""Learned absolute position embedding (GPT, GPT-2, BERT)."""

import keras
from keras import ops

from keras_tfam.utils import check_positive_int, static_dim


@keras.saving.register_keras_serializable(package="keras_tfam")
class PositionEmbedding(keras.layers.Layer):
    """One learned vector per position, to add to the token embeddings.

    Args:
        sequence_length: number of positions the table holds.
        initializer: initializer of the `(sequence_length, D)` table.

    Call arguments:
        inputs: `(B, T, D)` embeddings; only their shape is used.
        start_index: absolute position of the first row (the cache update
            index when decoding).

    Returns:
        `(B, T, D)`: rows `start_index .. start_index + T - 1` of the table.

    Examples:
        >>> x = keras.random.normal((2, 10, 64))
        >>> x = x + PositionEmbedding(sequence_length=128)(x)
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        check_positive_int("sequence_length", sequence_length)
        self.sequence_length = sequence_length
        self.initializer = keras.initializers.get(initializer)

    def build(self, inputs_shape):
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, inputs_shape[-1]),
            initializer=self.initializer,
        )
        self.built = True

    def call(self, inputs, start_index=0):
        length = static_dim(inputs.shape[-2])
        if length is not None and isinstance(start_index, int) and start_index + length > self.sequence_length:
            raise ValueError(
                f"Positions {start_index}..{start_index + length - 1} exceed the "
                f"{self.sequence_length} positions of this embedding. Received: "
                f"inputs.shape={tuple(inputs.shape)}, start_index={start_index}"
            )
        shape = ops.shape(inputs)
        table = ops.cast(self.position_embeddings, self.compute_dtype)
        # A gather rather than a slice of `length` rows: JAX's export cannot compare a symbolic length with the
        # table's size, which a dynamic slice needs (`keras.Model.export` with a dynamic sequence axis).
        positions = ops.arange(shape[-2], dtype="int32") + ops.cast(start_index, "int32")
        rows = ops.take(table, positions, axis=0)
        return ops.broadcast_to(rows, shape)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config
