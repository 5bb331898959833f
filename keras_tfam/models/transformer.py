"""The encoder-decoder Transformer (Vaswani et al. 2017) with greedy and beam-search decoding."""

import math

import keras
import numpy as np
from keras import ops

from keras_tfam.generation.generator import Generator
from keras_tfam.generation.protocol import DecodeStep, DecodingModel
from keras_tfam.layers.blocks.transformer_decoder_block import TransformerDecoderBlock
from keras_tfam.layers.blocks.transformer_encoder_block import TransformerEncoderBlock
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.normalization.get_norm import get_norm
from keras_tfam.layers.position.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_tfam.models.functional_model import FunctionalModel
from keras_tfam.models.token_ids import check_token_ids
from keras_tfam.utils import base_model_config, check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class Transformer(DecodingModel, FunctionalModel):
    """Encoder-decoder Transformer: `{"source": (B, S), "target": (B, T)}` -> logits `(B, T, V)`.

    As in "Attention Is All You Need": token embeddings scaled by
    `sqrt(d_model)` plus sinusoidal positions, dropout on the sums, post-norm
    encoder and decoder stacks (pre-norm one argument away, with a final norm
    per stack), and, when source and target share a vocabulary, one embedding
    matrix for both and for the output projection. Token id `pad_token_id`
    is padding in both inputs.

    Args:
        vocabulary_size: the shared vocabulary, or the source vocabulary when
            `target_vocabulary_size` is given.
        num_layers: blocks per stack (encoder and decoder).
        num_heads: attention heads.
        hidden_dim: `d_model`.
        intermediate_dim: feed-forward width (default `4 * hidden_dim`).
        target_vocabulary_size: a separate target vocabulary (then the
            embeddings are not shared).
        dropout: dropout rate (paper: 0.1).
        norm_position: `"post"` (paper) or `"pre"`.
        norm: `"layer"`, `"rms"` or `"scale"`.
        activation: feed-forward activation (paper: `"relu"`).
        pad_token_id: the padding id.

    Examples:
        >>> model = Transformer(vocabulary_size=1000, num_layers=2, num_heads=4, hidden_dim=32)
        >>> source_ids, target_ids = np.random.randint(3, 1000, size=(2, 4, 12))
        >>> model({"source": source_ids, "target": target_ids}).shape
        (4, 12, 1000)
        >>> model.generate(source_ids, start_token_id=1, stop_token_id=2, max_length=20, beam_size=4).shape
        (4, 20)
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim=None,
        target_vocabulary_size=None,
        dropout=0.0,
        norm_position="post",
        norm="layer",
        activation="relu",
        pad_token_id=0,
        dtype=None,
        **kwargs,
    ):
        for name, value in (
            ("vocabulary_size", vocabulary_size),
            ("num_layers", num_layers),
            ("num_heads", num_heads),
            ("hidden_dim", hidden_dim),
        ):
            check_positive_int(name, value)
        intermediate_dim = intermediate_dim or 4 * hidden_dim
        shared = target_vocabulary_size is None or target_vocabulary_size == vocabulary_size
        self.source_embedding = TiedEmbedding(
            vocabulary_size,
            hidden_dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            dtype=dtype,
            name="source_embedding",
        )
        self.target_embedding = (
            self.source_embedding
            if shared
            else TiedEmbedding(
                target_vocabulary_size,
                hidden_dim,
                embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
                dtype=dtype,
                name="target_embedding",
            )
        )
        self.position_encoding = SinusoidalPositionEncoding(dtype=dtype, name="position_encoding")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        options = dict(
            dropout=dropout,
            attention_dropout=dropout,
            activation=activation,
            norm=norm,
            norm_position=norm_position,
            dtype=dtype,
        )
        self.encoder_blocks = [
            TransformerEncoderBlock(num_heads, intermediate_dim, name=f"encoder_block_{i}", **options)
            for i in range(num_layers)
        ]
        self.decoder_blocks = [
            TransformerDecoderBlock(num_heads, intermediate_dim, name=f"decoder_block_{i}", **options)
            for i in range(num_layers)
        ]
        # Pre-norm stacks end in a norm (post-norm blocks already end in one).
        self.encoder_norm = get_norm(norm, 1e-5, dtype=dtype, name="encoder_norm") if norm_position == "pre" else None
        self.decoder_norm = get_norm(norm, 1e-5, dtype=dtype, name="decoder_norm") if norm_position == "pre" else None

        source = keras.Input((None,), dtype="int32", name="source")
        target = keras.Input((None,), dtype="int32", name="target")
        self.hidden_dim = hidden_dim
        self.pad_token_id = pad_token_id
        memory = self._encode(source)
        hidden = self._decode_full(target, memory, ops.not_equal(source, pad_token_id))
        logits = self.target_embedding(hidden, reverse=True)
        super().__init__(inputs={"source": source, "target": target}, outputs=logits, dtype=dtype, **kwargs)

        self.vocabulary_size = vocabulary_size
        self.target_vocabulary_size = target_vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.norm_position = norm_position
        self.norm = norm
        self.activation = activation

    def call(self, inputs, training=None, mask=None):
        for name in ("source", "target"):
            if isinstance(inputs, dict) and name in inputs:
                check_token_ids(inputs[name], name)
        return super().call(inputs, training=training, mask=mask)

    def _embed(self, embedding, ids, start_index=0, training=None):
        x = embedding(ids) * math.sqrt(self.hidden_dim)
        x = x + self.position_encoding(x, start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def _encode(self, source, training=None):
        padding = ops.not_equal(source, self.pad_token_id)
        x = self._embed(self.source_embedding, source, training=training)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=padding, training=training)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def _decode_full(self, target, memory, source_padding, training=None):
        x = self._embed(self.target_embedding, target, training=training)
        target_padding = ops.not_equal(target, self.pad_token_id)
        for block in self.decoder_blocks:
            x = block(
                x, memory, decoder_padding_mask=target_padding, encoder_padding_mask=source_padding, training=training
            )
        return self.decoder_norm(x) if self.decoder_norm is not None else x

    # ------------------------------------------------------------------ generation protocol

    @property
    def output_vocabulary_size(self):
        """The vocabulary of the generated (target) ids."""
        return self.target_vocabulary_size or self.vocabulary_size

    # Sinusoidal positions set no limit on the target length; they are
    # absolute, so a window would be re-encoded, not kept in ring caches.
    max_length = None
    sliding_window_cache = False
    returns_hidden_states = True

    def init_cache(self, batch_size, length, window=None, source=None):
        """The decoder's caches for `source (B, S)`: empty self-attention caches, and the
        cross-attention keys/values of the encoded source, computed once."""
        if source is None:
            raise ValueError("The Transformer's caches need the `source` ids. Received: source=None")
        memory = self._encode(source)
        return {
            "self": tuple(
                block.self_attention_layer.init_cache(batch_size, length, block.compute_dtype, window=window)
                for block in self.decoder_blocks
            ),
            "cross": tuple(
                block.cross_attention_layer.compute_key_value_cache(memory) for block in self.decoder_blocks
            ),
            "source_padding": ops.not_equal(source, self.pad_token_id),
        }

    def resize_cache(self, cache, length):
        grown = tuple(
            block.self_attention_layer.resize_cache(layer_cache, length)
            for block, layer_cache in zip(self.decoder_blocks, cache["self"])
        )
        return {**cache, "self": grown}

    def call_with_cache(self, token_ids, cache, index, window=None):
        """A `DecodeStep`: target logits `(B, T, V)` of `token_ids (B, T)` at positions `index ..`, the caches,
        and the decoder's final hidden states."""
        x = self._embed(self.target_embedding, token_ids, start_index=index)
        updated = []
        for block, layer_cache, cross in zip(self.decoder_blocks, cache["self"], cache["cross"]):
            x, layer_cache = block(
                x,
                cross_attention_cache=cross,
                encoder_padding_mask=cache["source_padding"],
                self_attention_cache=layer_cache,
                self_attention_cache_update_index=index,
                self_attention_window=window,
            )
            updated.append(layer_cache)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return DecodeStep(self.target_embedding(x, reverse=True), {**cache, "self": tuple(updated)}, x)

    def generate(
        self,
        source,
        start_token_id,
        stop_token_id,
        max_length,
        beam_size=1,
        length_penalty=0.6,
        sampler="greedy",
        seed=None,
        jit_compile=True,
    ):
        """Decodes each source into target ids `(B, max_length)` (after the start token).

        Greedy (or another `sampler`) when `beam_size == 1`, else beam search
        over `beam_size` hypotheses with the GNMT length penalty
        `((5 + len) / 6) ** alpha` (Wu et al. 2016; `alpha = length_penalty`),
        inside the compiled loop of `keras_tfam.generation`. The source is
        encoded and its cross-attention keys/values computed once; the
        decoder runs one token per step over a KV cache. Rows end at
        `stop_token_id` (kept) and are padded with `pad_token_id` after it.
        """
        source = np.asarray(source)
        if source.ndim != 2 or 0 in source.shape:
            raise ValueError(
                f"`source` must be a non-empty (batch, length) array of ids. Received: source.shape={source.shape}"
            )
        if not np.issubdtype(source.dtype, np.integer):
            raise ValueError(f"`source` must hold integer token ids. Received: source.dtype={source.dtype}")
        bad = (source < 0) | (source >= self.vocabulary_size)
        if bad.any():
            row, position = np.argwhere(bad)[0]
            raise ValueError(
                f"Source ids must be in [0, {self.vocabulary_size}). Received: id {int(source[row, position])} "
                f"at row {row}, position {position}"
            )
        check_positive_int("max_length", max_length)
        prompts = np.full((source.shape[0], 1), start_token_id, np.int64)
        generated = Generator.for_model(self).generate(
            prompts,
            max_length,
            sampler=sampler,
            beam_size=beam_size,
            length_penalty=length_penalty if beam_size > 1 else 0.0,
            seed=seed,
            stop_token_ids=[stop_token_id],
            pad_token_id=self.pad_token_id,
            jit_compile=jit_compile,
            cache_inputs={"source": source.astype(np.int32)},
        )
        return generated[:, 1:]

    def get_config(self):
        return {
            **base_model_config(self),
            "vocabulary_size": self.vocabulary_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "hidden_dim": self.hidden_dim,
            "intermediate_dim": self.intermediate_dim,
            "target_vocabulary_size": self.target_vocabulary_size,
            "dropout": self.dropout,
            "norm_position": self.norm_position,
            "norm": self.norm,
            "activation": self.activation,
            "pad_token_id": self.pad_token_id,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
