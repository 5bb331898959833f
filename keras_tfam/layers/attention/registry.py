"""Attention layers by name: the one list a model's `attention` option, and the CLI, read.

A new kind of attention is a new file plus one entry here; a model builds
it with `make_attention` and never branches on the name.
"""

from keras_tfam.layers.attention.linear_attention import LinearAttention
from keras_tfam.layers.attention.lsh_attention import LSHAttention
from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.performer_attention import PerformerAttention
from keras_tfam.layers.attention.random_feature_attention import RandomFeatureAttention
from keras_tfam.layers.attention.routing_attention import RoutingAttention

# Causal kinds, usable in decoder models (LinformerAttention is not causal: not here).
ATTENTIONS = {
    "softmax": MultiHeadAttention,
    "linear": LinearAttention,
    "performer": PerformerAttention,
    "rfa": RandomFeatureAttention,
    "lsh": LSHAttention,
    "routing": RoutingAttention,
}


def get_attention_class(name):
    """The layer class registered as `name`; a `ValueError` naming it otherwise."""
    if name not in ATTENTIONS:
        raise ValueError(f"`attention` must be one of {tuple(ATTENTIONS)}. Received: attention={name!r}")
    return ATTENTIONS[name]


def make_attention(kind, num_heads, key_dim, options=None, **layer_arguments):
    """An attention layer of kind `kind`.

    Args:
        kind: a key of `ATTENTIONS`.
        num_heads, key_dim: its heads.
        options: the kind's own arguments (e.g. `{"feature_map": "exp"}`
            for `"linear"`), as given by a user.
        **layer_arguments: what the model sets for every kind (initializers,
            `position`, `dtype`, `name`, ...). A kind without attention
            weights (`has_attention_weights = False`) ignores `dropout`.
    """
    options = dict(options or {})
    cls = get_attention_class(kind)
    if not getattr(cls, "has_attention_weights", True):
        layer_arguments.pop("dropout", None)
    clash = sorted(set(options) & (set(layer_arguments) | {"num_heads", "key_dim"}))
    if clash:
        raise ValueError(
            f"`attention_options` cannot set what the model sets itself: {clash}. Received: attention_options={options}"
        )
    return cls(num_heads, key_dim, **layer_arguments, **options)
