"""Functions: the attention core and the attention masks."""

from keras_tfam.ops.attention import (
    apply_attention_weights,
    attention_weights,
    flash_attention_fits,
    flash_causal_attention,
    scaled_dot_product_attention,
)
from keras_tfam.ops.banded import banded_attention
from keras_tfam.ops.masks import (
    causal_mask,
    merge_masks,
    padding_to_attention_mask,
    position_mask,
    positions,
    relative_distance,
    ring_positions,
    sliding_window_mask,
)
from keras_tfam.ops.relative_shift import relative_shift

__all__ = [
    "apply_attention_weights",
    "attention_weights",
    "banded_attention",
    "causal_mask",
    "flash_attention_fits",
    "flash_causal_attention",
    "merge_masks",
    "padding_to_attention_mask",
    "position_mask",
    "positions",
    "relative_distance",
    "relative_shift",
    "ring_positions",
    "scaled_dot_product_attention",
    "sliding_window_mask",
]
