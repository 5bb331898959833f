"""Transformer-XL's relative positional encoding (Dai et al. 2019)."""

import keras
from keras import ops

from keras_tfam.layers.position.attention_position_scheme import HeadsPositionScheme
from keras_tfam.ops.masks import relative_distance
from keras_tfam.ops.relative_shift import relative_shift
from keras_tfam.utils import check_positive_int


def sinusoid_encoding(distances, dim, max_wavelength=10000.0):
    """Transformer-XL's `R`: `[sin(d / w^(2i/dim)), cos(d / w^(2i/dim))]` per distance `d`, sines first.

    Args:
        distances: `(L,)` numbers.
        dim: even size of each encoding.

    Returns:
        float32 `(L, dim)`.
    """
    inverse = ops.power(float(max_wavelength), -ops.cast(ops.arange(0, dim, 2), "float32") / dim)
    angles = ops.cast(distances, "float32")[:, None] * inverse[None, :]
    return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)


def _contiguous(values):
    """Whether `(L,)` ints are `values[0], values[0] + 1, ...`."""
    return ops.all(ops.equal(values, values[0] + ops.arange(ops.shape(values)[0], dtype=values.dtype)))


@keras.saving.register_keras_serializable(package="keras_tfam")
class TransformerXLPosition(HeadsPositionScheme):
    """Transformer-XL's relative positions: global biases `u`, `v` and sinusoidal distances `R`.

    Implements Dai et al. 2019 ("Transformer-XL", section 3.3): the score of
    a query at position `i` and a key at `j` is the sum of four terms,

        A_ij = q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j}
               (a) content  (b) position  (c) global content bias  (d) global position bias

    with `R` the sinusoid of the distance (no learned table, so it
    extends to distances never trained on), `W_R` a learned projection per
    layer and `u`, `v` learned per head. The attention computes (a); the
    scheme adds (b) + (c) + (d) through the `score_terms` hook, before the
    attention's `1 / sqrt(H)` scale. Term (b) + (d) is computed for each
    distance once per query, `(q_i + v) . W_R R_d`, and then moved to its
    keys by the paper's relative shift when the queries and the keys are
    consecutive positions (a full pass, a segment with its memory), else by
    a gather of each pair's distance (the slots of a KV cache).

    Every pair gets the term of its own signed distance `i - j` (the
    sinusoid of a negative distance for a key after its query), so a
    non-causal call computes the same on both paths.

    Args:
        num_heads: attention heads `N`.
        key_dim: size `H` of the heads; defaults to the query heads' size
            (known when the attention builds the scheme).
        encoding_dim: size of `R`; defaults to `N * H` (the model width, as
            the paper).
        max_wavelength: the base of the sinusoids (10000).
        kernel_initializer: initializer of `W_R`.
        bias_initializer: initializer of `u` and `v`.

    Call arguments:
        query: `(B, T, N, H)` query heads.
        key: `(B, S, N, H)` key heads.
        value: `(B, S, N, Hv)` value heads.
        attention_mask: boolean `(B, T, S)` or `None`.
        query_offset: absolute position of the first query.
        key_offset: absolute position of the first key.

    Returns:
        `(B, T, N, Hv)`: the relative attention (the scheme as a layer;
        inside `MultiHeadAttention` it adds its terms through the hook).

    Examples:
        >>> attention = MultiHeadAttention(4, 8, position=TransformerXLPosition(4))
        >>> previous_segment, x = keras.random.normal((2, 2, 6, 32))
        >>> attention(x, memory=previous_segment, use_causal_mask=True).shape
        (2, 6, 32)
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        encoding_dim=None,
        max_wavelength=10000,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        if key_dim is not None:
            check_positive_int("key_dim", key_dim)
        if encoding_dim is not None:
            check_positive_int("encoding_dim", encoding_dim)
            if encoding_dim % 2:
                raise ValueError(
                    f"`encoding_dim` must be even (sines and cosines). Received: encoding_dim={encoding_dim}"
                )
        if max_wavelength <= 1:
            raise ValueError(f"`max_wavelength` must be greater than 1. Received: max_wavelength={max_wavelength}")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.encoding_dim = encoding_dim
        self.max_wavelength = max_wavelength
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, query_shape=None):
        key_dim = self._heads_key_dim(query_shape)
        width = self.num_heads * key_dim
        self.encoding_dim = self.encoding_dim or width + width % 2
        self.content_bias = self.add_weight(
            name="content_bias", shape=(self.num_heads, key_dim), initializer=self.bias_initializer
        )  # u
        self.position_bias = self.add_weight(
            name="position_bias", shape=(self.num_heads, key_dim), initializer=self.bias_initializer
        )  # v
        self.position_kernel = self.add_weight(
            name="position_kernel", shape=(self.encoding_dim, width), initializer=self.kernel_initializer
        )  # W_{k,R}
        self.built = True

    def projected_encoding(self, distances):
        """`W_R R_d` for each distance: float32 `(L, N, H)`."""
        encoding = sinusoid_encoding(distances, self.encoding_dim, self.max_wavelength)
        projected = ops.matmul(encoding, ops.cast(self.position_kernel, "float32"))
        return ops.reshape(projected, (ops.shape(projected)[0], self.num_heads, self.key_dim))

    def _position_scores(self, query, distances):
        """`(q_i + v) . W_R R_d` for every query and each of the `(L,)` distances: `(B, N, T, L)`."""
        shifted = query + ops.cast(self.position_bias, "float32")
        return ops.einsum("btnh,lnh->bntl", shifted, self.projected_encoding(distances))

    def score_terms(self, query, key, query_positions, key_positions):
        query = ops.cast(query, "float32")
        key = ops.cast(key, "float32")
        # (c) u . k_j, the key heads shared by groups of query heads.
        kv_heads = key.shape[2]
        content_bias = ops.reshape(
            ops.cast(self.content_bias, "float32"), (kv_heads, self.num_heads // kv_heads, self.key_dim)
        )
        content = ops.einsum("kgh,bskh->bkgs", content_bias, key)
        shape = ops.shape(content)
        content = ops.reshape(content, (shape[0], self.num_heads, 1, shape[3]))
        # (b) + (d).
        query_positions = ops.cast(query_positions, "int32")
        key_positions = ops.cast(key_positions, "int32")
        keys = ops.shape(key_positions)[0]

        queries = ops.shape(query_positions)[0]

        def shifted():
            # Distances from the last query to the first key, descending over S + T - 1 entries (down to the
            # first query's distance to the last key), then the shift: every pair gets its own distance,
            # keys after their query included (a non-causal call).
            first = query_positions[-1] - key_positions[0]
            scores = self._position_scores(query, first - ops.arange(keys + queries - 1, dtype="int32"))
            return relative_shift(scores)[..., :keys]

        def gathered():
            # Signed distances -(T - 1) .. S - 1: keys after a query (a non-causal call, a prefill) too.
            distance = ops.clip(relative_distance(query_positions, key_positions) + queries - 1, 0, keys + queries - 2)
            table = self._position_scores(query, ops.arange(keys + queries - 1, dtype="int32") - (queries - 1))
            index = ops.broadcast_to(distance[None, None], (*ops.shape(table)[:3], keys))
            return ops.take_along_axis(table, index, axis=-1)

        if query.shape[1] == 1:  # one query: its distances are the keys' own
            position = gathered()
        else:
            consecutive = ops.logical_and(_contiguous(query_positions), _contiguous(key_positions))
            consecutive = ops.logical_and(consecutive, query_positions[-1] <= key_positions[-1])
            position = ops.cond(consecutive, shifted, gathered)
        return content + position

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            encoding_dim=self.encoding_dim,
            max_wavelength=self.max_wavelength,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config
