"""Token embedding whose matrix is also the output head (Press & Wolf 2017)."""

import keras
import numpy as np
from keras import ops

from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class TiedEmbedding(keras.layers.Layer):
    """Embeds token ids, and projects hidden states back onto the vocabulary.

    Weight tying (Press & Wolf 2017, as in GPT-2): one `(V, D)` matrix `E`
    maps ids to vectors, and `logits = h @ E^T` maps hidden states to
    vocabulary scores, so the output head adds no variable.

    Args:
        vocabulary_size: number of token ids `V`.
        output_dim: embedding width `D`.
        embeddings_initializer: initializer of `E`.
        logits_dtype: dtype of the logits; float32 by default so that losses
            and sampling stay in float32 under mixed precision.

    Call arguments:
        inputs: int token ids `(B, T)` in `[0, V)` (checked when the call runs
            eagerly: a gather would read id `-1` as `V - 1`), or hidden states
            `(B, T, D)` with `reverse=True`.
        reverse: project onto the vocabulary instead of embedding.

    Returns:
        `(B, T, D)` embeddings, or `(B, T, V)` logits with `reverse=True`.

    Example:

    >>> embedding = TiedEmbedding(50257, 768)
    >>> hidden = embedding(token_ids)
    >>> logits = embedding(hidden, reverse=True)
    """

    def __init__(
        self,
        vocabulary_size,
        output_dim,
        embeddings_initializer="uniform",
        logits_dtype="float32",
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("vocabulary_size", vocabulary_size), ("output_dim", output_dim)):
            check_positive_int(name, value)
        self.vocabulary_size = vocabulary_size
        self.output_dim = output_dim
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.logits_dtype = logits_dtype

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.output_dim),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse:
            kernel = ops.cast(self.embeddings, self.compute_dtype)
            logits = ops.matmul(ops.cast(inputs, self.compute_dtype), ops.transpose(kernel))
            return ops.cast(logits, self.logits_dtype)
        self._check_ids(inputs)
        ids = ops.cast(inputs, "int32")
        return ops.cast(ops.take(self.embeddings, ids, axis=0), self.compute_dtype)

    def _check_ids(self, inputs):
        """A `ValueError` for ids outside `[0, V)`, when their values are known (eager calls)."""
        try:
            ids = ops.convert_to_numpy(inputs)
        except Exception:  # symbolic or traced: no values yet (serving signatures assert instead)
            return
        outside = (ids < 0) | (ids >= self.vocabulary_size)
        if np.any(outside):
            where = tuple(int(i) for i in np.argwhere(outside)[0])
            raise ValueError(
                f"Token ids must be in [0, {self.vocabulary_size}) (vocabulary_size={self.vocabulary_size}). "
                f"Received: token id {int(ids[where])} at index {where}"
            )

    def compute_output_spec(self, inputs, reverse=False):
        if reverse:
            shape = tuple(inputs.shape[:-1]) + (self.vocabulary_size,)
            return keras.KerasTensor(shape, dtype=self.logits_dtype)
        return keras.KerasTensor(tuple(inputs.shape) + (self.output_dim,), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            output_dim=self.output_dim,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            logits_dtype=self.logits_dtype,
        )
        return config
