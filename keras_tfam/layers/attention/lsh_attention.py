"""LSH attention (Kitaev et al. 2020, Reformer)."""

import keras
from keras import ops

from keras_tfam.layers.attention.bucketed_attention import BucketedAttention
from keras_tfam.layers.attention.registry import register_attention
from keras_tfam.layers.attention.seeded_draws import SeededDraws
from keras_tfam.utils import check_positive_int


def lsh_buckets(x, rotations):
    """Angular LSH: `h(x) = argmax([x R ; -x R])` for each random rotation (Kitaev et al. 2020, section 2).

    Args:
        x: `(..., H)`.
        rotations: `(R, H, b / 2)`, one random matrix per hash round.

    Returns:
        `(..., R)` int32 buckets in `[0, b)`.
    """
    rotated = ops.einsum("...h,rhb->...rb", ops.cast(x, "float32"), rotations)
    return ops.cast(ops.argmax(ops.concatenate([rotated, -rotated], axis=-1), axis=-1), "int32")


@register_attention("lsh")
@keras.saving.register_keras_serializable(package="keras_tfam")
class LSHAttention(SeededDraws, BucketedAttention):
    """Self-attention within locality-sensitive hash buckets (Reformer).

    Kitaev et al. 2020 ("Reformer: The Efficient Transformer"), section 2:
    queries and keys are shared (`k = q / |q|`, one projection), hashed by
    random rotations, `h(x) = argmax([x R ; -x R])` with `R` a random
    `(H, b / 2)` Gaussian matrix; each query attends to keys of its own
    bucket within chunks of `chunk_length` (see `BucketedAttention`: the
    paper's sorted chunks when not causal; chunks counted per bucket when
    causal, so that decoding equals the full pass). A token does not attend
    to itself unless nothing else is left (with shared QK its own key
    would dominate). `num_hashes` rounds with independent rotations are
    combined by their log-sum-exps, each key counted once however many
    rounds find it: attention over the union of what the rounds see.
    Cost `O(T * chunk_length * num_hashes)`.

    The rotations are a seeded non-trainable weight, saved with the model,
    redrawn every `redraw` training calls when set (Reformer hashes afresh
    at every step: `redraw=1`).

    Args:
        num_heads, key_dim: as in `MultiHeadAttention` (no key projection,
            no grouped key/value heads), and so are `value_dim`,
            `output_dim`, `use_bias`, `dropout`, `position` (rotary only),
            `scale`, `kernel_initializer`, `bias_initializer` and
            `output_kernel_initializer`.
        num_buckets: buckets per round, even (`argmax` over `b/2` rotated
            coordinates and their negatives), or 1 (no hashing).
        num_hashes: hash rounds.
        chunk_length: positions per chunk; any sequence length works.
        redraw: redraw the rotations every this many training calls, or
            `None`.
        seed: seed of the rotations; `None` picks one (kept in the config).

    Call arguments:
        As `MultiHeadAttention` for self-attention: `query` (`value`, if
        given, must be `query`), padding masks, `use_causal_mask`, `window`,
        `cache`, `cache_update_index` (cached calls are causal), `training`.

    Returns:
        `(B, T, output_dim)`, or `(outputs, cache)` with a cache.

    Examples:
        >>> attention = LSHAttention(num_heads=4, key_dim=64, num_buckets=64, num_hashes=2, chunk_length=64)
        >>> attention(keras.random.normal((2, 4096, 256)), use_causal_mask=True).shape
        (2, 4096, 256)
    """

    shares_query_key = True
    example_options = ({"num_buckets": 4, "num_hashes": 2, "chunk_length": 4, "seed": 0}, {"num_buckets": 1})

    def __init__(
        self, num_heads, key_dim, num_buckets=32, num_hashes=1, chunk_length=64, redraw=None, seed=None, **kwargs
    ):
        super().__init__(num_heads, key_dim, chunk_length=chunk_length, **kwargs)
        check_positive_int("num_buckets", num_buckets)
        if num_buckets > 1 and num_buckets % 2:
            raise ValueError(
                "`num_buckets` must be even (argmax over b/2 rotated coordinates and their negatives) or 1. "
                f"Received: num_buckets={num_buckets}"
            )
        check_positive_int("num_hashes", num_hashes)
        if self.num_key_value_heads != num_heads:
            raise ValueError(
                "LSH attention shares queries and keys: it has no grouped key/value heads. Received: "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        self.num_buckets = int(num_buckets)
        self.num_hashes = int(num_hashes)
        self._init_draws(seed, redraw)

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        shape = (self.num_hashes, self.key_dim, max(self.num_buckets // 2, 1))
        self.rotations = self._build_draws(
            "rotations", shape, lambda seed: keras.random.normal(shape, seed=seed, dtype="float32")
        )

    def project(self, query, key, value):
        """Shared QK: keys are the unit queries (`k = q / |q|`); values from the query as well."""
        q = self.split_heads(self.query_dense(query), self.num_heads)  # [B, T, N, H]
        k = q / ops.sqrt(ops.sum(ops.square(q), axis=-1, keepdims=True) + 1e-6)
        return q, k, self.split_heads(self.value_dense(query), self.num_heads)

    @property
    def num_bucket_ids(self):
        return self.num_buckets

    def buckets(self, x, rotations=None):
        """`(..., H)` heads -> `(..., num_hashes)` int32 buckets."""
        if self.num_buckets == 1:
            return ops.zeros((*ops.shape(x)[:-1], self.num_hashes), "int32")
        return lsh_buckets(x, self.rotations.value if rotations is None else rotations)

    def assign_buckets(self, query, key, context):
        rotations = self._current_draw(context.training)
        key_buckets = ops.transpose(self.buckets(key, rotations), (0, 2, 3, 1))  # [B, N, R, S]
        if not context.cached:
            return key_buckets, key_buckets  # the queries are the keys
        # A query hashes as its own key: rotations commute with the norm, and argmax ignores it.
        return ops.transpose(self.buckets(query, rotations), (0, 2, 3, 1)), key_buckets

    def exclude_self(self):
        return True

    def get_config(self):
        config = super().get_config()
        config.update(num_buckets=self.num_buckets, num_hashes=self.num_hashes, redraw=self.redraw, seed=self.seed)
        return config
