"""Transformer-XL language model (Dai et al. 2019), with the Compressive Transformer, adaptive spans and GTrXL."""

import math
import os

import keras
from keras import ops

from keras_tfam.generation.generator import GenerationMixin
from keras_tfam.generation.protocol import DecodeStep
from keras_tfam.layers.blocks.feed_forward import ACTIVATIONS
from keras_tfam.layers.blocks.transformer_xl_block import RESIDUALS, TransformerXLBlock
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.memory.compressive_memory import COMPRESSIONS, CompressiveMemory
from keras_tfam.layers.normalization.get_norm import NORMS, get_norm
from keras_tfam.layers.position.adaptive_span import AdaptiveSpan
from keras_tfam.layers.position.composed_position import ComposedPosition
from keras_tfam.layers.position.transformer_xl_position import TransformerXLPosition
from keras_tfam.models.model_mixin import ModelMixin
from keras_tfam.models.option import Option, check_options, option_config
from keras_tfam.models.preset_directory import load_preset, names_directory
from keras_tfam.models.transformer_xl_presets import TRANSFORMER_XL_PRESETS
from keras_tfam.utils import base_model_config, check_positive_int, head_size


@keras.saving.register_keras_serializable(package="keras_tfam")
class TransformerXLLM(GenerationMixin, ModelMixin, keras.Model):
    """A decoder LM that reads text segment by segment, each layer attending to a memory of the last.

    Transformer-XL (Dai et al. 2019): token embeddings (no absolute
    positions), `num_layers` `TransformerXLBlock`s with relative positions
    (`u`, `v`, sinusoidal `R`, the relative shift), a final norm, logits
    through the tied embedding. Layer `n` attends to the `memory_length`
    states it read for the preceding text (gradient stopped) and to the
    segment, so the context grows with depth, and no text is re-encoded.
    Options add the Compressive Transformer (Rae et al. 2020:
    `compressed_memory_length`, `compression_rate`, `compression`, trained by
    the attention-reconstruction loss), adaptive spans (Sukhbaatar et al.
    2019: `max_span`, `span_ramp`, `span_penalty`) and GTrXL gating
    (Parisotto et al. 2020: `residual="gru"`).

    Training (`fit`) reads a stateful stream: row `b` of batch `n + 1`
    continues row `b` of batch `n` (`stateful_stream = True` tells the
    pipeline so). During training the memory lives in non-trainable
    variables, for the batch size the model is built with, and each call
    continues from it and replaces it (as a stateful RNN); `reset_memory()`
    empties it. Outside training a call is one segment without memory.
    With memory, and for generation, `call_with_cache(token_ids, cache)`
    continues from the memory in `cache` and returns the next one:
    `init_cache` gives an empty one, and `generate` decodes one token per
    step with it (a segment of one token after the memory, as the paper's
    evaluation with segments of 1), in O(memory) per token.

    Args:
        vocabulary_size: number of token ids.
        num_layers: blocks.
        num_heads: attention heads.
        hidden_dim: model width `D`.
        intermediate_dim: feed-forward width; default `4 * hidden_dim`.
        memory_length: states each layer keeps, `M` (0: no memory).
        context_length: the segment length trained on (`tfam train`
            records its sequence length); informative, not a limit.
        compressed_memory_length: compressed slots per layer (0: none).
        compression_rate: states per compressed slot, `c`.
        compression: `"conv"`, `"mean"` or `"max"`.
        reconstruction_weight: weight of the attention-reconstruction loss.
        max_span: adaptive attention spans up to this many tokens, or `None`.
        span_ramp: the spans' ramp `R`.
        span_penalty: L1 penalty on the spans.
        residual: `"add"`, or `"gru"` for GTrXL's gates.
        gate_bias: the gates' `b_g`.
        norm, norm_epsilon: the blocks' and the final norm.
        activation: feed-forward activation.
        dropout: on the embeddings, the residual branches and the attention
            weights.
        use_bias: biases in the dense layers.
        dtype: dtype policy; the logits are float32 regardless.

    Examples:
        >>> model = TransformerXLLM(1000, num_layers=2, num_heads=2, hidden_dim=32, memory_length=16)
        >>> model.compile("adamw", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> text = np.random.randint(0, 1000, size=(4, 65))  # 4 streams, one row each
        >>> # Consecutive batches are consecutive segments of each row's text: no shuffling.
        >>> history = model.fit(text[:, :-1], text[:, 1:], batch_size=4, shuffle=False, epochs=1, verbose=0)
        >>> model.generate([[464, 329]], max_new_tokens=20).shape
        (1, 22)
    """

    # The pipeline reads this: consecutive batches must be consecutive text.
    stateful_stream = True
    serves_token_ids = True

    # The constructor arguments a training config may set: what the constructor checks, `get_config`
    # lists, presets take and `tfam train` offers as flags.
    OPTIONS = {
        "num_layers": Option(int),
        "num_heads": Option(int),
        "hidden_dim": Option(int),
        "intermediate_dim": Option(int, optional=True),
        "memory_length": Option(int, zero="no memory"),
        "context_length": Option(int, optional=True),
        "compressed_memory_length": Option(int, zero="no compressed memory"),
        "compression_rate": Option(int),
        "compression": Option(str, choices=COMPRESSIONS),
        "reconstruction_weight": Option(float, allowed=">= 0", condition=lambda weight: weight >= 0.0),
        "max_span": Option(int, optional=True),
        "span_ramp": Option(int),
        "span_penalty": Option(float, allowed=">= 0", condition=lambda penalty: penalty >= 0.0),
        "residual": Option(str, choices=RESIDUALS),
        "gate_bias": Option(float),
        "norm": Option(str, choices=NORMS),
        "activation": Option(str, choices=ACTIVATIONS),
        "dropout": Option(float, allowed="in [0, 1)", condition=lambda rate: 0.0 <= rate < 1.0),
        "norm_epsilon": Option(float, allowed="> 0", condition=lambda epsilon: epsilon > 0.0),
        "use_bias": Option(bool),
    }

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim=None,
        memory_length=128,
        context_length=None,
        compressed_memory_length=0,
        compression_rate=1,
        compression="conv",
        reconstruction_weight=1.0,
        max_span=None,
        span_ramp=32,
        span_penalty=2e-6,
        residual="add",
        gate_bias=2.0,
        norm="layer",
        norm_epsilon=1e-5,
        activation="gelu_tanh",
        dropout=0.0,
        use_bias=True,
        dtype=None,
        **kwargs,
    ):
        vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        options = check_options(self.OPTIONS, locals())
        head_size("hidden_dim", options["hidden_dim"], options["num_heads"])
        super().__init__(dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        for name, value in options.items():
            setattr(self, name, value)
        self.intermediate_dim = self.intermediate_dim or 4 * self.hidden_dim
        initializer = keras.initializers.RandomNormal(stddev=0.02)
        residual_initializer = keras.initializers.RandomNormal(stddev=0.02 / math.sqrt(2 * self.num_layers))

        # === Layers ===
        self.token_embedding = TiedEmbedding(
            vocabulary_size, self.hidden_dim, embeddings_initializer=initializer, dtype=dtype, name="token_embedding"
        )
        self.embeddings_dropout = keras.layers.Dropout(self.dropout, dtype=dtype, name="embeddings_dropout")

        def position(i):
            scheme = TransformerXLPosition(
                self.num_heads, kernel_initializer=initializer, dtype=dtype, name=f"position_{i}"
            )
            if self.max_span is None:
                return scheme
            span = AdaptiveSpan(
                self.num_heads,
                self.max_span,
                ramp=self.span_ramp,
                span_penalty=self.span_penalty,
                dtype=dtype,
                name=f"span_{i}",
            )
            return ComposedPosition([scheme, span], dtype=dtype, name=f"positions_{i}")

        self.transformer_blocks = [
            TransformerXLBlock(
                self.num_heads,
                self.intermediate_dim,
                residual=self.residual,
                gate_bias=self.gate_bias,
                dropout=self.dropout,
                attention_dropout=self.dropout,
                activation=self.activation,
                norm=self.norm,
                norm_epsilon=self.norm_epsilon,
                use_bias=self.use_bias,
                position=position(i),
                kernel_initializer=initializer,
                output_kernel_initializer=residual_initializer,
                dtype=dtype,
                name=f"transformer_xl_block_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.memories = [
            CompressiveMemory(
                self.memory_length,
                self.compressed_memory_length,
                self.compression_rate,
                self.compression,
                kernel_initializer=initializer,
                dtype=dtype,
                name=f"memory_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.final_norm = get_norm(self.norm, self.norm_epsilon, dtype=dtype, name="final_norm")
        self.memory_variables = None
        # Every layer's weights now, whatever the batch (the generator compiles
        # with the weights of the moment); `build` adds the stream's memory.
        self._build_layers((None, None))

    # ------------------------------------------------------------------ building

    def _build_layers(self, token_ids_shape):
        hidden_shape = (token_ids_shape[0], token_ids_shape[1], self.hidden_dim)
        for layer, shape in [(self.token_embedding, token_ids_shape), (self.final_norm, hidden_shape)] + [
            (layer, hidden_shape) for pair in zip(self.transformer_blocks, self.memories) for layer in pair
        ]:
            if not layer.built:
                layer.build(shape)

    def build(self, token_ids_shape):
        batch = token_ids_shape[0]
        self._build_layers(token_ids_shape)
        if batch is not None and self.has_memory:
            # The memory of the stateful stream, for the batch size of the stream.
            self.memory_variables = []
            for i, name_to_value in enumerate(self._empty_memory(batch)):
                self.memory_variables.append(
                    {
                        name: self.add_weight(
                            name=f"memory_{i}_{name}",
                            shape=tuple(value.shape),
                            dtype=value.dtype,
                            initializer="zeros",
                            trainable=False,
                            autocast=False,
                        )
                        for name, value in name_to_value.items()
                    }
                )
        self.built = True
        # Rebuilt from a quantized config, each layer now keeps the one policy it was built with
        # (the functional models do this in their constructor; this model builds its layers here).
        self.resolve_dtype_policy_maps()

    @property
    def has_memory(self):
        return self.memory_length > 0

    def _empty_memory(self, batch_size):
        return tuple(memory.initial_state(batch_size, self.hidden_dim) for memory in self.memories)

    def reset_memory(self):
        """Empties the stream's memory (before a new stream, or between passes)."""
        for variables in self.memory_variables or ():
            for variable in variables.values():
                variable.assign(ops.zeros(variable.shape, variable.dtype))

    def memory_state(self):
        """The stream's memory: what `call_with_cache` takes as `cache` (a copy)."""
        if self.memory_variables is None:
            return None
        return tuple({name: ops.copy(v.value) for name, v in variables.items()} for variables in self.memory_variables)

    # ------------------------------------------------------------------ forward

    def _check_memory(self, cache, batch_size):
        if not isinstance(cache, (tuple, list)) or len(cache) != self.num_layers:
            raise ValueError(
                f"The memory must hold one state per layer ({self.num_layers}). Received: {type(cache).__name__} "
                f"of length {len(cache) if isinstance(cache, (tuple, list)) else 'n/a'}"
            )
        if self.has_memory:
            for memory, state in zip(self.memories, cache):
                memory.check_state(state, batch_size, self.hidden_dim)

    def _hidden_states(self, token_ids, memory, training=None, window=None):
        x = self.embeddings_dropout(self.token_embedding(token_ids), training=training)
        if memory is None or not self.has_memory:
            for block in self.transformer_blocks:
                x = block(x, window=window, training=training)
            return self.final_norm(x), memory
        states, losses = [], []
        for block, layer_memory, state in zip(self.transformer_blocks, self.memories, memory):
            attended, attended_mask = layer_memory.attended(state)
            output = block(x, memory=attended, memory_mask=attended_mask, window=window, training=training)
            state, evicted = layer_memory.update(state, ops.stop_gradient(x))
            if evicted is not None and training and self.reconstruction_weight:
                norm = block.self_attention_norm if block.norm_position == "pre" else None
                queries = x if norm is None else norm(x)
                losses.append(layer_memory.reconstruction_loss(block.self_attention_layer, queries, evicted, norm))
            states.append({name: ops.stop_gradient(value) for name, value in state.items()})
            x = output
        if losses:
            self.add_loss(self.reconstruction_weight * sum(losses))
        return self.final_norm(x), tuple(states)

    def call(self, token_ids, training=None):
        if not training or not self.has_memory:
            return self.logits(self._hidden_states(token_ids, None, training)[0])
        if self.memory_variables is None:
            raise ValueError(
                "TransformerXLLM trains on a stateful stream: build it with the stream's batch size first "
                f"(model.build((batch_size, segment_length)), or call it on a batch). Received: token_ids.shape="
                f"{tuple(token_ids.shape)}"
            )
        batch = self.memory_variables[0]["memory"].shape[0]
        if token_ids.shape[0] is not None and token_ids.shape[0] > batch:
            raise ValueError(
                f"The memory of the stateful stream holds {batch} rows (the batch size the model was built with); "
                f"a training batch can have at most as many. Received: token_ids.shape={tuple(token_ids.shape)}"
            )
        # A partial batch (the last of an epoch) continues the streams of its rows, the first
        # `rows`; the other rows' memory is kept as it is.
        rows = ops.shape(token_ids)[0]
        # Copies: the variables are assigned below, in place on PyTorch, while the backward pass needs what was read.
        memory = tuple(
            {name: ops.copy(v.value[:rows]) for name, v in variables.items()} for variables in self.memory_variables
        )
        hidden, memory = self._hidden_states(token_ids, memory, training)
        for variables, state in zip(self.memory_variables, memory):
            for name, value in state.items():
                kept = variables[name].value[rows:]
                variables[name].assign(ops.concatenate([ops.cast(value, kept.dtype), kept], axis=0))
        return self.logits(hidden)

    # ------------------------------------------------------------------ generation protocol

    @property
    def max_length(self):
        """`None`: the memory carries the context, whatever its length."""
        return None

    @property
    def sliding_window_cache(self):
        """`call_with_cache` takes a `window` (the positions are relative)."""
        return True

    def init_cache(self, batch_size, length=None, window=None):
        """The empty memory of a batch (one state per layer; `length` is not needed)."""
        return self._empty_memory(batch_size)

    def resize_cache(self, cache, length):
        """The memory does not grow with the length: returned as it is."""
        return cache

    # Every decoding step carries the final hidden states.
    returns_hidden_states = True

    def call_with_cache(self, token_ids, cache, index=0, window=None):
        """A segment `token_ids (B, T)` after the memory `cache`: a `DecodeStep` of float32 logits
        `(B, T, V)`, the next memory and the final hidden states `(B, T, D)`.

        `index` is not needed (positions are relative); with a `window`,
        attention sees at most the `window` most recent positions.
        """
        self._check_memory(cache, token_ids.shape[0])
        hidden, memory = self._hidden_states(token_ids, cache, training=False, window=window)
        return DecodeStep(self.logits(hidden), memory, hidden)

    def hidden_states(self, token_ids, cache=None, window=None):
        """`call_with_cache` without the output head: `(final hidden states (B, T, D), next memory)`.

        With `cache=None`, one segment without memory (and `None` back).
        """
        if cache is not None:
            self._check_memory(cache, token_ids.shape[0])
        return self._hidden_states(token_ids, cache, training=False, window=window)

    def logits(self, hidden):
        """Float32 vocabulary logits of final hidden states, through the tied embedding."""
        return self.token_embedding(hidden, reverse=True)

    # ------------------------------------------------------------------ monitoring

    def spans(self):
        """The learned attention spans, float32 `(num_layers, num_heads)`, or `None` without adaptive spans."""
        if self.max_span is None:
            return None
        return ops.stack([block.self_attention_layer.position.spans() for block in self.transformer_blocks])

    def summary_scalars(self):
        """What to plot while training: `{name: float}`.

        `memory/length` and `memory/compressed_length` (the configuration),
        `memory/filled`, `memory/compressed_filled` (slots of the stream's
        memory holding states, mean over rows), `memory/reach` (tokens
        back the memory covers: filled + compressed filled x rate), and with
        adaptive spans `span/layer_{i}/head_{h}` (tokens).
        """
        scalars = {"memory/length": float(self.memory_length)}
        if self.compressed_memory_length:
            scalars["memory/compressed_length"] = float(self.compressed_memory_length)
        if self.memory_variables:
            first = self.memory_variables[0]
            filled = float(ops.mean(ops.sum(ops.cast(first["memory_mask"].value, "float32"), axis=1)))
            scalars["memory/filled"], scalars["memory/reach"] = filled, filled
            if "compressed_mask" in first:
                held = float(ops.mean(ops.sum(ops.cast(first["compressed_mask"].value, "float32"), axis=1)))
                scalars["memory/compressed_filled"] = held
                scalars["memory/reach"] = filled + held * self.compression_rate
        spans = self.spans()
        if spans is not None:
            for layer, heads in enumerate(ops.convert_to_numpy(spans)):
                for head, span in enumerate(heads):
                    scalars[f"span/layer_{layer}/head_{head}"] = float(span)
        return scalars

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_preset(cls, name, **overrides):
        """A model from a preset name (`TRANSFORMER_XL_PRESETS`) and a `vocabulary_size`, any field overridden, or
        a preset directory written by `save_to_preset` (loaded as saved)."""
        if names_directory(name):
            return load_preset(os.fspath(name), cls, **overrides)
        if name not in TRANSFORMER_XL_PRESETS:
            raise ValueError(
                f"Unknown preset. Expected one of {tuple(TRANSFORMER_XL_PRESETS)}. Received: name={name!r}"
            )
        return cls(**{**TRANSFORMER_XL_PRESETS[name], **overrides})

    # ------------------------------------------------------------------ config

    def get_config(self):
        return {**base_model_config(self), "vocabulary_size": self.vocabulary_size, **option_config(self, self.OPTIONS)}
