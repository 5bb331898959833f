"""Decoder-only language models (GPT-2, GPT-Neo, Llama, Mistral, Qwen2, Gemma) as one Keras functional model."""

import math
import os

import keras
from keras import ops

from keras_tfam.generation.generator import GenerationMixin
from keras_tfam.generation.protocol import DecodeStep
from keras_tfam.layers.attention.caches import KeyValueCache
from keras_tfam.layers.attention.patterns.registry import get_pattern
from keras_tfam.layers.attention.patterns.sliding_window import SlidingWindow
from keras_tfam.layers.attention.registry import attention_kinds, make_attention
from keras_tfam.layers.blocks.feed_forward import ACTIVATIONS
from keras_tfam.layers.blocks.transformer_decoder_block import TransformerDecoderBlock
from keras_tfam.layers.core.dense import Dense
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.normalization.get_norm import NORMS, get_norm
from keras_tfam.layers.position.position_embedding import PositionEmbedding
from keras_tfam.layers.position.registry import ATTENTION_POSITIONS, make_attention_position
from keras_tfam.models.checkpoint_loaders import checkpoint_loader, checkpoint_writer
from keras_tfam.models.decoder_layout_map import decoder_layout_map
from keras_tfam.models.functional_model import FunctionalModel
from keras_tfam.models.gpt2_presets import GPT2_PRESETS
from keras_tfam.models.local_layers import LOCAL_LAYERS, local_layer_indices
from keras_tfam.models.option import Option, check_options, option_config
from keras_tfam.models.preset_directory import load_preset, names_directory
from keras_tfam.models.token_ids import check_token_ids
from keras_tfam.utils import base_model_config, check_positive_int, head_size


def positions():
    """The `position` option's values, read now: learned positions added to the embeddings, `"none"` (causal
    attention alone tells positions apart), and the schemes inside attention."""
    return ("learned", "none", *ATTENTION_POSITIONS)


