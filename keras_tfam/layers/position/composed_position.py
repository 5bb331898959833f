"""Several position schemes acting in one attention layer."""

import keras
from keras import ops

from keras_tfam.layers.position.attention_position_scheme import AttentionPositionScheme, HeadsPositionScheme


def _sum(terms):
    terms = [term for term in terms if term is not None]
    if not terms:
        return None
    total = terms[0]
    for term in terms[1:]:
        total = ops.add(total, term)
    return total


@keras.saving.register_keras_serializable(package="keras_tfam")
class ComposedPosition(HeadsPositionScheme):
    """Position schemes applied together: rotations and reweightings in order, biases and terms summed.

    So a scheme that encodes positions and one that limits how far heads
    look combine without a new class: `ComposedPosition([TransformerXLPosition(8),
    AdaptiveSpan(8, max_span=512)])` is Sukhbaatar et al.'s model, whose
    spans apply on top of Transformer-XL's relative positions.

    Args:
        schemes: a list of `AttentionPositionScheme`s.

    Call arguments:
        As `HeadsPositionScheme`.

    Returns:
        `(B, T, N, Hv)`.

    Examples:
        >>> position = ComposedPosition([TransformerXLPosition(4), AdaptiveSpan(4, max_span=64)])
        >>> attention = MultiHeadAttention(4, 32, position=position)
    """

    def __init__(self, schemes, **kwargs):
        super().__init__(**kwargs)
        schemes = list(schemes or [])
        if not schemes or not all(isinstance(scheme, AttentionPositionScheme) for scheme in schemes):
            raise ValueError(
                f"`schemes` must be a non-empty list of AttentionPositionSchemes. Received: schemes={schemes!r}"
            )
        heads = {scheme.num_heads for scheme in schemes if hasattr(scheme, "num_heads")}
        if len(heads) > 1:
            raise ValueError(f"The schemes were built for different numbers of heads: {sorted(heads)}")
        self.schemes = schemes
        if heads:
            self.num_heads = heads.pop()

    def spans(self):
        """The spans of the first scheme that has them, or `None`."""
        for scheme in self.schemes:
            spans = scheme.spans()
            if spans is not None:
                return spans
        return None

    def build(self, query_shape=None):
        for scheme in self.schemes:
            if not scheme.built:
                scheme.build(query_shape)
        self.built = True

    def rotate_query_key(self, query, key, query_offset=0, key_offset=0):
        for scheme in self.schemes:
            query, key = scheme.rotate_query_key(query, key, query_offset, key_offset)
        return query, key

    def attention_bias(self, query_positions, key_positions):
        return _sum(scheme.attention_bias(query_positions, key_positions) for scheme in self.schemes)

    def score_terms(self, query, key, query_positions, key_positions):
        return _sum(scheme.score_terms(query, key, query_positions, key_positions) for scheme in self.schemes)

    def reweight(self, weights, query_positions, key_positions):
        for scheme in self.schemes:
            weights = scheme.reweight(weights, query_positions, key_positions)
        return weights

    def value_terms(self, weights, query_positions, key_positions):
        return _sum(scheme.value_terms(weights, query_positions, key_positions) for scheme in self.schemes)

    @property
    def acts_on_weights(self):
        return any(scheme.acts_on_weights for scheme in self.schemes)

    @property
    def acts_on_scores(self):
        return any(scheme.acts_on_scores for scheme in self.schemes)

    def get_config(self):
        config = super().get_config()
        config.update(schemes=[keras.saving.serialize_keras_object(scheme) for scheme in self.schemes])
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["schemes"] = [keras.saving.deserialize_keras_object(scheme) for scheme in config["schemes"]]
        return cls(**config)
