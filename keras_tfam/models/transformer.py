"""The encoder-decoder Transformer (Vaswani et al. 2017) with greedy and beam-search decoding."""

import math

import keras
import numpy as np
from keras import ops

from keras_tfam.layers.blocks.transformer_decoder_block import TransformerDecoderBlock
from keras_tfam.layers.blocks.transformer_encoder_block import TransformerEncoderBlock
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.normalization.get_norm import get_norm
from keras_tfam.layers.position.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_tfam.utils import base_model_config, check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class Transformer(keras.Model):
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

    Example:

    >>> model = Transformer(vocabulary_size=1000, num_layers=2, num_heads=4, hidden_dim=128)
    >>> logits = model({"source": source_ids, "target": target_ids})
    >>> model.generate(source_ids, start_token_id=1, stop_token_id=2, max_length=20, beam_size=4)
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
            ("vocabulary_size", vocabulary_size), ("num_layers", num_layers),
            ("num_heads", num_heads), ("hidden_dim", hidden_dim),
        ):
            check_positive_int(name, value)
        intermediate_dim = intermediate_dim or 4 * hidden_dim
        shared = target_vocabulary_size is None or target_vocabulary_size == vocabulary_size
        self.source_embedding = TiedEmbedding(
            vocabulary_size, hidden_dim, embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            dtype=dtype, name="source_embedding",
        )
        self.target_embedding = self.source_embedding if shared else TiedEmbedding(
            target_vocabulary_size, hidden_dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            dtype=dtype, name="target_embedding",
        )
        self.position_encoding = SinusoidalPositionEncoding(dtype=dtype, name="position_encoding")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        options = dict(
            dropout=dropout, attention_dropout=dropout, activation=activation, norm=norm,
            norm_position=norm_position, dtype=dtype,
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
        self._step_functions = {}

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

    # ------------------------------------------------------------------ decoding

    def encode(self, source):
        """Encoder outputs and the per-layer cross-attention caches, computed once per source."""
        memory = self._encode(source)
        caches = [block.cross_attention_layer.compute_key_value_cache(memory) for block in self.decoder_blocks]
        return memory, caches

    def decode_step(self, token, index, self_caches, cross_caches, source_padding):
        """Logits `(B, V)` of the token after `token (B, 1)` at position `index`, and the caches."""
        x = self._embed(self.target_embedding, token, start_index=index)
        updated = []
        for block, cache, cross in zip(self.decoder_blocks, self_caches, cross_caches):
            x, cache = block(
                x,
                cross_attention_cache=cross,
                encoder_padding_mask=source_padding,
                self_attention_cache=cache,
                self_attention_cache_update_index=index,
            )
            updated.append(cache)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.target_embedding(x[:, -1], reverse=True), updated

    def _step_function(self):
        import tensorflow as tf

        if "step" not in self._step_functions:
            self._step_functions["step"] = tf.function(self.decode_step, jit_compile=False, reduce_retracing=True)
        return self._step_functions["step"]

    def generate(self, source, start_token_id, stop_token_id, max_length, beam_size=1, length_penalty=0.6):
        """Decodes each source into target ids `(B, max_length)` (after the start token).

        Greedy when `beam_size == 1`, else beam search over `beam_size`
        hypotheses with the GNMT length penalty `((5 + len) / 6) ** alpha`
        (Wu et al. 2016; `alpha = length_penalty`). The cross-attention keys and
        values are computed once per source; the decoder runs one token per
        step over a KV cache. Rows end at `stop_token_id` (kept) and are
        padded with `pad_token_id` after it.
        """
        source = np.asarray(source, np.int32)
        if source.ndim != 2 or source.shape[1] == 0:
            raise ValueError(f"`source` must be a non-empty (batch, length) array. Received shape {source.shape}")
        check_positive_int("beam_size", beam_size)
        check_positive_int("max_length", max_length)
        batch = source.shape[0]
        _, cross = self.encode(source)
        source_padding = source != self.pad_token_id
        block = self.decoder_blocks[0].self_attention_layer
        if beam_size > 1:
            cross = [ops.repeat(c, beam_size, axis=0) for c in cross]
            source_padding = np.repeat(source_padding, beam_size, axis=0)
        rows = batch * beam_size
        caches = [block.init_cache(rows, max_length, self.decoder_blocks[0].compute_dtype) for _ in self.decoder_blocks]
        step = self._step_function()
        tokens = np.full((rows, max_length + 1), self.pad_token_id, np.int32)
        tokens[:, 0] = start_token_id
        scores = np.zeros((batch, beam_size), np.float64)
        scores[:, 1:] = -np.inf  # all beams start as the same hypothesis
        finished = np.zeros(rows, bool)
        lengths = np.zeros(rows, np.int32)
        for t in range(max_length):
            logits, caches = step(tokens[:, t : t + 1], t, caches, cross, source_padding)
            log_probs = np.asarray(keras.ops.log_softmax(logits, axis=-1), np.float64)
            if beam_size == 1:
                choice = np.argmax(log_probs, axis=-1).astype(np.int32)
                tokens[:, t + 1] = np.where(finished, self.pad_token_id, choice)
                lengths += ~finished
                finished |= choice == stop_token_id
            else:
                vocabulary = log_probs.shape[-1]
                # A finished hypothesis only extends with padding, at no cost.
                log_probs[finished] = -np.inf
                log_probs[finished, self.pad_token_id] = 0.0
                candidates = (scores.reshape(rows, 1) + log_probs).reshape(batch, beam_size * vocabulary)
                new_lengths = (lengths + ~finished).reshape(batch, beam_size)
                penalty = ((5.0 + np.repeat(new_lengths, vocabulary, axis=1)) / 6.0) ** length_penalty
                best = np.argsort(-(candidates / penalty), axis=-1, kind="stable")[:, :beam_size]
                beam = best // vocabulary
                origin = (np.arange(batch)[:, None] * beam_size + beam).reshape(-1)
                scores = np.take_along_axis(candidates, best, axis=-1)
                tokens = tokens[origin]
                tokens[:, t + 1] = (best % vocabulary).reshape(-1)
                lengths = lengths[origin] + ~finished[origin]
                finished = finished[origin] | (tokens[:, t + 1] == stop_token_id)
                caches = [ops.take(c, origin, axis=0) for c in caches]
            if finished.all():
                break
        if beam_size > 1:
            penalised = scores / (((5.0 + lengths.reshape(batch, beam_size)) / 6.0) ** length_penalty)
            top = np.argmax(penalised, axis=-1)
            tokens = tokens.reshape(batch, beam_size, -1)[np.arange(batch), top]
        return tokens[:, 1:]

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
