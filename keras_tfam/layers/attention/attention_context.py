"""What an attention kernel is told besides its query, key and value heads."""

import dataclasses
from typing import Any, Optional

from keras import ops

from keras_tfam.ops import masks as mask_ops


@dataclasses.dataclass(frozen=True)
class AttentionContext:
    """The positions, masks and options of one attention call, as the kernel (`attend`) sees them.

    Built by `BaseAttention.call` after the projections, the position scheme
    and the cache write, so every kind reads the same facts in its full
    pass and when decoding: the absolute position of every query and key
    (a cache slot not written yet holds `-1`), the padding, the rules
    (causality, window, pattern) and the running state of a recurrent cache.

    Attributes:
        query_positions: `(T,)` int32 absolute positions of the queries.
        key_positions: `(S,)` int32 absolute positions of the keys.
        query_mask: `(B, T)` boolean padding of the queries, or `None`.
        key_mask: `(B, S)` boolean padding of the keys (memory included), or `None`.
        attention_mask: the caller's boolean `(B, T, S)` mask, or `None`.
        causal: hide keys after each query.
        window: attend to the `window` most recent positions, or `None`.
        pattern: an `AttentionPattern`, or `None`.
        num_heads: query heads `N`.
        cached: the keys come from a decoding cache (written this call).
        state: the recurrent state the kernel continues from (a
            `RecurrentStateCache`'s), or `None`.
        memory_length: positions of a prepended `memory` (the first keys).
        training: whether dropout is active.
        return_attention_scores: the caller wants the `(B, N, T, S)` weights.
        inputs: the layer's own inputs `{"query": (B, T, D), "key": (B, S, D),
            "value": ...}` and `"query_heads"`, `"key_heads"`: the heads before
            the position scheme (kinds that read the raw inputs: gates, retrieval).
        options: the kind's own call inputs (`BaseAttention.call_inputs`).
    """

    query_positions: Any
    key_positions: Any
    query_mask: Any = None
    key_mask: Any = None
    attention_mask: Any = None
    causal: bool = False
    window: Any = None
    pattern: Any = None
    num_heads: Optional[int] = None
    cached: bool = False
    state: Any = None
    memory_length: Any = 0
    training: Any = None
    return_attention_scores: bool = False
    inputs: Any = None
    options: Any = None

    def rule(self, query_positions=None, key_positions=None):
        """Causality, window and pattern as a mask on (these, or the call's) positions, or `None`.

        A cache's empty slots (position `-1`) are never attended.
        """
        key_positions = self.key_positions if key_positions is None else key_positions
        rule = mask_ops.position_rule(
            self.query_positions if query_positions is None else query_positions,
            key_positions,
            causal=self.causal,
            window=self.window,
            pattern=self.pattern,
            num_heads=self.num_heads,
        )
        if rule is None and self.cached:
            rule = ops.greater_equal(ops.cast(key_positions, "int32"), 0)[None, None, :]
        return rule

    def mask(self):
        """Every mask of the call merged: padding, `attention_mask` and the rule; `None` when nothing is masked."""
        padding = mask_ops.padding_to_attention_mask(self.query_mask, self.key_mask)
        return mask_ops.attention_rule_mask(padding, self.attention_mask, self.rule())

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def query_block(self, start, stop):
        """The context of queries `start:stop` over keys `:stop` (causal self-attention by query blocks)."""
        attention_mask = self.attention_mask
        if attention_mask is not None:
            if attention_mask.shape[-2] != 1:
                attention_mask = attention_mask[..., start:stop, :]
            if attention_mask.shape[-1] != 1:
                attention_mask = attention_mask[..., :stop]
        return self.replace(
            query_positions=self.query_positions[start:stop],
            key_positions=self.key_positions[:stop],
            query_mask=None if self.query_mask is None else self.query_mask[:, start:stop],
            key_mask=None if self.key_mask is None else self.key_mask[:, :stop],
            attention_mask=attention_mask,
            return_attention_scores=False,
        )
