"""Transformer decoder block: causal self-attention, optional cross-attention, feed-forward."""

import keras

from keras_tfam.layers.attention.attention_inputs import check_mask
from keras_tfam.layers.blocks.transformer_block_base import TransformerBlockBase
from keras_tfam.ops import masks as mask_ops
from keras_tfam.utils import static_dim


@keras.saving.register_keras_serializable(package="keras_tfam")
class TransformerDecoderBlock(TransformerBlockBase):
    """Causal self-attention, optional cross-attention, feed-forward (Vaswani et al. 2017).

    Each sublayer sits in a residual branch, pre- or post-norm. Without an
    encoder sequence the block is the decoder-only block of GPT-2. The KV
    cache of the self-attention passes through `call`, so a decoder stack can
    decode one token at a time; cross-attention keys/values can be computed
    once per source (`cross_attention_layer.compute_key_value_cache`) and
    passed as `cross_attention_cache`.

    Args:
        num_heads, intermediate_dim: as in `TransformerEncoderBlock`, and so
            are `key_dim`, `num_key_value_heads`, `dropout`,
            `attention_dropout`, `activation`, `norm`, `norm_epsilon`,
            `use_bias`, `position`, `kernel_initializer`, `bias_initializer`
            and `output_kernel_initializer`; `position` applies to the
            self-attention only.
        norm_position: `"post"` (default, Vaswani et al.) or `"pre"` (GPT-2).
        self_attention: a layer replacing the default causal self-attention.
        cross_attention: a layer replacing the default cross-attention.

    Call arguments:
        decoder_sequence: `(B, T, D)`.
        encoder_sequence: `(B, S, De)` or `None`. The block has a
            cross-attention sublayer when it is built with one.
        decoder_padding_mask: `(B, T)` (default: the Keras mask of
            `decoder_sequence`). With a cache, it covers the cache: `(B, L)`.
        decoder_attention_mask: `(B, T, T)`, or `(B, T, L)` with a cache.
        encoder_padding_mask: `(B, S)`.
        encoder_attention_mask: `(B, T, S)`. Every mask is boolean (`True`
            = may attend) or 0/1 integers; a float (additive) mask is
            refused: pass `additive_mask == 0`.
        self_attention_cache: `(B, 2, L, K, H)` or `None`.
        self_attention_cache_update_index: where the new tokens go.
        self_attention_window: the self-attention sees at most this many
            most recent positions (a ring cache; see `MultiHeadAttention`).
        cross_attention_cache: precomputed `(B, 2, S, K, H)` keys/values of
            the encoder sequence, or `None`.
        use_causal_mask: default `True`.
        training: whether dropout is active.

    Returns:
        `(B, T, D)`, or `(outputs, self_attention_cache)` when a self
        attention cache is given.

    Examples:
        >>> block = TransformerDecoderBlock(12, 3072, norm_position="pre", activation="gelu_tanh")
        >>> block(keras.random.normal((2, 16, 768))).shape
        (2, 16, 768)
    """

    _LAYER_ARGUMENTS = ("position", "self_attention", "cross_attention")

    def __init__(self, num_heads, intermediate_dim, self_attention=None, cross_attention=None, **kwargs):
        super().__init__(num_heads, intermediate_dim, **kwargs)
        self._check_injected("self_attention", self_attention)
        self._check_injected("cross_attention", cross_attention)
        self.self_attention = self_attention
        self.cross_attention = cross_attention

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        hidden_dim = decoder_sequence_shape[-1]
        self.self_attention_norm = self._make_norm("self_attention_norm", decoder_sequence_shape)
        self.self_attention_layer = self.self_attention or self._make_attention(
            "self_attention", hidden_dim, self.position
        )
        if not self.self_attention_layer.built:
            self.self_attention_layer.build(decoder_sequence_shape, decoder_sequence_shape)
        self.cross_attention_layer = None
        if encoder_sequence_shape is not None or self.cross_attention is not None:
            self.cross_attention_norm = self._make_norm("cross_attention_norm", decoder_sequence_shape)
            self.cross_attention_layer = self.cross_attention or self._make_attention(
                "cross_attention", hidden_dim, None
            )
            if not self.cross_attention_layer.built:
                self.cross_attention_layer.build(
                    decoder_sequence_shape, encoder_sequence_shape or decoder_sequence_shape
                )
        self._build_feed_forward(decoder_sequence_shape)
        self.built = True

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        decoder_attention_mask=None,
        encoder_padding_mask=None,
        encoder_attention_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        self_attention_window=None,
        cross_attention_cache=None,
        use_causal_mask=True,
        training=None,
    ):
        has_source = encoder_sequence is not None or cross_attention_cache is not None
        if has_source and self.cross_attention_layer is None:
            raise ValueError(
                "This block was built without cross-attention, so it cannot take "
                "`encoder_sequence` or `cross_attention_cache`. Build it with an encoder "
                "sequence shape or pass `cross_attention=`."
            )
        if self.cross_attention_layer is not None and not has_source:
            raise ValueError(
                "This block has a cross-attention sublayer and needs `encoder_sequence` "
                "(or `cross_attention_cache`). Received: encoder_sequence=None"
            )
        # Each mask named as passed; with a cache the keys are the cache's positions.
        batch, length = (static_dim(dim) for dim in tuple(decoder_sequence.shape)[:2])
        keys = ("keys", length if self_attention_cache is None else None)
        source = ("source", None if encoder_sequence is None else static_dim(tuple(encoder_sequence.shape)[1]))
        batch, length = ("batch", batch), ("length", length)
        check_mask("decoder_padding_mask", decoder_padding_mask, (batch, keys))
        check_mask("decoder_attention_mask", decoder_attention_mask, (batch, length, keys), broadcast=True)
        check_mask("encoder_padding_mask", encoder_padding_mask, (batch, source))
        check_mask("encoder_attention_mask", encoder_attention_mask, (batch, length, source), broadcast=True)
        if decoder_padding_mask is None and self_attention_cache is None:
            decoder_padding_mask = mask_ops.keras_mask(decoder_sequence)
        if encoder_padding_mask is None and encoder_sequence is not None:
            encoder_padding_mask = mask_ops.keras_mask(encoder_sequence)

        # Self-attention. With a cache the keys are the whole cache: a padding
        # mask covers the cache positions, not the new queries.
        h = self._branch_input(self.self_attention_norm, decoder_sequence)
        attention_options = dict(
            attention_mask=decoder_attention_mask, use_causal_mask=use_causal_mask, training=training
        )
        if self_attention_window is not None:
            attention_options["window"] = self_attention_window
        if self_attention_cache is None:
            y = self.self_attention_layer(
                h, h, query_mask=decoder_padding_mask, value_mask=decoder_padding_mask, **attention_options
            )
        else:
            y, cache = self.self_attention_layer(
                h,
                h,
                value_mask=decoder_padding_mask,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
                **attention_options,
            )
        x = self._add_branch(self.self_attention_norm, decoder_sequence, y, training)

        if self.cross_attention_layer is not None:
            h = self._branch_input(self.cross_attention_norm, x)
            cross_options = dict(
                value_mask=encoder_padding_mask, attention_mask=encoder_attention_mask, training=training
            )
            if cross_attention_cache is not None:
                y, _ = self.cross_attention_layer(h, cache=cross_attention_cache, **cross_options)
            else:
                y = self.cross_attention_layer(h, encoder_sequence, **cross_options)
            x = self._add_branch(self.cross_attention_norm, x, y, training)

        x = self._feed_forward_branch(x, training)
        if self_attention_cache is not None:
            return x, cache
        return x

    def compute_output_spec(self, decoder_sequence, *args, **kwargs):
        """`(B, T, D)` like `decoder_sequence`, without tracing `call` (a model of many blocks builds in a
        fraction of the time); with a self-attention cache (keyword or 7th argument), traced: it returns the
        new cache too."""
        if kwargs.get("self_attention_cache") is not None or (len(args) > 5 and args[5] is not None):
            return super().compute_output_spec(decoder_sequence, *args, **kwargs)
        return keras.KerasTensor(decoder_sequence.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            self_attention=keras.saving.serialize_keras_object(self.self_attention),
            cross_attention=keras.saving.serialize_keras_object(self.cross_attention),
        )
        return config
