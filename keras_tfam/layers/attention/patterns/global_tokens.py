"""Global tokens attention pattern (Longformer, ETC)."""

import keras
from keras import ops

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern
from keras_tfam.layers.attention.patterns.registry import register_pattern
from keras_tfam.utils import check_positive_int


@register_pattern("global_tokens")
@keras.saving.register_keras_serializable(package="keras_tfam")
class GlobalTokens(AttentionPattern):
    """The first `num_tokens` positions attend to all keys and are attended by all queries.

    Global attention of Longformer (Beltagy et al. 2020, section 3.1: a few
    preselected positions such as `[CLS]`) and the global-local attention
    of ETC (Ainslie et al. 2020). On its own it links every pair through
    a global token in two hops; combined with a window it is Longformer's
    pattern: `UnionPattern([SlidingWindow(w), GlobalTokens(g)])`. Computed
    as a dense mask.

    Args:
        num_tokens: how many leading positions are global (positive int).

    Examples:
        >>> pattern = UnionPattern([SlidingWindow(256), GlobalTokens(1)])  # Longformer with [CLS] global
    """

    def __init__(self, num_tokens=1):
        self.num_tokens = check_positive_int("num_tokens", num_tokens)

    def _allowed(self, i, j):
        return ops.logical_or(ops.less(i, self.num_tokens), ops.less(j, self.num_tokens))

    def get_config(self):
        return {"num_tokens": self.num_tokens}