@keras.saving.register_keras_serializable(package="keras_tfam")
class DecoderLM(GenerationMixin, FunctionalModel):
    """A decoder-only LM: `token_ids (B, T)` -> float32 next-token logits `(B, T, V)`.

    Token embedding (times `embedding_scale`) plus learned positions,
    dropout, `num_layers` pre-norm decoder blocks, a final norm, and logits
    `h @ E^T` through the token embedding itself (weight tying: one
    variable), or through an untied output head. Its defaults are GPT-2
    (`GPT2LM`): tanh-approximate GELU, 4x feed-forward, LayerNorm,
    initialisation normal(0.02) with the output projections of each
    residual branch scaled by `1 / sqrt(2 * num_layers)`.

    The Llama family is a configuration of the same model: `position=
    "rotary"` with `position_options` (`max_wavelength` is the rope theta,
    `pairing="half"` is Hugging Face's rotate-half, `scaling` a
    context-extension rule), `norm="rms"` (Gemma: `"gemma_rms"`),
    `activation="swiglu"` (Gemma: `"geglu_tanh"`), `num_key_value_heads`,
    `head_dim` independent of the width, `use_bias=False` with q/k/v biases
    through `attention_options={"qkv_bias": True}` (Qwen2), an untied head
    (`tie_embeddings=False`), Gemma's `embedding_scale = sqrt(hidden_dim)`,
    and Mistral's sliding window (`local_window`, `local_layers="all"`).
    `keras_tfam.models.from_huggingface` builds them from checkpoints.

    The core library's options are one argument away: `position`
    (`positions()`: `"learned"`, `"none"`, or a scheme inside attention,
    `"rotary"`, `"alibi"`, `"relative"`), `norm` (`"layer"`, `"rms"`,
    `"scale"`), `activation` (`"gelu_tanh"`, `"swiglu"`, ...),
    `num_key_value_heads` (grouped-query attention), `attention` (a kind
    registered with `keras_tfam.layers.attention.registry.register_attention`, with
    its own `attention_options`), local layers (`local_window`). The same
    code path trains, generates and exports every variant.

    Local layers attend to the last `local_window` positions only
    (`SlidingWindow` pattern): GPT-3's "alternating dense and locally
    banded sparse attention patterns" (Brown et al. 2020) and GPT-Neo's
    global/local layers. They compute in `O(T * local_window)` and decode
    with ring caches of `local_window` slots, while global layers keep full
    caches.

    The model knows the longest context it was trained on (`max_length`:
    `context_length`, else the learned position table). `generate` never
    attends over more: past it, each new token sees the last `max_length`
    tokens (a ring cache for relative or no positions, re-encoding the
    window for learned ones); see `keras_tfam.generation`.

    Args:
        vocabulary_size: number of token ids `V`.
        num_layers: decoder blocks.
        num_heads: attention heads.
        hidden_dim: model width `D`.
        head_dim: the size of each head; default `hidden_dim / num_heads`
            (Gemma's heads are wider: `num_heads * head_dim != hidden_dim`).
        intermediate_dim: feed-forward width; default `4 * hidden_dim`.
        max_sequence_length: positions of the learned position table.
        context_length: the longest context the model was trained on
            (`tfam train` records its sequence length); default: the learned
            position table, and no limit for other position schemes.
        position: position scheme.
        position_options: the scheme's own arguments, e.g. for `"rotary"`
            `{"max_wavelength": 500000.0, "pairing": "half", "scaling":
            {"type": "llama3", ...}}`.
        norm: norm of the blocks and the final norm.
        activation: feed-forward activation.
        num_key_value_heads: key/value heads; default `num_heads`.
        attention: the attention kind (`"softmax"`; `"linear"` is
            `LinearAttention`: O(1) per generated token, the cache is its
            recurrent state).
        attention_options: the attention kind's own arguments, e.g.
            `{"feature_map": "exp"}` for linear attention, or a `pattern`
            for every layer (`{"pattern": {"name": "strided", "stride": 32}}`).
        local_window: the window of the local layers, or `None` (no local
            layers).
        local_layers: which layers are local: `"odd"` (1, 3, ...: dense
            and local layers alternate, as GPT-3 and GPT-Neo), `"even"`,
            `"all"`, or a list of layer indices.
        dropout: dropout on embeddings, residual branches and attention
            weights (GPT-2: 0.1).
        norm_epsilon: epsilon of the norms (GPT-2: 1e-5).
        use_bias: biases in the dense layers (q/k/v alone: `attention_options=
            {"qkv_bias": True}`).
        tie_embeddings: logits through the token embedding (GPT-2); `False`
            gives the model its own output head (a `Dense` without bias named
            `output_head`, as Llama's `lm_head`).
        embedding_scale: multiplies the token embeddings (Gemma:
            `sqrt(hidden_dim)`); `None` is 1.
        dtype: dtype policy of every layer (e.g. `"mixed_bfloat16"`); the
            logits are float32 regardless.

    Examples:
        >>> model = DecoderLM(vocabulary_size=1000, num_layers=2, num_heads=4, hidden_dim=32,
        ...                   position="rotary", norm="rms", activation="swiglu", num_key_value_heads=2)
        >>> tokens = np.random.randint(0, 1000, size=(8, 17))
        >>> model.compile("adamw", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> history = model.fit(tokens[:, :-1], tokens[:, 1:], epochs=1, verbose=0)
        >>> model.generate([[464, 329]], max_new_tokens=20, sampler="top_p", seed=0).shape
        (1, 22)
    """

    # The constructor arguments a training config may set: what the constructor checks, `get_config`
    # lists, presets take and `tfam train` offers as flags. Registries are read at each check.
    OPTIONS = {
        "num_layers": Option(int),
        "num_heads": Option(int),
        "hidden_dim": Option(int),
        "head_dim": Option(int, optional=True),
        "intermediate_dim": Option(int, optional=True),
        "max_sequence_length": Option(int),
        "context_length": Option(int, optional=True),
        "position": Option(str, choices=positions),
        "position_options": Option(dict, optional=True),
        "norm": Option(str, choices=NORMS),
        "activation": Option(str, choices=ACTIVATIONS),
        "num_key_value_heads": Option(int, optional=True),
        "attention": Option(str, choices=lambda: tuple(attention_kinds(decoder=True))),
        "attention_options": Option(dict, optional=True),
        "local_window": Option(int, optional=True),
        "local_layers": Option(str, choices=LOCAL_LAYERS, indices=True),
        "dropout": Option(float, allowed="in [0, 1)", condition=lambda rate: 0.0 <= rate < 1.0),
        "norm_epsilon": Option(float, allowed="> 0", condition=lambda epsilon: epsilon > 0.0),
        "use_bias": Option(bool),
        "tie_embeddings": Option(bool),
        "embedding_scale": Option(float, allowed="> 0", condition=lambda scale: scale > 0.0, optional=True),
    }

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim=None,
        max_sequence_length=1024,
        context_length=None,
        position="learned",
        position_options=None,
        norm="layer",
        activation="gelu_tanh",
        num_key_value_heads=None,
        attention="softmax",
        attention_options=None,
        local_window=None,
        local_layers="odd",
        dropout=0.0,
        norm_epsilon=1e-5,
        use_bias=True,
        head_dim=None,
        tie_embeddings=True,
        embedding_scale=None,
        dtype=None,
        **kwargs,
    ):
        # === Config === (plain attributes before the functional graph; see `FunctionalModel`)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        for name, value in check_options(self.OPTIONS, locals()).items():
            setattr(self, name, value)
        self.head_dim = self.head_dim or head_size("hidden_dim", self.hidden_dim, self.num_heads)
        self.intermediate_dim = self.intermediate_dim or 4 * self.hidden_dim
        self.num_key_value_heads = self.num_key_value_heads or self.num_heads
        self.position_options = dict(self.position_options or {})
        self.attention_options = dict(self.attention_options or {})
        if self.position_options and self.position in ("learned", "none"):
            raise ValueError(
                f"`position_options` configure a scheme inside attention; position={self.position!r} takes none. "
                f"Received: position_options={self.position_options!r}"
            )
        if self.position == "learned" and (self.context_length or 0) > self.max_sequence_length:
            raise ValueError(
                f"`context_length` cannot exceed the {self.max_sequence_length} learned positions "
                f"(max_sequence_length). Received: context_length={self.context_length}"
            )
        pattern = get_pattern(self.attention_options.get("pattern"))
        if pattern is not None and pattern.depends_on_length:
            raise ValueError(
                "A decoder's pattern must not depend on the sequence's length (it decodes causally): use the causal "
                f"form (e.g. BigBird(causal=True)). Received: attention_options={{'pattern': {pattern!r}}}"
            )
        local = local_layer_indices(self.local_window, self.local_layers, self.num_layers)
        initializer = keras.initializers.RandomNormal(stddev=0.02)
        residual_initializer = keras.initializers.RandomNormal(stddev=0.02 / math.sqrt(2 * self.num_layers))

        # === Layers ===
        self.token_embedding = TiedEmbedding(
            self.vocabulary_size,
            self.hidden_dim,
            embeddings_initializer=initializer,
            dtype=dtype,
            name="token_embedding",
        )
        self.position_embedding = None
        if self.position == "learned":
            self.position_embedding = PositionEmbedding(
                self.max_sequence_length,
                initializer=keras.initializers.RandomNormal(stddev=0.01),
                dtype=dtype,
                name="position_embedding",
            )
        self.embeddings_dropout = keras.layers.Dropout(self.dropout, dtype=dtype, name="embeddings_dropout")

        def self_attention(i):
            pattern = {"pattern": SlidingWindow(self.local_window)} if i in local else {}
            position = None
            if self.position not in ("learned", "none"):
                position = make_attention_position(self.position, self.num_heads, self.position_options)
            return make_attention(
                self.attention,
                self.num_heads,
                self.head_dim,
                self.attention_options,
                num_key_value_heads=self.num_key_value_heads,
                use_bias=self.use_bias,
                dropout=self.dropout,
                position=position,
                kernel_initializer=initializer,
                output_kernel_initializer=residual_initializer,
                dtype=dtype,
                name=f"{self.attention}_attention_{i}",
                **pattern,
            )

        self.transformer_blocks = [
            TransformerDecoderBlock(
                self.num_heads,
                self.intermediate_dim,
                dropout=self.dropout,
                activation=self.activation,
                norm=self.norm,
                norm_position="pre",
                norm_epsilon=self.norm_epsilon,
                use_bias=self.use_bias,
                self_attention=self_attention(i),
                kernel_initializer=initializer,
                output_kernel_initializer=residual_initializer,
                dtype=dtype,
                name=f"transformer_block_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.final_norm = get_norm(self.norm, self.norm_epsilon, dtype=dtype, name="final_norm")
        self.output_head = None
        if not self.tie_embeddings:
            # The library's `Dense`: decoding one sequence multiplies by an int8 head one byte per weight.
            self.output_head = Dense(
                self.vocabulary_size, use_bias=False, kernel_initializer=initializer, dtype=dtype, name="output_head"
            )

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        hidden = self.embed(token_ids, 0)
        for block in self.transformer_blocks:
            hidden = block(hidden)
        logits = self.logits(self.final_norm(hidden))
        super().__init__(inputs=token_ids, outputs=logits, dtype=dtype, **kwargs)

    def embed(self, token_ids, start_index=0, training=None):
        """The input of the first block: token embeddings (plus learned positions from `start_index`), dropout."""
        x = self.token_embedding(token_ids)
        if self.embedding_scale is not None:
            x = x * ops.cast(self.embedding_scale, x.dtype)
        if self.position_embedding is not None:
            x = x + self.position_embedding(x, start_index=start_index)
        return self.embeddings_dropout(x, training=training)

    def call(self, inputs, training=None, mask=None):
        check_token_ids(inputs, max_length=None if self.position_embedding is None else self.max_sequence_length)
        return super().call(inputs, training=training, mask=mask)

    # ------------------------------------------------------------------ generation protocol

    @property
    def max_length(self):
        """The longest context the model was trained on, or `None` (no limit)."""
        if self.context_length is not None:
            return self.context_length
        return self.max_sequence_length if self.position_embedding is not None else None

    # Every decoding step carries the final hidden states.
    returns_hidden_states = True

    @property
    def sliding_window_cache(self):
        """Ring caches slide only where positions are relative (or absent), not with a learned table, and only
        where every attention layer decodes with a ring cache."""
        return self.position_embedding is None and all(
            block.self_attention_layer.supports_ring_cache for block in self.transformer_blocks
        )

    @property
    def positional_cache(self):
        """Every attention layer keeps each position's keys and values in a slot of its own (no ring nor state)."""
        return all(
            isinstance(store, KeyValueCache) and store.lookback is None
            for store in (block.self_attention_layer.cache_for(None) for block in self.transformer_blocks)
        )

    def init_cache(self, batch_size, length, window=None):
        """Empty caches, one per block: `(B, 2, slots, K, H)` keys/values (`slots` at most
        `window`; rings of `local_window` slots in local layers), or the recurrent
        state of linear attention."""
        return tuple(
            block.self_attention_layer.init_cache(batch_size, length, block.compute_dtype, window=window)
            for block in self.transformer_blocks
        )

    def resize_cache(self, cache, length):
        """The caches of `init_cache` grown to `length` positions."""
        return tuple(
            block.self_attention_layer.resize_cache(layer_cache, length)
            for block, layer_cache in zip(self.transformer_blocks, cache)
        )

    def call_with_cache(self, token_ids, cache, index, window=None):
        """Runs `token_ids (B, T)` at positions `index ..` over the caches.

        Returns a `DecodeStep`: float32 logits `(B, T, V)`, the updated
        caches, and the hidden states `(B, T, D)` (the final norm's output,
        the input of the softmax: what retrieval models such as `KNNLM` key
        on). With a `window`, attention sees at most the `window` most
        recent positions and the caches are rings (`init_cache(...,
        window=window)`).
        """
        if window is not None and not self.sliding_window_cache:
            raise ValueError(
                "Learned positions are absolute: a ring cache cannot slide them (the generator re-encodes the "
                f"window instead). Received: window={window}"
            )
        if not isinstance(cache, (list, tuple)) or len(cache) != len(self.transformer_blocks):
            raise ValueError(
                f"`cache` must hold one cache per block ({len(self.transformer_blocks)}), as `init_cache` makes "
                f"them. Received: cache of type {type(cache).__name__} with "
                f"{len(cache) if isinstance(cache, (list, tuple)) else 'no'} entries"
            )
        hidden = self.embed(token_ids, index, training=False)
        updated = []
        for block, layer_cache in zip(self.transformer_blocks, cache):
            hidden, layer_cache = block(
                hidden,
                self_attention_cache=layer_cache,
                self_attention_cache_update_index=index,
                self_attention_window=window,
            )
            updated.append(layer_cache)
        states = self.final_norm(hidden)
        return DecodeStep(self.logits(states), tuple(updated), states)

    def logits(self, hidden):
        """Float32 vocabulary logits of hidden states, through the tied embedding or the output head."""
        if self.output_head is None:
            return self.token_embedding(hidden, reverse=True)
        return ops.cast(self.output_head(hidden), "float32")

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_preset(cls, name, **overrides):
        """A model from a preset name (`GPT2_PRESETS`), any field overridden, or a preset directory written by
        `save_to_preset` (loaded as saved)."""
        if names_directory(name):
            return load_preset(os.fspath(name), cls, **overrides)
        if name not in GPT2_PRESETS:
            raise ValueError(f"Unknown preset. Expected one of {tuple(GPT2_PRESETS)}. Received: name={name!r}")
        return cls(**{**GPT2_PRESETS[name], **overrides})

    @classmethod
    def from_huggingface(cls, directory, **overrides):
        """Loads a local Hugging Face checkpoint directory (`config.json`, safetensors weights) of any
        supported `model_type`: see `keras_tfam.models.from_huggingface`."""
        return checkpoint_loader("huggingface")(directory, cls, **overrides)

    @staticmethod
    def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch"):
        """A `keras.distribution.LayoutMap` sharding the model over `device_mesh`, as keras-hub's backbones do:
        Megatron's split on the `model` axis (see `keras_tfam.models.decoder_layout_map`).

        Examples:
            >>> devices = keras.distribution.list_devices()
            >>> mesh = keras.distribution.DeviceMesh((1, len(devices)), ["batch", "model"], devices)
            >>> distribution = keras.distribution.ModelParallel(layout_map=DecoderLM.get_layout_map(mesh),
            ...                                                 batch_dim_name="batch")
        """
        return decoder_layout_map(device_mesh, model_parallel_dim_name, data_parallel_dim_name)

    @classmethod
    def from_keras_hub(cls, backbone, **overrides):
        """Copies the weights of a `keras_hub.models.GPT2Backbone`."""
        return checkpoint_loader("keras_hub_gpt2")(backbone, cls, **overrides)

    def save_to_huggingface(self, directory, tokenizer=None, max_shard_size=None, dtype=None):
        """Writes the model as a Hugging Face checkpoint directory: `keras_tfam.convert.save_to_huggingface`.

        Examples:
            >>> import tempfile
            >>> model = GPT2LM(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, max_sequence_length=16)
            >>> model.save_to_huggingface(tempfile.mkdtemp())
            ['config.json', 'generation_config.json', 'model.safetensors']
        """
        return checkpoint_writer("huggingface")(self, directory, tokenizer, max_shard_size, dtype)

    def get_config(self):
        return {**base_model_config(self), "vocabulary_size": self.vocabulary_size, **option_config(self, self.OPTIONS)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "feature_map" in config:  # checkpoints of keras_tfam 0.1
            feature_map = config.pop("feature_map")
            if config.get("attention") == "linear":
                config["attention_options"] = {"feature_map": feature_map, **(config.get("attention_options") or {})}
        return cls(**config)
