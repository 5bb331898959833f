"""Multi-head softmax attention with grouped key/value heads, position schemes and a KV cache."""

import keras
from keras import ops

from keras_tfam.layers.attention.attention_kernels import SOFTMAX_KERNELS, choose_kernel
from keras_tfam.layers.attention.base_attention import BaseAttention
from keras_tfam.layers.attention.registry import register_attention
from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme
from keras_tfam.ops.attention import (
    apply_attention_weights,
    attention_weights,
    flash_attention_fits,
    flash_causal_attention,
    scaled_dot_product_attention,
)
from keras_tfam.ops.banded import band_block_size, banded_attention
from keras_tfam.utils import static_dim, static_int

# "auto" runs causal self-attention over at least this many positions in query blocks.
_CAUSAL_BLOCK_MIN_LENGTH = 128
_CAUSAL_BLOCKS = 4


def _causal_query_blocks(length):
    """`[(start, stop), ...]`: `_CAUSAL_BLOCKS` blocks of queries (fewer for fewer positions)."""
    count = min(_CAUSAL_BLOCKS, length)
    bounds = [length * i // count for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _first(*checks):
    """The reason of the first check `(holds, reason)` that does not hold, or `None`: why a kernel cannot run."""
    return next((reason for holds, reason in checks if not holds), None)


@register_attention("softmax")
@keras.saving.register_keras_serializable(package="keras_tfam")
class MultiHeadAttention(BaseAttention):
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
    masks; when the allowed keys lie in a band around the query (a
    `window`, or a pattern with a bounded `lookback` and `lookahead`), the
    banded kernel computes `O(T * window)` scores instead of `O(T^2)`. A
    pattern with a bounded `lookback` makes every cache a ring of
    `lookback` slots, as a `window` does.

    A `memory` (Transformer-XL's segment recurrence, Dai et al. 2019) holds
    the states of the `M` positions before the queries: its keys and values
    are prepended to the others, so every query may attend to it, and a
    position scheme sees the distances across it (the memory takes
    positions `0 .. M - 1`, the queries and their keys follow from `M`).
    The caller stops its gradient.

    The kernel is a named choice (`attention_kernel`, as Keras'
    `flash_attention` and transformers' `attn_implementation`; see
    `keras_tfam.layers.attention.attention_kernels`): `"dense"` (every
    call), `"query_blocks"` (causal self-attention, the score blocks above
    the diagonal skipped), `"banded"` (the allowed keys in a band) or
    `"flash"` (one fused kernel, on JAX on a GPU with 16-bit heads: plain
    causal self-attention without padding, window, pattern, score bias or
    active dropout). An explicit kernel runs every call it can compute and
    refuses the others in one `ValueError`; `"auto"` runs banded when the
    band is narrower than the sequence, else flash, else query blocks for
    causal self-attention over 128 positions or more, else dense.

    The pipeline (projections, position scheme, cache, merge) is
    `BaseAttention`'s; this class is its softmax kernel (`attend`). Kinds
    that keep its masks, bands and caches but change the scores' kernel
    (linear attention's windowed form) override `_compute_attention`, and
    declare the named kernels that run it (`attention_kernels`; never
    `"flash"`, which does not).

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
        attention_kernel: `"auto"`, `"dense"`, `"query_blocks"`,
            `"banded"` or `"flash"` (above).

    Call arguments:
        query: `(B, T, D)`.
        value: `(B, S, Dv)`; defaults to `query` (self-attention).
        key: `(B, S, Dk)`; defaults to `value`.
        query_mask, value_mask, key_mask: boolean padding masks `(B, T)`,
            `(B, S)`, `(B, S)`, `True` = real token; filled in from Keras
            masks (`Embedding(mask_zero=True)`) when not given.
        attention_mask: boolean `(B, T, S)`, `True` = may attend (an axis
            of 1 broadcasts). Masks may be 0/1 integers too; a float mask is
            refused, not read as additive (`0` keep, `-1e9` drop) nor as
            booleans: pass `additive_mask == 0`. A mask of another shape is
            refused naming it (`attention_inputs.check_mask`).
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

    Examples:
        >>> attention = MultiHeadAttention(num_heads=8, key_dim=64, num_key_value_heads=2,
        ...                                position=RotaryEmbedding())
        >>> x = keras.random.normal((2, 16, 512))
        >>> attention(x, use_causal_mask=True).shape
        (2, 16, 512)
        >>> local = MultiHeadAttention(num_heads=8, key_dim=64, attention_kernel="banded")
        >>> local(x, use_causal_mask=True, window=4).shape  # without a window or pattern: a ValueError
        (2, 16, 512)
    """

    attention_kernels = SOFTMAX_KERNELS

    def attend(self, query, key, value, context):
        """Softmax attention by the kernel `kernel_for` names: banded, flash, query blocks or dense."""
        query_length = static_dim(query.shape[1])
        if self.pattern is not None and not context.cached and query_length is not None:
            self.pattern.check_length(query_length)
        kernel = self.kernel_for(query, key, context)
        if kernel == "banded":
            outputs = banded_attention(
                query,
                key,
                value,
                *self._band(context.causal, context.window),
                query_mask=context.query_mask,
                key_mask=context.key_mask,
                mask_fn=context.rule,
                bias_fn=None if self.position is None else self.position.attention_bias,
                attend=lambda q, k, v, mask, bias: self._compute_attention(
                    q, k, v, mask, bias, context.training, False
                )[0],
            )
            return outputs, None, None
        if kernel == "flash":
            return flash_causal_attention(query, key, value, self.scale), None, None
        if kernel == "query_blocks":
            # Each block of queries over the keys up to its last position: the score blocks above the
            # diagonal, all masked, are never computed (5/8 of the scores with 4 blocks).
            outputs = ops.concatenate(
                [
                    self._dense_attention(
                        query[:, start:stop], key[:, :stop], value[:, :stop], context.query_block(start, stop)
                    )[0]
                    for start, stop in _causal_query_blocks(query_length)
                ],
                axis=1,
            )
            return outputs, None, None
        outputs, weights = self._dense_attention(query, key, value, context)
        return outputs, weights, None

    def kernel_for(self, query, key, context):
        """The name of the kernel this call runs (`attention_kernels.choose_kernel`).

        `"auto"` prefers, where they can compute the call: banded when the
        band is narrower than the sequence, flash, query blocks from
        `_CAUSAL_BLOCK_MIN_LENGTH` positions on; else dense.
        """
        refusals = self._kernel_refusals(query, key, context)
        preferred = []
        length = static_dim(query.shape[1])
        if refusals.get("banded", "") is None and length > band_block_size(*self._band(context.causal, context.window)):
            preferred.append("banded")  # narrower than the sequence
        preferred.append("flash")
        if length is not None and length >= _CAUSAL_BLOCK_MIN_LENGTH:
            preferred.append("query_blocks")
        return choose_kernel(self, refusals, preferred)

    def _kernel_refusals(self, query, key, context):
        """`{kernel: None}` for each declared kernel that can compute this call, `{kernel: why not}` for the others."""
        query_length, key_length = static_dim(query.shape[1]), static_dim(key.shape[1])
        mask = context.attention_mask
        blocks = (  # what query blocks, the band and flash all need
            (not context.cached, "a cache is given"),
            (not context.return_attention_scores, "return_attention_scores=True"),
            (
                query_length is not None and query_length == key_length,
                "it needs static, equal query and key lengths: self-attention without a memory",
            ),
        )
        plain = blocks + ((mask is None, "an attention_mask is given"),)
        refusals = {
            "dense": None,
            "query_blocks": _first(
                *blocks,
                (context.causal, "use_causal_mask=False"),
                (
                    mask is None or (mask.shape[-2] in (1, query_length) and mask.shape[-1] in (1, key_length)),
                    "the attention_mask's last two axes are not static",
                ),
            ),
            "banded": _first(
                *plain,
                (self._position_fits_band(), "the position scheme needs whole score rows"),
                (
                    self._band(context.causal, context.window) is not None,
                    "it needs a static window, or a pattern with a bounded lookback and lookahead",
                ),
            ),
            "flash": _first(
                *plain,
                (context.causal, "use_causal_mask=False"),
                (context.query_mask is None and context.key_mask is None, "a padding mask is given"),
                (context.window is None, "a window is given"),
                (self.pattern is None, "the layer has a pattern"),
                (self.position is None or not self.position.acts_on_scores, "the position scheme changes the scores"),
                (not (self.dropout and context.training), "dropout is active"),
                (
                    flash_attention_fits(query, key),
                    "no fused kernel here; flash_attention_fits needs JAX on a GPU and 16-bit heads",
                ),
            ),
        }
        return {name: refusals[name] for name in self.attention_kernels}

    def _dense_attention(self, query, key, value, context):
        """Position bias and the merged mask, then attention: `(outputs, weights or None)`."""
        bias = None
        if self.position is not None:
            bias = self.position.score_bias(query, key, context.query_positions, context.key_positions, self.scale)
        mask = context.mask()
        if self.position is not None and self.position.acts_on_weights:
            dropout = self.dropout_layer if self.dropout else None
            return self.position.attend(
                query,
                key,
                value,
                context.query_positions,
                context.key_positions,
                mask,
                bias,
                self.scale,
                dropout,
                context.training,
            )
        return self._compute_attention(query, key, value, mask, bias, context.training, context.return_attention_scores)

    def _position_fits_band(self):
        """Whether the position scheme works per block of a band: rotations and position-only biases do;
        terms from the query or key content and changes of the weights need whole score rows."""
        position = self.position
        return (
            position is None
            or not position.acts_on_weights
            and (type(position).score_terms is AttentionPositionScheme.score_terms)
        )

    def _band(self, causal, window):
        """`(lookback, lookahead)` of the band the allowed keys lie in (a static `window`, a pattern's bounded
        extents), or `None`."""
        if window is not None and static_int(window) is None:
            return None
        window = None if window is None else static_int(window)
        pattern = self.pattern
        backs = [x for x in (window, None if pattern is None else pattern.lookback) if x is not None]
        aheads = (
            [0]
            if causal
            else [
                x
                for x in (None if window is None else window - 1, None if pattern is None else pattern.lookahead)
                if x is not None
            ]
        )
        if not backs or not aheads:
            return None
        return min(backs), min(aheads)

    def _compute_attention(self, query, key, value, attention_mask, bias, training, return_attention_scores):
        """Attention of `(B, T, N, H)` queries over `(B, S, K, H)` keys/values under a dense mask.

        Returns `(outputs (B, T, N, Hv), weights or None)`.
        """
        if not (self.dropout and training) and not return_attention_scores:
            outputs = scaled_dot_product_attention(query, key, value, attention_mask, bias, self.scale)
            return outputs, None
        weights = attention_weights(query, key, attention_mask, bias, self.scale)
        dropped = self.dropout_layer(weights, training=training) if self.dropout else weights
        return apply_attention_weights(dropped, value), weights
