"""Token embedding whose matrix is also the output head (Press & Wolf 2017)."""

import keras
import numpy as np
from keras import ops

from keras_tfam.engine import current_engine
from keras_tfam.keras_compat import FreesDeletedVariables, SavesQuantizedLora
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class TiedEmbedding(SavesQuantizedLora, FreesDeletedVariables, keras.layers.ReversibleEmbedding):
    """Embeds token ids, and projects hidden states back onto the vocabulary.

    Weight tying (Press & Wolf 2017, as in GPT-2): one `(V, D)` matrix `E`
    maps ids to vectors, and `logits = h @ E^T` maps hidden states to
    vocabulary scores, so the output head adds no variable.

    Keras' `ReversibleEmbedding` with the weights tied, float32 logits and
    checked ids: `quantize("int8" | "int4")` quantizes the one matrix for
    both directions, and `enable_lora(rank)` adapts both, as Keras does.
    Inside an entered engine (the generator's decoding loop), the engine may
    compute the logits in another form (`keras_tfam.engine.Engine.reverse_embedding`).

    Args:
        vocabulary_size: number of token ids `V`.
        output_dim: embedding width `D`.
        embeddings_initializer: initializer of `E`.
        logits_dtype: dtype of the logits; float32 by default so that losses
            and sampling stay in float32 under mixed precision.
        **kwargs: other arguments of `keras.layers.Embedding` (`name`,
            `dtype`, `lora_rank`, ...).

    Call arguments:
        inputs: int token ids `(B, T)` in `[0, V)` (checked when the call runs
            eagerly: a gather would read id `-1` as `V - 1`), or hidden states
            `(B, T, D)` with `reverse=True`.
        reverse: project onto the vocabulary instead of embedding.

    Returns:
        `(B, T, D)` embeddings, or `(B, T, V)` logits with `reverse=True`.

    Examples:
        >>> embedding = TiedEmbedding(1000, 32)
        >>> hidden = embedding(np.array([[5, 7, 9]]))
        >>> embedding(hidden, reverse=True).shape  # logits over the vocabulary
        (1, 3, 1000)
    """

    def __init__(
        self,
        vocabulary_size,
        output_dim,
        embeddings_initializer="uniform",
        logits_dtype="float32",
        **kwargs,
    ):
        for name, value in (("vocabulary_size", vocabulary_size), ("output_dim", output_dim)):
            check_positive_int(name, value)
        super().__init__(
            vocabulary_size, output_dim, tie_weights=True, embeddings_initializer=embeddings_initializer, **kwargs
        )
        self.vocabulary_size = vocabulary_size
        self.logits_dtype = logits_dtype

    def call(self, inputs, reverse=False):
        if reverse:
            inputs = ops.cast(inputs, self.compute_dtype)
            logits = current_engine().reverse_embedding(self, inputs)
            if logits is None:
                logits = super().call(inputs, reverse=True)
            return ops.cast(logits, self.logits_dtype)
        self._check_ids(inputs)
        return super().call(ops.cast(inputs, "int32"))

    def quantized_call(self, inputs, reverse=False):
        if reverse:
            logits = super().quantized_call(ops.cast(inputs, self.compute_dtype), reverse=True)
            return ops.cast(logits, self.logits_dtype)
        self._check_ids(inputs)
        return super().quantized_call(ops.cast(inputs, "int32"))

    def _int8_call(self, inputs, reverse=False):
        logits = current_engine().int8_logits(self, inputs) if reverse else None
        return super()._int8_call(inputs, reverse=reverse) if logits is None else logits

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses subclasses unless they opt in: `quantized_call` above keeps our call's contract.
        super().quantize(mode, type_check=False, config=config)

    def _int4_build(self, embeddings_shape, config=None):
        super()._int4_build(embeddings_shape, config)
        # int4 is weight-only unless the config quantizes inputs, as for Keras' Dense and for
        # `Model.quantize("int4")`; ReversibleEmbedding would quantize the reverse projection's inputs
        # when rebuilt without a config (a model loaded from its file), and so decode differently.
        self.inputs_quantizer = keras.quantizers.QuantizationConfig.activation_quantizer_or_default(config, None)

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
        for name in ("input_dim", "tie_weights", "reverse_dtype", "logit_soft_cap"):
            config.pop(name, None)
        config.update(vocabulary_size=self.vocabulary_size, logits_dtype=self.logits_dtype)
        return config
