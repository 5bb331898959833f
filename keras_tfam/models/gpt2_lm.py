"""GPT-2-style decoder language model (Radford et al. 2019) as a Keras functional model."""

import math

import keras
import numpy as np
from keras import ops

from keras_tfam.layers.attention.linear_attention import LinearAttention
from keras_tfam.layers.blocks.transformer_decoder_block import TransformerDecoderBlock
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.normalization.get_norm import check_norm, get_norm
from keras_tfam.layers.position.alibi_bias import ALiBiBias
from keras_tfam.layers.position.position_embedding import PositionEmbedding
from keras_tfam.layers.position.rotary_embedding import RotaryEmbedding
from keras_tfam.models.gpt2_presets import GPT2_PRESETS
from keras_tfam.utils import base_model_config, check_positive_int, head_size

POSITIONS = ("learned", "rotary", "alibi", "none")
ATTENTIONS = ("softmax", "linear")


def _attention_position(position, num_heads):
    """The position scheme applied inside attention, if any."""
    if position == "rotary":
        return RotaryEmbedding()
    if position == "alibi":
        return ALiBiBias(num_heads)
    return None


def _cache_segments(prefill_length, buffer_length, shortest=256):
    """Where the decoding loop grows the caches: `[half the buffer]` or `[]`.

    Attention over a cache reads all of it, so without segments a step early
    in a long buffer costs as much as the last one. Starting with a cache of
    half the buffer and growing it once saves 8-15% of the decoding time at
    256-512 positions; each segment is one more compiled loop body (~1 s of
    compilation here), so finer segments (64, 128, 256, ...: ~1% more saved,
    +2-3 s of compilation) do not pay. Nothing to segment for short buffers, a
    prompt that fills the first half, or lengths that are not static (as in
    an exported SavedModel).
    """
    if not isinstance(prefill_length, int) or buffer_length is None or buffer_length < shortest:
        return []
    half = -(-buffer_length // 2)
    return [half] if half > prefill_length + 1 else []


@keras.saving.register_keras_serializable(package="keras_tfam")
class GPT2LM(keras.Model):
    """A GPT-2 decoder LM: `token_ids (B, T)` -> float32 next-token logits `(B, T, V)`.

    Token embedding plus learned positions, dropout, `num_layers` pre-norm
    decoder blocks (tanh-approximate GELU, 4x feed-forward), a final norm,
    and logits `h @ E^T` through the token embedding itself (weight tying:
    one variable). Initialisation as GPT-2: normal(0.02) weights, output
    projections of each residual branch scaled by `1 / sqrt(2 * num_layers)`.

    The core library's options are one argument away: `position`
    (`"learned"`, `"rotary"`, `"alibi"`, `"none"`), `norm` (`"layer"`,
    `"rms"`, `"scale"`), `activation` (`"gelu_tanh"`, `"swiglu"`, ...),
    `num_key_value_heads` (grouped-query attention). The same code path
    trains, generates and exports every variant.

    Args:
        vocabulary_size: number of token ids `V`.
        num_layers: decoder blocks.
        num_heads: attention heads.
        hidden_dim: model width `D`.
        intermediate_dim: feed-forward width; default `4 * hidden_dim`.
        max_sequence_length: positions of the learned position table (and
            the longest prompt + generation with learned positions).
        position: position scheme.
        norm: norm of the blocks and the final norm.
        activation: feed-forward activation.
        num_key_value_heads: key/value heads; default `num_heads`.
        attention: `"softmax"` or `"linear"` (`LinearAttention`: O(1) per
            generated token, the cache is its recurrent state).
        feature_map: linear attention's feature map, `"elu"` or `"exp"`.
        dropout: dropout on embeddings, residual branches and attention
            weights (GPT-2: 0.1).
        norm_epsilon: epsilon of the norms (GPT-2: 1e-5).
        use_bias: biases in the dense layers.
        dtype: dtype policy of every layer (e.g. `"mixed_bfloat16"`); the
            logits are float32 regardless.

    Example:

    >>> model = GPT2LM.from_preset("gpt2_tiny", vocabulary_size=8192)
    >>> model.compile("adamw", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> model.fit(token_ids, next_token_ids)
    >>> model.generate([[464, 3290]], max_new_tokens=20, sampler="top_p")
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim=None,
        max_sequence_length=1024,
        position="learned",
        norm="layer",
        activation="gelu_tanh",
        num_key_value_heads=None,
        dropout=0.0,
        norm_epsilon=1e-5,
        use_bias=True,
        attention="softmax",
        feature_map="elu",
        dtype=None,
        **kwargs,
    ):
        for name, value in (
            ("vocabulary_size", vocabulary_size),
            ("num_layers", num_layers),
            ("num_heads", num_heads),
            ("hidden_dim", hidden_dim),
            ("max_sequence_length", max_sequence_length),
        ):
            check_positive_int(name, value)
        head_size("hidden_dim", hidden_dim, num_heads)
        if position not in POSITIONS:
            raise ValueError(f"`position` must be one of {POSITIONS}. Received: position={position!r}")
        check_norm(norm)
        if attention not in ATTENTIONS:
            raise ValueError(f"`attention` must be one of {ATTENTIONS}. Received: attention={attention!r}")
        intermediate_dim = intermediate_dim or 4 * hidden_dim
        initializer = keras.initializers.RandomNormal(stddev=0.02)
        residual_initializer = keras.initializers.RandomNormal(stddev=0.02 / math.sqrt(2 * num_layers))

        # === Layers ===
        self.token_embedding = TiedEmbedding(
            vocabulary_size, hidden_dim, embeddings_initializer=initializer, dtype=dtype, name="token_embedding"
        )
        self.position_embedding = None
        if position == "learned":
            self.position_embedding = PositionEmbedding(
                max_sequence_length,
                initializer=keras.initializers.RandomNormal(stddev=0.01),
                dtype=dtype,
                name="position_embedding",
            )
        self.embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        def self_attention(i):
            if attention == "softmax":
                return None
            return LinearAttention(
                num_heads,
                hidden_dim // num_heads,
                feature_map=feature_map,
                num_key_value_heads=num_key_value_heads,
                use_bias=use_bias,
                position=_attention_position(position, num_heads),
                kernel_initializer=initializer,
                output_kernel_initializer=residual_initializer,
                dtype=dtype,
                name=f"linear_attention_{i}",
            )

        self.transformer_blocks = [
            TransformerDecoderBlock(
                num_heads,
                intermediate_dim,
                num_key_value_heads=num_key_value_heads,
                dropout=dropout,
                attention_dropout=dropout,
                activation=activation,
                norm=norm,
                norm_position="pre",
                norm_epsilon=norm_epsilon,
                use_bias=use_bias,
                position=_attention_position(position, num_heads) if attention == "softmax" else None,
                self_attention=self_attention(i),
                kernel_initializer=initializer,
                output_kernel_initializer=residual_initializer,
                dtype=dtype,
                name=f"transformer_block_{i}",
            )
            for i in range(num_layers)
        ]
        self.final_norm = get_norm(norm, norm_epsilon, dtype=dtype, name="final_norm")

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        hidden = self._embed(token_ids, 0)
        for block in self.transformer_blocks:
            hidden = block(hidden)
        logits = self.token_embedding(self.final_norm(hidden), reverse=True)
        super().__init__(inputs=token_ids, outputs=logits, dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.max_sequence_length = max_sequence_length
        self.position = position
        self.norm = norm
        self.activation = activation
        self.num_key_value_heads = num_key_value_heads or num_heads
        self.dropout = dropout
        self.norm_epsilon = norm_epsilon
        self.use_bias = use_bias
        self.attention = attention
        self.feature_map = feature_map
        self._generate_functions = {}

    def _embed(self, token_ids, start_index, training=None):
        x = self.token_embedding(token_ids)
        if self.position_embedding is not None:
            x = x + self.position_embedding(x, start_index=start_index)
        return self.embeddings_dropout(x, training=training)

    @property
    def head_dim(self):
        return self.hidden_dim // self.num_heads

    def init_cache(self, batch_size, max_length):
        """Empty caches, one per block: `(B, 2, max_length, K, H)` keys/values, or the
        recurrent state of linear attention."""
        return tuple(
            block.self_attention_layer.init_cache(batch_size, max_length, block.compute_dtype)
            for block in self.transformer_blocks
        )

    def resize_cache(self, caches, max_length):
        """The caches of `init_cache` grown to `max_length` positions."""
        return tuple(
            block.self_attention_layer.resize_cache(cache, max_length)
            for block, cache in zip(self.transformer_blocks, caches)
        )

    def call_with_cache(self, token_ids, caches, cache_update_index):
        """Runs `token_ids (B, T)` at positions `cache_update_index ..`.

        Returns the final hidden states `(B, T, D)` and the updated caches.
        """
        hidden = self._embed(token_ids, cache_update_index, training=False)
        updated = []
        for block, cache in zip(self.transformer_blocks, caches):
            hidden, cache = block(
                hidden, self_attention_cache=cache, self_attention_cache_update_index=cache_update_index
            )
            updated.append(cache)
        return self.final_norm(hidden), tuple(updated)

    def logits(self, hidden):
        """Float32 vocabulary logits of hidden states, through the tied embedding."""
        return self.token_embedding(hidden, reverse=True)

    # ------------------------------------------------------------------ generation

    def generate_graph(self, tokens, prompt_lengths, max_new_tokens, seed, stop_token_ids, sampler, prefill_length, pad_token_id=0):
        """The whole generation as graph ops (what `generate` compiles and export embeds).

        Args:
            tokens: `(B, L)` int32 buffer, prompts right-padded with `pad_token_id`.
            prompt_lengths: `(B,)` int32.
            max_new_tokens: scalar int32.
            seed: `(2,)` int32.
            stop_token_ids: `(S,)` int32.
            sampler: a `keras_tfam.generation.Sampler`.
            prefill_length: how many leading positions to run in one pass
                before the loop: at most `min(prompt_lengths) - 1` (positions the
                loop recomputes are simply rewritten).
        """
        import tensorflow as tf

        from keras_tfam.generation.decoding import decode

        batch_size, buffer_length = tf.shape(tokens)[0], tf.shape(tokens)[1]
        segment_ends = _cache_segments(prefill_length, tokens.shape[1])
        caches = self.init_cache(batch_size, segment_ends[0] if segment_ends else buffer_length)
        if not isinstance(prefill_length, int) or prefill_length > 0:
            _, caches = self.call_with_cache(tokens[:, :prefill_length], caches, 0)

        # The tied head, transposed once per call rather than inside every step.
        embedding = self.token_embedding
        head = ops.transpose(ops.cast(embedding.embeddings, embedding.compute_dtype))  # [D, V]

        def step(token, caches, index):
            hidden, caches = self.call_with_cache(token, caches, index)
            logits = ops.matmul(ops.cast(hidden[:, -1], head.dtype), head)
            return ops.cast(logits, embedding.logits_dtype), caches

        return decode(
            step, tokens, prompt_lengths, caches, max_new_tokens, sampler, seed, stop_token_ids, pad_token_id,
            segment_ends=segment_ends, resize_state=self.resize_cache,
        )

    def _generate_function(self, sampler, prefill_length, jit_compile, pad_token_id):
        import tensorflow as tf

        key = (sampler.cache_key(), prefill_length, jit_compile, pad_token_id)
        if key not in self._generate_functions:

            def generate_fn(tokens, prompt_lengths, max_new_tokens, seed, stop_token_ids):
                return self.generate_graph(
                    tokens,
                    prompt_lengths,
                    max_new_tokens,
                    seed,
                    stop_token_ids,
                    sampler,
                    prefill_length,
                    pad_token_id,
                )

            self._generate_functions[key] = (sampler, tf.function(generate_fn, jit_compile=jit_compile))
        return self._generate_functions[key][1]

    def _prepare_prompts(self, token_ids, max_new_tokens, pad_token_id):
        if isinstance(token_ids, (list, tuple)) and token_ids and np.isscalar(token_ids[0]):
            token_ids = [token_ids]
        if hasattr(token_ids, "numpy") and not isinstance(token_ids, np.ndarray):
            token_ids = token_ids.numpy()
        if isinstance(token_ids, np.ndarray):
            if token_ids.ndim == 1:
                token_ids = token_ids[None]
            if token_ids.ndim != 2:
                raise ValueError(
                    f"`token_ids` must be (batch, length) or a list of prompts. Received: shape={token_ids.shape}"
                )
            rows = list(token_ids)
        else:
            rows = list(token_ids)
        rows = [np.asarray(row).reshape(-1) for row in rows]
        if not rows or any(len(row) == 0 for row in rows):
            raise ValueError("`token_ids` holds an empty prompt; every prompt needs at least one token.")
        for b, row in enumerate(rows):
            if not np.issubdtype(row.dtype, np.integer):
                raise ValueError(f"`token_ids` must be integers. Received dtype {row.dtype} in prompt {b}")
            bad = np.flatnonzero((row < 0) | (row >= self.vocabulary_size))
            if bad.size:
                raise ValueError(
                    f"Token id {int(row[bad[0]])} at prompt {b}, position {int(bad[0])} is outside "
                    f"[0, {self.vocabulary_size}) (vocabulary_size={self.vocabulary_size})"
                )
        if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` must be a positive integer. Received: max_new_tokens={max_new_tokens!r}")
        lengths = np.array([len(row) for row in rows], np.int32)
        width = int(lengths.max())
        total = width + int(max_new_tokens)
        if self.position == "learned" and total > self.max_sequence_length:
            raise ValueError(
                f"Prompt length {width} + max_new_tokens {max_new_tokens} = {total} exceeds the "
                f"model's {self.max_sequence_length} learned positions (max_sequence_length)."
            )
        buffer = np.full((len(rows), total), pad_token_id, np.int32)
        for b, row in enumerate(rows):
            buffer[b, : len(row)] = row
        return buffer, lengths, width

    def generate(
        self,
        token_ids,
        max_new_tokens,
        sampler="greedy",
        seed=None,
        stop_token_ids=None,
        pad_token_id=0,
        jit_compile=True,
    ):
        """Generates up to `max_new_tokens` tokens after each prompt.

        The prompt is prefilled in one pass, then one token per step is
        decoded in a compiled `while_loop` over a preallocated static KV cache;
        the compiled function is reused across calls with the same shapes.

        Args:
            token_ids: a `(B, T)` int array, a list of prompts of different
                lengths, or one prompt.
            max_new_tokens: new tokens per prompt.
            sampler: `"greedy"`, `"random"`, `"top_k"`, `"top_p"`, a
                `keras_tfam.generation.Sampler` or a keras-hub sampler.
            seed: int seed of the sampling (same seed, same tokens).
            stop_token_ids: ids that end a row (kept, then padding).
            pad_token_id: fills a row after it stops.
            jit_compile: compile the loop with XLA.

        Returns:
            `(B, T + max_new_tokens)` int32 NumPy array: each prompt, then its
            new tokens, then padding (a shorter prompt's row is padded at the
            end).
        """
        from keras_tfam.generation.samplers import get_sampler

        sampler = get_sampler(sampler)
        tokens, lengths, width = self._prepare_prompts(token_ids, max_new_tokens, pad_token_id)
        stop = np.asarray(list(stop_token_ids or []), np.int32).reshape(-1)
        if seed is None:
            seed = int(np.random.randint(0, 2**31 - 1))
        fn = self._generate_function(sampler, int(lengths.min()) - 1, jit_compile, int(pad_token_id))
        outputs = fn(tokens, lengths, np.int32(max_new_tokens), np.array([seed, 0], np.int32), stop)
        return np.asarray(outputs)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_preset(cls, name, **overrides):
        """A model from a preset name (`GPT2_PRESETS`), any field overridden."""
        if name not in GPT2_PRESETS:
            raise ValueError(f"Unknown preset. Expected one of {tuple(GPT2_PRESETS)}. Received: name={name!r}")
        return cls(**{**GPT2_PRESETS[name], **overrides})

    @classmethod
    def from_huggingface(cls, directory, **overrides):
        """Loads a Hugging Face GPT-2 directory (`config.json` + `model.safetensors`)."""
        from keras_tfam.convert.huggingface_gpt2 import load_huggingface_gpt2

        return load_huggingface_gpt2(directory, cls, **overrides)

    @classmethod
    def from_keras_hub(cls, backbone, **overrides):
        """Copies the weights of a `keras_hub.models.GPT2Backbone`."""
        from keras_tfam.convert.keras_hub_gpt2 import from_keras_hub_gpt2

        return from_keras_hub_gpt2(backbone, cls, **overrides)

    def get_config(self):
        return {
            **base_model_config(self),
            "vocabulary_size": self.vocabulary_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "hidden_dim": self.hidden_dim,
            "intermediate_dim": self.intermediate_dim,
            "max_sequence_length": self.max_sequence_length,
            "position": self.position,
            "norm": self.norm,
            "activation": self.activation,
            "num_key_value_heads": self.num_key_value_heads,
            "dropout": self.dropout,
            "norm_epsilon": self.norm_epsilon,
            "use_bias": self.use_bias,
            "attention": self.attention,
            "feature_map": self.feature_map,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
