"""Union of attention patterns: one merged head (Child et al. 2019)."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.pattern_combination import PatternCombination
from keras_tfam.layers.attention.patterns.registry import register_pattern


@register_pattern("union")
@keras.saving.register_keras_serializable(package="keras_tfam")
class UnionPattern(PatternCombination):
    """A query attends to a key when any of the `patterns` allows it.

    The Sparse Transformer's "merged head" (Child et al. 2019, section 4.3:
    one head attends to the union of the subsets), Longformer's window plus
    global tokens, or any other combination.

    Args:
        patterns: a non-empty list of `AttentionPattern`s (or their configs).

    Examples:
        >>> longformer = UnionPattern([SlidingWindow(512), GlobalTokens(1)])
    """

    def __init__(self, patterns):
        super().__init__(patterns)
        groups = {pattern.head_groups for pattern in self.patterns} - {1}
        if len(groups) > 1:
            raise ValueError(
                "Per-head patterns in a union must have the same number of head groups. Received: "
                f"head groups {sorted(groups)}"
            )
        self.head_groups = groups.pop() if groups else 1

    def mask(self, query_positions, key_positions):
        masks = [pattern.mask(query_positions, key_positions) for pattern in self.patterns]
        if self.head_groups > 1:
            # Masks of all heads alike get the head axis of the per-head ones.
            rank = len(ops.shape(query_positions)) + 1
            masks = [mask if len(mask.shape) > rank else ops.expand_dims(mask, -3) for mask in masks]
        merged = masks[0]
        for mask in masks[1:]:
            merged = ops.logical_or(merged, mask)
        return merged
