"""Relative position representations (Shaw et al. 2018)."""

import keras
from keras import ops

from keras_tfam.layers.position.attention_position_scheme import HeadsPositionScheme
from keras_tfam.ops.masks import relative_distance
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class ShawRelativePosition(HeadsPositionScheme):
    """Learned vectors for clipped relative distances, added to the keys and the values.

    Implements Shaw et al. 2018 ("Self-Attention with Relative Position
    Representations", eqs. 3-5): for a query at position `i` and a key at
    `j`, with `a^K_ij = w^K_clip(j - i, k)` and `a^V_ij = w^V_clip(j - i, k)`,

        e_ij = q_i . (k_j + a^K_ij) / sqrt(d)
        z_i  = sum_j alpha_ij (v_j + a^V_ij)

    where `clip(x, k) = max(-k, min(k, x))`: distances beyond `k` share the
    vectors of `+-k`. As in the paper the `2k + 1` vectors of each table are
    shared by the heads. In the position-scheme protocol the key term is a
    `score_terms` hook (it depends on the query) and the value term a
    `value_terms` hook, so attention computes its weights explicitly.

    Args:
        max_distance: the clipping distance `k` (the paper: 16, or 8 in the
            base model; anything from 2 on worked as well).
        key_dim: size of the `w^K` vectors; defaults to the key heads' size
            (known when the attention builds the scheme).
        value_dim: size of the `w^V` vectors; defaults to `key_dim`.
        use_value_term: add the `a^V` term to the values (eq. 3); `False`
            keeps the key term only.
        embeddings_initializer: initializer of the two `(2k + 1, H)` tables.

    Call arguments:
        query: `(B, T, N, H)` query heads.
        key: `(B, S, K, H)` key heads.
        value: `(B, S, K, Hv)` value heads.
        attention_mask: boolean `(B, T, S)`, `True` = may attend, or `None`.
        query_offset: absolute position of the first query.
        key_offset: absolute position of the first key.

    Returns:
        `(B, T, N, Hv)`: the attention of eqs. 3-4 (the scheme as a layer;
        inside `MultiHeadAttention` it adds its terms through the hooks).

    Examples:
        >>> attention = MultiHeadAttention(8, 64, position=ShawRelativePosition(max_distance=16))
        >>> attention(keras.random.normal((2, 32, 512)), use_causal_mask=True).shape
        (2, 32, 512)
    """

    def __init__(
        self,
        max_distance=16,
        key_dim=None,
        value_dim=None,
        use_value_term=True,
        embeddings_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("max_distance", max_distance)
        if key_dim is not None:
            check_positive_int("key_dim", key_dim)
        if value_dim is not None:
            check_positive_int("value_dim", value_dim)
        self.max_distance = max_distance
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.use_value_term = use_value_term
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, query_shape=None):
        key_dim = self._heads_key_dim(query_shape)
        self.value_dim = self.value_dim or key_dim
        size = 2 * self.max_distance + 1
        self.key_embeddings = self.add_weight(
            name="key_embeddings", shape=(size, key_dim), initializer=self.embeddings_initializer
        )
        self.value_embeddings = None
        if self.use_value_term:
            self.value_embeddings = self.add_weight(
                name="value_embeddings", shape=(size, self.value_dim), initializer=self.embeddings_initializer
            )
        self.built = True

    def _clipped_index(self, query_positions, key_positions):
        """`(T, S)` int32 row of the tables for each pair: `clip(j - i, k) + k`."""
        distance = -relative_distance(query_positions, key_positions)  # j - i
        return ops.clip(distance, -self.max_distance, self.max_distance) + self.max_distance

    def score_terms(self, query, key, query_positions, key_positions):
        # q_i . w^K_r for every table row r, then the row of each pair.
        table = ops.cast(self.key_embeddings, "float32")
        products = ops.einsum("btnh,rh->bntr", ops.cast(query, "float32"), table)  # [B, N, T, 2k+1]
        index = self._clipped_index(query_positions, key_positions)
        shape = ops.shape(products)
        index = ops.broadcast_to(index[None, None], (shape[0], shape[1], shape[2], ops.shape(index)[1]))
        return ops.take_along_axis(products, index, axis=-1)  # [B, N, T, S]

    def value_terms(self, weights, query_positions, key_positions):
        if self.value_embeddings is None:
            return None
        # sum_j alpha_ij w^V_clip(j-i): the weights summed per table row, then the rows.
        index = self._clipped_index(query_positions, key_positions)
        rows = ops.one_hot(index, 2 * self.max_distance + 1, dtype="float32")  # [T, S, 2k+1]
        per_row = ops.einsum("bnts,tsr->btnr", ops.cast(weights, "float32"), rows)
        return ops.einsum("btnr,rh->btnh", per_row, ops.cast(self.value_embeddings, "float32"))

    @property
    def acts_on_weights(self):
        return self.use_value_term

    def get_config(self):
        config = super().get_config()
        config.update(
            max_distance=self.max_distance,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            use_value_term=self.use_value_term,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config
