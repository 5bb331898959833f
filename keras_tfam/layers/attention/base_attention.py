"""The attention contract: one fixed `call` that every attention kind shares, one kernel hook each fills in."""

import keras
from keras import ops

from keras_tfam.layers.attention import attention_inputs, attention_kernels
from keras_tfam.layers.attention.attention_context import AttentionContext
from keras_tfam.layers.attention.caches.key_value_cache import KeyValueCache
from keras_tfam.layers.attention.patterns.registry import get_pattern
from keras_tfam.layers.core.dense import Dense
from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme, check_no_score_bias
from keras_tfam.ops import masks as mask_ops
from keras_tfam.utils import check_positive_int, check_real, check_window


class BaseAttention(keras.layers.Layer):
    """Multi-head attention as a fixed pipeline; a kind overrides its kernel, `attend`.

    `call` runs the same steps for every kind, in the full pass and when
    decoding:

    1. resolve the inputs (defaults, Keras masks) and refuse what the kind
       declares it cannot honour (`supports_*` below), in one line;
    2. prepend a `memory` (Transformer-XL's past hidden states) to the keys
       and values;
    3. project queries, keys and values to heads (`project`);
    4. apply the position scheme's rotation;
    5. write the cache, in one place: the kind's `cache_for(window)`
       (`KeyValueCache`, `RecurrentStateCache`, ...) updates it and says
       which keys, at which absolute positions, the queries see;
    6. `attend(query, key, value, context)`: the kind's kernel, told the
       positions, masks and options in an `AttentionContext`;
    7. merge the heads and project the output.

    A new kind is one file: a subclass that overrides `attend` (and, when
    it keeps other state, `cache_for`), declares what it supports, and
    registers itself with `@register_attention("name")`.

    Declared capabilities (class attributes; a call or constructor asking
    for more raises a `ValueError` naming the option and the kind):
    `self_attention_only`, `supports_attention_mask`,
    `supports_attention_scores`, `supports_pattern`, `supports_cache`,
    `supports_window`, `supports_ring_cache` (a `window` with a cache), `supports_memory`,
    `supports_causal`, `accepts_position` (any position scheme),
    `accepts_score_bias` (schemes that add to scores or reweight them),
    `has_attention_weights` (`dropout` applies to them), `decodes_causally`
    (a cached call is causal whatever `use_causal_mask` says),
    `call_inputs` (the names of the kind's own call arguments),
    `attention_kernels` (the named kernels its `attend` runs, `keras_tfam.layers.attention.attention_kernels`;
    `()`: a kernel of its own).

    Args:
        num_heads: query heads `N`.
        key_dim: size `H` of each query and key head.
        value_dim: size of each value head; default `key_dim`.
        num_key_value_heads: key/value heads (grouped-query attention);
            default `num_heads`.
        output_dim: width of the output; default the query's.
        use_bias: biases on the projections.
        dropout: dropout on the attention weights.
        position: an `AttentionPositionScheme`, or `None`.
        scale: the scores' scale; default `1 / sqrt(key_dim)`.
        kernel_initializer: initializer of the projections.
        bias_initializer: initializer of their biases.
        output_kernel_initializer: initializer of the output projection;
            default `kernel_initializer`.
        pattern: a sparse `AttentionPattern`, or `None`.
        qkv_bias: biases on the query, key and value projections only;
            default `use_bias`.
        attention_kernel: `"auto"` (the kind picks per call) or one of the
            kind's `attention_kernels`, which each call then runs or refuses.

    Examples:
        >>> isinstance(PerformerAttention(4, 8), BaseAttention)  # every kind is one
        True
        >>> attention = MultiHeadAttention(4, 8, num_key_value_heads=2)
        >>> x = keras.random.normal((2, 6, 32))
        >>> cache = attention.init_cache(2, 6)  # decoding: one token at a time into the cache
        >>> y, cache = attention(x[:, :1], cache=cache, cache_update_index=0)
        >>> y.shape
        (2, 1, 32)
    """

    self_attention_only = False
    supports_attention_mask = True
    supports_attention_scores = True
    supports_pattern = True
    supports_cache = True
    supports_ring_cache = True
    supports_window = True
    supports_memory = True
    supports_causal = True
    accepts_position = True
    accepts_score_bias = True
    has_attention_weights = True
    decodes_causally = False
    shares_query_key = False
    call_inputs = ()
    attention_kernels = ()
    # The kind's own options, as tests exercise them (the first: the least a constructor needs).
    example_options = ({},)
    # Why a refused option is refused, by name, for the error message.
    refusal_reasons = {}

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        num_key_value_heads=None,
        output_dim=None,
        use_bias=True,
        dropout=0.0,
        position=None,
        scale=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        output_kernel_initializer=None,
        pattern=None,
        qkv_bias=None,
        attention_kernel="auto",
        **kwargs,
    ):
        super().__init__(**kwargs)
        attention_kernel = attention_kernels.check_attention_kernel(type(self), attention_kernel)
        num_heads, key_dim = _positive_int("num_heads", num_heads), _positive_int("key_dim", key_dim)
        value_dim = key_dim if value_dim is None else _positive_int("value_dim", value_dim)
        num_key_value_heads = num_heads if num_key_value_heads is None else num_key_value_heads
        num_key_value_heads = _positive_int("num_key_value_heads", num_key_value_heads)
        if num_heads % num_key_value_heads:
            raise ValueError(
                "`num_heads` must be a multiple of `num_key_value_heads`. Received: "
                f"num_heads={num_heads}, num_key_value_heads={num_key_value_heads}"
            )
        if output_dim is not None:
            output_dim = _positive_int("output_dim", output_dim)
        dropout = check_real("dropout", dropout, "in [0, 1)", lambda rate: 0.0 <= rate < 1.0)
        kind = type(self).__name__
        if position is not None and not isinstance(position, AttentionPositionScheme):
            raise ValueError(
                "`position` must be an AttentionPositionScheme (RotaryEmbedding, "
                f"ALiBiBias, RelativePositionBias, ...) or None. Received: position={position!r}"
            )
        if position is not None and not self.accepts_position:
            raise ValueError(f"{kind} takes no position scheme. Received: position={position!r}")
        if not self.accepts_score_bias:
            check_no_score_bias(kind, position)
        position_heads = getattr(position, "num_heads", num_heads)
        if position_heads != num_heads:
            raise ValueError(
                f"`position` was built for {position_heads} heads but the attention has num_heads={num_heads}"
            )
        pattern = get_pattern(pattern)
        if pattern is not None and not self.supports_pattern:
            raise ValueError(
                f"{kind} cannot apply an attention pattern (local windows, sparse patterns) the same way in its "
                f"full pass and when decoding. Received: pattern={pattern!r}"
            )
        if pattern is not None and num_heads % pattern.head_groups:
            raise ValueError(
                f"`pattern` has {pattern.head_groups} head groups, which must divide num_heads={num_heads}. "
                f"Received: pattern={pattern!r}"
            )
        if dropout and not self.has_attention_weights:
            raise ValueError(f"{kind} has no attention weights to drop out. Received: dropout={dropout}")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.num_key_value_heads = num_key_value_heads
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.dropout = dropout
        self.position = position
        self.scale = scale
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.output_kernel_initializer = keras.initializers.get(output_kernel_initializer or kernel_initializer)
        self.pattern = pattern
        self.qkv_bias = use_bias if qkv_bias is None else qkv_bias
        self.attention_kernel = attention_kernel
        self.supports_masking = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        attention_kernels.check_declaration(cls)

    # ------------------------------------------------------------------ weights

    def _dense(self, units, name, kernel_initializer=None, use_bias=None):
        return Dense(
            units,
            use_bias=self.use_bias if use_bias is None else use_bias,
            kernel_initializer=kernel_initializer or self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        if len(query_shape) != 3:
            raise ValueError(f"`query` must have rank 3 (batch, seq, dim). Received: query.shape={tuple(query_shape)}")
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        kv_heads = self.num_key_value_heads
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query", use_bias=self.qkv_bias)
        self.query_dense.build(query_shape)
        if not self.shares_query_key:
            self.key_dense = self._dense(kv_heads * self.key_dim, "key", use_bias=self.qkv_bias)
            self.key_dense.build(key_shape)
        self.value_dense = self._dense(kv_heads * self.value_dim, "value", use_bias=self.qkv_bias)
        self.value_dense.build(value_shape)
        self.output_dense = self._dense(
            self.output_dim or query_shape[-1], "attention_output", self.output_kernel_initializer
        )
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))
        if self.dropout:
            self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        if self.position is not None and not self.position.built:
            self.position.build((None, None, self.num_heads, self.key_dim))
        self.built = True

    # ------------------------------------------------------------------ the pipeline

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        window=None,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
        memory=None,
        memory_mask=None,
        **kind_inputs,
    ):
        window = check_window(window)
        attention_inputs.check_call(
            self,
            query,
            value,
            key,
            attention_mask,
            use_causal_mask,
            window,
            cache,
            cache_update_index,
            return_attention_scores,
            memory,
            kind_inputs,
        )
        value, key, query_mask, key_padding_mask = self.resolve_inputs(
            query, value, key, query_mask, value_mask, key_mask, cache
        )
        memory_length = 0
        if memory is not None:
            value, key, key_padding_mask = attention_inputs.prepend_memory(
                query, value, key, key_padding_mask, memory, memory_mask
            )
            memory_length = ops.shape(memory)[1]
        offset = 0 if cache_update_index is None else cache_update_index
        # A memory takes the M positions from `offset`; the queries follow it.
        query_offset = offset if memory is None else ops.add(offset, memory_length)
        causal, state, store = use_causal_mask, None, None
        source = cache is not None and cache_update_index is None
        if source:
            self.check_source_cache(cache)
            query_heads = self.split_heads(self.query_dense(query), self.num_heads)
            key_heads, value_heads = cache[:, 0], cache[:, 1]  # a precomputed cross-attention source
            key_positions = mask_ops.positions(ops.shape(key_heads)[1])
        else:
            query_heads, key_heads, value_heads = self.project(query, key, value)  # [B, T, N, H], [B, S, K, H]
        projected_query = query_heads  # before the position scheme
        if not source:
            if self.position is not None:
                query_heads, key_heads = self.position.rotate_query_key(query_heads, key_heads, query_offset, offset)
            key_positions = mask_ops.positions(ops.shape(key_heads)[1], offset)
            if cache is not None:
                store = self.cache_for(window)
                store.check(cache)
                cache, key_heads, value_heads, key_positions, state = store.update(
                    cache, key_heads, value_heads, cache_update_index, window
                )
                causal = causal or self.decodes_causally
        query_positions = mask_ops.positions(ops.shape(query_heads)[1], query_offset)
        inputs = {"query": query, "key": key, "value": value, "query_heads": projected_query}
        context = AttentionContext(
            query_positions=query_positions,
            key_positions=key_positions,
            query_mask=query_mask,
            key_mask=key_padding_mask,
            attention_mask=attention_mask,
            causal=causal,
            window=window,
            pattern=self.pattern,
            num_heads=self.num_heads,
            cached=cache is not None,
            state=state,
            memory_length=memory_length,
            training=training,
            return_attention_scores=return_attention_scores,
            inputs=inputs,
            options=kind_inputs,
        )
        outputs, weights, state = self.attend(query_heads, key_heads, value_heads, context)  # [B, T, N, Hv]
        outputs = self.merge_heads(outputs)
        if cache is not None:
            return outputs, cache if store is None else store.store(cache, state)
        if return_attention_scores:
            return outputs, weights
        return outputs

    def resolve_inputs(self, query, value, key, query_mask, value_mask, key_mask, cache):
        """`(value, key, query_mask, key_padding_mask)` with defaults and Keras masks filled in."""
        return attention_inputs.resolve_inputs(query, value, key, query_mask, value_mask, key_mask, cache)

    def split_heads(self, x, num_heads):
        """`(B, T, num_heads * H)` -> `(B, T, num_heads, H)`."""
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], num_heads, x.shape[-1] // num_heads))

    def project(self, query, key, value):
        """Query, key and value heads: `(B, T, N, H)`, `(B, S, K, H)`, `(B, S, K, Hv)`."""
        return (
            self.split_heads(self.query_dense(query), self.num_heads),
            self.split_heads(self.key_dense(key), self.num_key_value_heads),
            self.split_heads(self.value_dense(value), self.num_key_value_heads),
        )

    def merge_heads(self, outputs):
        """`(B, T, N, Hv)` -> the output projection's `(B, T, output_dim)`."""
        shape = ops.shape(outputs)
        outputs = ops.cast(outputs, self.compute_dtype)
        outputs = ops.reshape(outputs, (shape[0], shape[1], self.num_heads * self.value_dim))
        return self.output_dense(outputs)

    def repeat_key_value_heads(self, x):
        """`(B, S, K, H)` -> `(B, S, N, H)`: each key/value head repeated for its group of query heads."""
        groups = self.num_heads // self.num_key_value_heads
        return x if groups == 1 else ops.repeat(x, groups, axis=2)

    def attend(self, query, key, value, context):
        """The kernel: `(B, T, N, H)` queries over `(B, S, K, H)` keys and `(B, S, K, Hv)` values.

        Returns `(outputs (B, T, N, Hv), weights (B, N, T, S) or None, state or None)`:
        `weights` when `context.return_attention_scores`; `state` the new
        running state of a recurrent cache (`context.state` continued).
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ caches

    def cache_for(self, window=None):
        """The cache this kind decodes with for a call with `window`; a `KeyValueCache` by default."""
        if self.value_dim != self.key_dim:
            raise ValueError(
                f"A KV cache needs value_dim == key_dim. Received: key_dim={self.key_dim}, value_dim={self.value_dim}"
            )
        lookback = None if self.pattern is None else self.pattern.lookback
        return KeyValueCache(self.num_key_value_heads, self.key_dim, lookback)

    def init_cache(self, batch_size, max_length=None, dtype="float32", window=None):
        """An empty cache for decoding `max_length` positions (with `window`: the recent `window` only)."""
        self._check_decodes(window)
        return self.cache_for(check_window(window)).init(batch_size, max_length, dtype, window)

    def resize_cache(self, cache, max_length, window=None):
        """The cache grown to `max_length` positions (new positions empty)."""
        return self.cache_for(check_window(window)).resize(cache, max_length)

    def write_cache(self, cache, inputs, index, window=None):
        """Writes the keys and values of `inputs (B, T, D)` at positions `index ..` into a key/value `cache`,
        as a call would, without attending (early exit fills the caches of the layers it skips)."""
        store = self.cache_for(window)
        if not isinstance(store, KeyValueCache):
            raise ValueError(
                f"{type(self).__name__} keeps a {type(store).__name__} here, which only its kernel updates: "
                f"write_cache takes key/value caches. Received: window={window}"
            )
        store.check(cache)
        _, key, value = self.project(inputs, inputs, inputs)
        if self.position is not None:
            _, key = self.position.rotate_query_key(key, key, index, index)
        return store.update(cache, key, value, index, window)[0]

    def _check_decodes(self, window):
        kind = type(self).__name__
        if not self.supports_cache:
            raise ValueError(f"{kind} does not decode with a cache.")
        if window is not None and not self.supports_ring_cache:
            raise ValueError(f"{kind} does not decode with a sliding-window (ring) cache. Received: window={window}")

    def check_source_cache(self, cache):
        """A precomputed cross-attention source `(B, 2, S, K, H)`."""
        shape = tuple(cache.shape)
        if len(shape) != 5 or shape[1] != 2 or shape[3:] != (self.num_key_value_heads, self.key_dim):
            raise ValueError(
                "A cache passed without `cache_update_index` is a precomputed source (batch, 2, length, "
                f"num_key_value_heads={self.num_key_value_heads}, key_dim={self.key_dim}), as "
                f"compute_key_value_cache makes it. Received: cache.shape={shape}"
            )

    def compute_key_value_cache(self, key, value=None):
        """Projects a source once for cross-attention decoding: `(B, 2, S, K, H)`, passed as `cache`
        without a `cache_update_index`."""
        value = key if value is None else value
        key_heads = self.split_heads(self.key_dense(key), self.num_key_value_heads)
        value_heads = self.split_heads(self.value_dense(value), self.num_key_value_heads)
        return ops.stack([key_heads, value_heads], axis=1)

    # ------------------------------------------------------------------ config

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            num_key_value_heads=self.num_key_value_heads,
            output_dim=self.output_dim,
            use_bias=self.use_bias,
            dropout=self.dropout,
            position=keras.saving.serialize_keras_object(self.position),
            scale=self.scale,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            output_kernel_initializer=keras.initializers.serialize(self.output_kernel_initializer),
            pattern=keras.saving.serialize_keras_object(self.pattern),
            qkv_bias=self.qkv_bias,
            attention_kernel=self.attention_kernel,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["position"] = keras.saving.deserialize_keras_object(config.get("position"))
        config["pattern"] = get_pattern(config.get("pattern"))
        return cls(**config)


def _positive_int(name, value):
    check_positive_int(name, value)
    return int(value)
