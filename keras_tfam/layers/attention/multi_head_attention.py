"""Multi-head attention with grouped key/value heads, position schemes and a KV cache."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.registry import get_pattern
from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme
from keras_tfam.ops import masks as mask_ops
from keras_tfam.ops.banded import band_block_size, banded_attention
from keras_tfam.ops.attention import (
    apply_attention_weights,
    attention_weights,
    scaled_dot_product_attention,
)
from keras_tfam.utils import check_positive_int, check_window, static_dim, static_int


# Causal self-attention over at least this many positions runs in query blocks.
_CAUSAL_BLOCK_MIN_LENGTH = 128
_CAUSAL_BLOCKS = 4


def _causal_query_blocks(query_length, key_length, attention_mask):
    """`[(start, stop), ...]` query blocks for causal self-attention, or `None`.

    Only for static, equal query and key lengths (no cache), and an explicit
    `attention_mask` whose last two axes are static (full or broadcast).
    """
    if query_length is None or query_length != key_length or query_length < _CAUSAL_BLOCK_MIN_LENGTH:
        return None
    if attention_mask is not None and not (
        attention_mask.shape[-2] in (1, query_length) and attention_mask.shape[-1] in (1, key_length)
    ):
        return None
    bounds = [query_length * i // _CAUSAL_BLOCKS for i in range(_CAUSAL_BLOCKS + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _mask_block(attention_mask, start, stop):
    """The rows `start:stop` and columns `:stop` of a mask (broadcast axes kept)."""
    if attention_mask is None:
        return None
    if attention_mask.shape[-2] != 1:
        attention_mask = attention_mask[..., start:stop, :]
    if attention_mask.shape[-1] != 1:
        attention_mask = attention_mask[..., :stop]
    return attention_mask


@keras.saving.register_keras_serializable(package="keras_tfam")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (Vaswani et al. 2017) for self- and cross-attention.

    Queries, keys and values are projected to `num_heads` query heads and
    `num_key_value_heads` key/value heads; with fewer key/value heads the
    query heads share them in groups (grouped-query attention, Ainslie et
    al. 2023; multi-query attention, Shazeer 2019, when there is one). A
    position scheme plugs in through its hooks (`AttentionPositionScheme`):
    rotary rotates queries and keys at their absolute positions, ALiBi and
    relative buckets add a bias to the scores, Shaw et al.'s and
    Transformer-XL's relative positions add terms that read the queries and
    keys (Shaw's also the values), adaptive spans reweight the attention.

    For decoding, a static-size KV cache `(B, 2, slots, K, H)` holds the
    keys (index 0) and values (index 1) of every position; the keys and
    values of the new tokens are written at `cache_update_index`, and the
    queries attend to the whole cache (use the causal mask, or an attention
    mask, to hide slots not yet written). A cache passed without an update
    index is used as it is: the precomputed keys and values of a
    cross-attention source. `resize_cache` grows a cache, so decoding can
    start with a short one and attend over fewer slots.

    With a `window`, each query attends to at most the `window` most recent
    positions (itself included; Beltagy et al. 2020, Mistral), and a cache
    is a ring: position `p` lives in slot `p % slots`, so a cache of
    `window` slots decodes any number of tokens in O(window) memory and
    time per token (`init_cache(..., window=W)`). Without a window a cache
    is a plain buffer, and writing past its last slot is an error.

    An attention `pattern` (`keras_tfam.layers.attention.patterns`: sliding
    or dilated windows, the Sparse Transformer's strided and fixed patterns,
    blockwise, global tokens, BigBird, their unions and per-head
    combinations) restricts which keys each query sees, on top of the other
    masks. Whenever the allowed keys lie in a band around the query (a
    `window`, or a pattern with a bounded `lookback` and `lookahead`),
    self-attention without a cache runs banded: blocks of queries over
    their neighbouring key blocks, `O(T * window)` time and memory instead
    of `O(T^2)` (`keras_tfam.ops.banded`). Other patterns are applied as a
    dense mask. A pattern with a bounded `lookback` makes every cache a
    ring of `lookback` slots, as a `window` does.

    A `memory` (Transformer-XL's segment recurrence, Dai et al. 2019) holds
    the states of the `M` positions before the queries: its keys and values
    are prepended to the others, so every query may attend to it, and a
    position scheme sees the distances across it (the memory takes
    positions `0 .. M - 1`, the queries and their keys follow from `M`).
    The caller stops its gradient.

    Causal self-attention over 128 positions or more (static lengths, no
    cache, no band) runs in 4 blocks of queries, each over the keys up to
    its last position: the score blocks above the diagonal, all masked,
    are skipped.

    Subclasses that change how attention is computed (linear attention, ...)
    override `_compute_attention`.

    Args:
        num_heads: number of query heads `N`.
        key_dim: size `H` of each query and key head.
        value_dim: size of each value head; defaults to `key_dim`.
        num_key_value_heads: number of key/value heads `K`, a divisor of
            `num_heads`; defaults to `num_heads`.
        output_dim: size of the output; defaults to the query's last axis.
        use_bias: whether the projections have biases.
        dropout: dropout rate on the attention weights.
        position: an `AttentionPositionScheme` (`RotaryEmbedding`,
            `ALiBiBias`, `RelativePositionBias`, `ShawRelativePosition`,
            `TransformerXLPosition`, `AdaptiveSpan`, `ComposedPosition`) or
            `None`.
        scale: score multiplier; defaults to `1 / sqrt(key_dim)`.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        output_kernel_initializer: initializer of the output projection's
            kernel; defaults to `kernel_initializer` (GPT-2 scales it down
            with depth).
        pattern: an `AttentionPattern`, a config accepted by
            `patterns.get_pattern` (`{"name": "sliding_window", "window":
            256}`), or `None` (every key).
        qkv_bias: whether the query, key and value projections have biases;
            defaults to `use_bias` (GPT-Neo: `False`, with a biased output
            projection).

    Call arguments:
        query: `(B, T, D)`.
        value: `(B, S, Dv)`; defaults to `query` (self-attention).
        key: `(B, S, Dk)`; defaults to `value`.
        query_mask, value_mask, key_mask: boolean padding masks `(B, T)`,
            `(B, S)`, `(B, S)`, `True` = real token; filled in from Keras
            masks (`Embedding(mask_zero=True)`) when not given.
        attention_mask: boolean `(B, T, S)`, `True` = may attend.
        use_causal_mask: hide keys at later positions than the query.
        window: attend to at most the `window` most recent positions (an
            int or scalar int tensor), or `None`; intersected with the
            `pattern`. With a cache, the cache is a ring buffer (see above).
        memory: `(B, M, D)` states of the `M` positions before the queries
            (a previous segment), or `None`; prepended to `key` and `value`.
        memory_mask: boolean `(B, M)`, `True` = a memory slot holds a state
            (default: all do).
        cache: `(B, 2, slots, K, H)` KV cache, or `None`.
        cache_update_index: the absolute position of the first new token (an
            int or scalar int tensor); its keys/values go to that slot (to
            that slot modulo `slots` in a ring cache).
        return_attention_scores: also return the `(B, N, T, S)` weights.
        training: whether dropout is active.

    Returns:
        `(B, T, output_dim)`; `(outputs, cache)` when a cache is passed;
        `(outputs, weights)` with `return_attention_scores` and no cache.

    Example:

    >>> attention = MultiHeadAttention(num_heads=8, key_dim=64, num_key_value_heads=2,
    ...                                position=RotaryEmbedding())
    >>> x = keras.random.normal((2, 16, 512))
    >>> attention(x, use_causal_mask=True).shape
    (2, 16, 512)
    """

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
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim)
        value_dim = key_dim if value_dim is None else value_dim
        check_positive_int("value_dim", value_dim)
        num_key_value_heads = num_heads if num_key_value_heads is None else num_key_value_heads
        check_positive_int("num_key_value_heads", num_key_value_heads)
        if num_heads % num_key_value_heads:
            raise ValueError(
                "`num_heads` must be a multiple of `num_key_value_heads`. Received: "
                f"num_heads={num_heads}, num_key_value_heads={num_key_value_heads}"
            )
        if output_dim is not None:
            check_positive_int("output_dim", output_dim)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout}")
        if position is not None and not isinstance(position, AttentionPositionScheme):
            raise ValueError(
                "`position` must be an AttentionPositionScheme (RotaryEmbedding, "
                f"ALiBiBias, RelativePositionBias) or None. Received: position={position!r}"
            )
        position_heads = getattr(position, "num_heads", num_heads)
        if position_heads != num_heads:
            raise ValueError(
                f"`position` was built for {position_heads} heads but the attention has "
                f"num_heads={num_heads}"
            )
        pattern = get_pattern(pattern)
        if pattern is not None and num_heads % pattern.head_groups:
            raise ValueError(
                f"`pattern` has {pattern.head_groups} head groups, which must divide num_heads={num_heads}. "
                f"Received: pattern={pattern!r}"
            )
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
        self.output_kernel_initializer = keras.initializers.get(
            output_kernel_initializer or kernel_initializer
        )
        self.pattern = pattern
        self.qkv_bias = use_bias if qkv_bias is None else qkv_bias
        self.supports_masking = True

    def _dense(self, units, name, kernel_initializer=None, use_bias=None):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias if use_bias is None else use_bias,
            kernel_initializer=kernel_initializer or self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        if len(query_shape) != 3:
            raise ValueError(
                f"`query` must have rank 3 (batch, seq, dim). Received: query.shape={tuple(query_shape)}"
            )
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        kv_heads = self.num_key_value_heads
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query", use_bias=self.qkv_bias)
        self.query_dense.build(query_shape)
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

    def _split_heads(self, x, num_heads):
        """`(B, T, num_heads * H)` -> `(B, T, num_heads, H)`."""
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], num_heads, x.shape[-1] // num_heads))

    def _check_cache(self, cache):
        expected = (2, None, self.num_key_value_heads, self.key_dim)
        shape = tuple(cache.shape)
        if len(shape) != 5 or shape[1] != 2 or shape[3:] != expected[2:]:
            raise ValueError(
                "`cache` must have shape (batch, 2, max_length, num_key_value_heads="
                f"{self.num_key_value_heads}, key_dim={self.key_dim}). Received: cache.shape={shape}"
            )
        if self.value_dim != self.key_dim:
            raise ValueError(
                "A KV cache needs value_dim == key_dim. Received: "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}"
            )

    def _resolve_inputs(self, query, value, key, query_mask, value_mask, key_mask, cache):
        """`(value, key, query_mask, key_padding_mask)` with defaults and Keras masks filled in.

        Keras fills in `*_mask` arguments only for layers called with several
        tensors, so the Keras masks are read here, as Keras' own attention does.
        In self-attention without a cache the keys share the queries' padding.
        """
        query_mask = mask_ops.keras_mask(query) if query_mask is None else query_mask
        if value is None:
            value = query
            if value_mask is None and cache is None:
                value_mask = query_mask
        value_mask = mask_ops.keras_mask(value) if value_mask is None else value_mask
        key = value if key is None else key
        if key_mask is None and key is not value:
            key_mask = mask_ops.keras_mask(key)
        return value, key, query_mask, mask_ops.merge_masks(value_mask, key_mask)

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
    ):
        window = check_window(window)
        ring = self._ring_window(window)
        value, key, query_mask, key_padding_mask = self._resolve_inputs(
            query, value, key, query_mask, value_mask, key_mask, cache
        )
        memory_length = 0
        if memory is not None:
            if cache is not None:
                raise ValueError(
                    "`memory` and `cache` cannot be combined: a decoding model keeps its memory's states in its "
                    "cache, or passes them as `memory` without a KV cache."
                )
            value, key, key_padding_mask = self._prepend_memory(query, value, key, key_padding_mask, memory, memory_mask)
            memory_length = ops.shape(memory)[1]
        query_heads = self._split_heads(self.query_dense(query), self.num_heads)  # [B, T, N, H]
        if cache is not None:
            self._check_cache(cache)
        offset = 0 if cache_update_index is None else cache_update_index
        # A memory takes the M positions from `offset`; the queries follow it.
        query_offset = offset if memory is None else ops.add(offset, memory_length)
        query_positions = mask_ops.positions(ops.shape(query_heads)[1], query_offset)
        if cache is not None and cache_update_index is None:
            key_heads, value_heads = cache[:, 0], cache[:, 1]  # precomputed source
            key_positions = mask_ops.positions(ops.shape(key_heads)[1])
        else:
            key_heads = self._split_heads(self.key_dense(key), self.num_key_value_heads)  # [B, S, K, H]
            value_heads = self._split_heads(self.value_dense(value), self.num_key_value_heads)
            if self.position is not None:
                query_heads, key_heads = self.position.rotate_query_key(query_heads, key_heads, query_offset, offset)
            key_positions = mask_ops.positions(ops.shape(key_heads)[1], offset)
            if cache is not None:
                cache, key_heads, value_heads, key_positions = self._update_cache(
                    cache, key_heads, value_heads, cache_update_index, ring
                )
        query_length, key_length = static_dim(query_heads.shape[1]), static_dim(key_heads.shape[1])
        if self.pattern is not None and cache is None and query_length is not None:
            self.pattern.check_length(query_length)

        band = None
        if cache is None and attention_mask is None and not return_attention_scores and self._position_fits_band():
            band = self._band(query_length, key_length, use_causal_mask, window)
        blocks = None
        if use_causal_mask and cache is None and not return_attention_scores and band is None:
            blocks = _causal_query_blocks(query_length, key_length, attention_mask)
        if band is not None:
            outputs = banded_attention(
                query_heads,
                key_heads,
                value_heads,
                *band,
                query_mask=query_mask,
                key_mask=key_padding_mask,
                mask_fn=lambda q, k: self._position_rule(q, k, use_causal_mask, window),
                bias_fn=None if self.position is None else self.position.attention_bias,
                attend=lambda q, k, v, mask, bias: self._compute_attention(q, k, v, mask, bias, training, False)[0],
            )
        elif blocks:
            # Causal self-attention by blocks of queries, each over the keys up
            # to its last position: the score blocks above the diagonal, all
            # masked, are never computed (5/8 of the scores with 4 blocks).
            outputs = ops.concatenate(
                [
                    self._attend(
                        query_heads[:, start:stop],
                        key_heads[:, :stop],
                        value_heads[:, :stop],
                        query_mask=None if query_mask is None else query_mask[:, start:stop],
                        key_padding_mask=None if key_padding_mask is None else key_padding_mask[:, :stop],
                        attention_mask=_mask_block(attention_mask, start, stop),
                        query_positions=query_positions[start:stop],
                        key_positions=key_positions[:stop],
                        causal=True,
                        window=window,
                        training=training,
                    )[0]
                    for start, stop in blocks
                ],
                axis=1,
            )
            weights = None
        else:
            outputs, weights = self._attend(
                query_heads,
                key_heads,
                value_heads,
                query_mask=query_mask,
                key_padding_mask=key_padding_mask,
                attention_mask=attention_mask,
                query_positions=query_positions,
                key_positions=key_positions,
                causal=use_causal_mask,
                window=window,
                training=training,
                return_attention_scores=return_attention_scores,
            )
        shape = ops.shape(outputs)
        outputs = ops.reshape(outputs, (shape[0], shape[1], self.num_heads * self.value_dim))
        outputs = self.output_dense(outputs)
        if cache is not None:
            return outputs, cache
        if return_attention_scores:
            return outputs, weights
        return outputs

    def _prepend_memory(self, query, value, key, key_padding_mask, memory, memory_mask):
        """`(value, key, key_padding_mask)` with the memory's states and mask in front."""
        shape, width = tuple(memory.shape), (key.shape[-1], value.shape[-1])
        if len(shape) != 3 or shape[-1] != width[0] or width[0] != width[1]:
            raise ValueError(
                f"`memory` must have shape (batch, memory_length, {width[0]}): the width of the keys and values "
                f"it is prepended to. Received: memory.shape={shape}"
            )
        if shape[0] is not None and query.shape[0] is not None and shape[0] != query.shape[0]:
            raise ValueError(
                f"`memory` must have the batch size of the queries ({query.shape[0]}). Received: memory.shape={shape}"
            )
        memory = ops.cast(memory, key.dtype)
        if memory_mask is not None or key_padding_mask is not None:
            batch = ops.shape(memory)[0]
            memory_mask = ops.ones((batch, ops.shape(memory)[1]), "bool") if memory_mask is None else memory_mask
            keys_mask = ops.ones((batch, ops.shape(key)[1]), "bool") if key_padding_mask is None else key_padding_mask
            key_padding_mask = ops.concatenate([ops.cast(memory_mask, "bool"), ops.cast(keys_mask, "bool")], axis=1)
        same = value is key
        key = ops.concatenate([memory, key], axis=1)
        value = key if same else ops.concatenate([memory, value], axis=1)
        return value, key, key_padding_mask

    def _update_cache(self, cache, key_heads, value_heads, index, window):
        """Writes the new keys/values into `cache`.

        Returns `(cache, keys, values, key_positions)`: what the queries
        attend to, and the absolute position of each key (`-1`: empty slot).
        """
        update = ops.cast(ops.stack([key_heads, value_heads], axis=1), cache.dtype)  # [B, 2, T, K, H]
        new = static_dim(update.shape[2])
        slots = static_dim(cache.shape[2]) or ops.shape(cache)[2]
        known_index = static_int(index)
        self._check_cache_index(known_index, new, slots, window)
        fits = known_index is not None and new is not None and isinstance(slots, int) and known_index + new <= slots
        if window is None or new == 1 or fits:
            # Written in place, then attended (XLA reuses the cache's buffer
            # inside the decoding loop). One new position in a ring replaces
            # the one that just left the window.
            start = index
            if window is not None and not fits:
                start = known_index % slots if known_index is not None else ops.mod(index, slots)
            cache = ops.slice_update(cache, (0, 0, start, 0, 0), update)
            return cache, cache[:, 0], cache[:, 1], mask_ops.ring_positions(slots, ops.add(index, ops.shape(update)[2]))
        # Several new positions that may wrap around the ring: a later one
        # would overwrite a key an earlier query still sees, so the queries
        # attend to the old slots and the new keys side by side, and the ring
        # keeps the latest position of each slot.
        length = ops.shape(update)[2]
        keys = ops.concatenate([cache[:, 0], update[:, 0]], axis=1)
        values = ops.concatenate([cache[:, 1], update[:, 1]], axis=1)
        key_positions = ops.concatenate(
            [mask_ops.ring_positions(slots, index), mask_ops.positions(length, index)], axis=0
        )
        held = mask_ops.ring_positions(slots, ops.add(index, length))
        fresh = ops.greater_equal(held, index)
        taken = ops.take(update, ops.clip(held - index, 0, length - 1), axis=2)
        cache = ops.where(fresh[None, None, :, None, None], taken, cache)
        return cache, keys, values, key_positions

    def _check_cache_index(self, index, new, slots, window):
        """Errors for a `cache_update_index` known now that writes outside the cache."""
        if index is None:
            return
        if index < 0:
            raise ValueError(f"`cache_update_index` must be >= 0. Received: cache_update_index={index}")
        if new is None or not isinstance(slots, int) or index + new <= slots:
            return
        if window is None:
            raise ValueError(
                f"`cache_update_index` {index} with {new} new token(s) writes positions {index}..{index + new - 1}, "
                f"past the {slots} slots of `cache`. Grow the cache with `resize_cache`, or pass `window` to use it "
                f"as a sliding-window (ring) cache. Received: cache_update_index={index}"
            )
        known_window = static_int(window)
        if known_window is not None and slots < known_window:
            raise ValueError(
                f"A ring cache must hold the whole window once it wraps: {slots} slots for window={known_window}. "
                f"Received: cache_update_index={index} with {new} new token(s)"
            )

    def _attend(
        self, query, key, value, *, query_mask, key_padding_mask, attention_mask, query_positions, key_positions,
        causal, window, training, return_attention_scores=False,
    ):
        """Position bias and merged masks for `(B, T, N, H)` queries, then attention."""
        bias = None
        if self.position is not None:
            bias = self.position.score_bias(query, key, query_positions, key_positions, self.scale)
        position_rule = self._position_rule(query_positions, key_positions, causal, window)
        other = mask_ops.merge_masks(mask_ops.padding_to_attention_mask(query_mask, key_padding_mask), attention_mask)
        if other is not None and position_rule is not None and len(position_rule.shape) == 4:
            other = ops.expand_dims(other, 1)  # [B, 1, T, S] against a per-head rule
        mask = mask_ops.merge_masks(other, position_rule)
        if self.position is not None and self.position.acts_on_weights:
            dropout = self.dropout_layer if self.dropout else None
            return self.position.attend(
                query, key, value, query_positions, key_positions, mask, bias, self.scale, dropout, training
            )
        return self._compute_attention(query, key, value, mask, bias, training, return_attention_scores)

    def _position_rule(self, query_positions, key_positions, causal, window):
        """Causality, `window` and `pattern` as one mask from positions, or `None`.

        Positions `(T,)`, `(S,)` (or with leading block axes, `(nb, b)`);
        returns `(1, [nb,] T, S)`, or `(1, [nb,] N, T, S)` for a per-head
        pattern.
        """
        rule = None
        if causal or window is not None:
            rule = mask_ops.position_mask(query_positions, key_positions, causal=causal, window=window)
        if self.pattern is None:
            return rule
        allowed = self.pattern.mask(query_positions, key_positions)
        if self.pattern.head_groups > 1:
            allowed = ops.repeat(allowed, self.num_heads // self.pattern.head_groups, axis=-3)
            rule = None if rule is None else ops.expand_dims(rule, -3)
        allowed = ops.expand_dims(allowed, 0)
        return allowed if rule is None else ops.logical_and(rule, allowed)

    def _ring_window(self, window):
        """The positions a cache must keep: `window` and the pattern's `lookback`, the smaller; or `None`."""
        lookback = None if self.pattern is None else self.pattern.lookback
        if window is None or lookback is None:
            return lookback if window is None else window
        known = static_int(window)
        return min(known, lookback) if known is not None else ops.minimum(window, lookback)

    def _position_fits_band(self):
        """Whether the position scheme works per block of a band: rotations and position-only biases do;
        terms from the query or key content and changes of the weights need whole score rows."""
        position = self.position
        return position is None or not position.acts_on_weights and (
            type(position).score_terms is AttentionPositionScheme.score_terms
        )

    def _band(self, query_length, key_length, causal, window):
        """`(lookback, lookahead)` of banded self-attention over `query_length` positions, or `None`.

        Banded when both lengths are static and equal, and the allowed keys
        lie in a band (a static `window`, or a pattern's bounded extents)
        narrower than the sequence.
        """
        if query_length is None or query_length != key_length:
            return None
        if window is not None and static_int(window) is None:
            return None
        window = None if window is None else static_int(window)
        pattern = self.pattern
        backs = [x for x in (window, None if pattern is None else pattern.lookback) if x is not None]
        aheads = [0] if causal else [
            x for x in (None if window is None else window - 1, None if pattern is None else pattern.lookahead)
            if x is not None
        ]
        if not backs or not aheads:
            return None
        lookback, lookahead = min(backs), min(aheads)
        if query_length <= band_block_size(lookback, lookahead):
            return None
        return lookback, lookahead

    def init_cache(self, batch_size, max_length, dtype="float32", window=None):
        """An empty KV cache `(B, 2, slots, K, H)` for decoding `max_length` positions.

        `slots` is `max_length`, or with a `window` at most `window`: a ring
        that keeps only the positions a query can still see.
        """
        slots = max_length
        ring = self._ring_window(check_window(window))
        if ring is not None:
            both_known = isinstance(max_length, int) and isinstance(ring, int)
            slots = min(max_length, ring) if both_known else ops.minimum(max_length, ring)
        return ops.zeros((batch_size, 2, slots, self.num_key_value_heads, self.key_dim), dtype)

    def resize_cache(self, cache, max_length):
        """The cache grown to `max_length` positions (new positions empty).

        A ring cache may only grow before it wraps around. With a pattern of
        bounded `lookback` the cache never grows past `lookback` slots.
        """
        lookback = None if self.pattern is None else self.pattern.lookback
        slots = static_dim(cache.shape[2])
        if lookback is not None and isinstance(max_length, int):
            if slots is not None and slots >= min(max_length, lookback):
                return cache
            max_length = min(max_length, lookback)
        if isinstance(max_length, int) and slots is not None and max_length < slots:
            raise ValueError(
                "`resize_cache` only grows a cache. Received: max_length="
                f"{max_length} for a cache of {cache.shape[2]} positions"
            )
        grow = max_length - ops.shape(cache)[2]
        return ops.pad(cache, [[0, 0], [0, 0], [0, grow], [0, 0], [0, 0]])

    def compute_key_value_cache(self, key, value=None):
        """Projects a source once for cross-attention decoding.

        Args:
            key: `(B, S, Dk)`.
            value: `(B, S, Dv)`; defaults to `key`.

        Returns:
            `(B, 2, S, K, H)`, to pass as `cache` with no `cache_update_index`.
        """
        value = key if value is None else value
        key_heads = self._split_heads(self.key_dense(key), self.num_key_value_heads)
        value_heads = self._split_heads(self.value_dense(value), self.num_key_value_heads)
        return ops.stack([key_heads, value_heads], axis=1)

    def _compute_attention(
        self, query, key, value, attention_mask, bias, training, return_attention_scores
    ):
        """Attention of `(B, T, N, H)` queries over `(B, S, K, H)` keys/values.

        Returns `(outputs (B, T, N, Hv), weights or None)`.
        """
        if not (self.dropout and training) and not return_attention_scores:
            outputs = scaled_dot_product_attention(
                query, key, value, attention_mask, bias, self.scale
            )
            return outputs, None
        weights = attention_weights(query, key, attention_mask, bias, self.scale)
        dropped = self.dropout_layer(weights, training=training) if self.dropout else weights
        return apply_attention_weights(dropped, value), weights

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
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["position"] = keras.saving.deserialize_keras_object(config.get("position"))
        config["pattern"] = get_pattern(config.get("pattern"))
        return cls(**config)
