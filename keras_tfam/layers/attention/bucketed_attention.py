"""Base class of self-attention within buckets of sorted chunks (LSH, routing)."""

import keras
from keras import ops

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.position.attention_position_scheme import check_no_score_bias
from keras_tfam.ops.bucketed_attention import chunked_bucket_attention
from keras_tfam.utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class BucketedAttention(MultiHeadAttention):
    """Self-attention whose queries see only keys of their bucket, in sorted chunks.

    What `LSHAttention` (hash buckets) and `RoutingAttention` (k-means
    clusters) share: the checks of a self-attention call, the chunk length
    (a sequence longer than it must be a multiple of it), and the chunked
    computation (`keras_tfam.ops.bucketed_attention`) between the
    projections and the output projection. Subclasses assign the buckets.

    Args:
        num_heads, key_dim, and the rest of `MultiHeadAttention`'s
            arguments (`position`: rotary only).
        chunk_length: positions per chunk.
    """

    def __init__(self, num_heads, key_dim, chunk_length=64, **kwargs):
        super().__init__(num_heads, key_dim, **kwargs)
        check_positive_int("chunk_length", chunk_length)
        check_no_score_bias(type(self).__name__, self.position)
        self.chunk_length = chunk_length

    def _check_call(self, query, value, key, attention_mask, return_attention_scores):
        name, length = type(self).__name__, query.shape[1]
        if attention_mask is not None or return_attention_scores:
            raise ValueError(
                f"{name} takes padding masks, `use_causal_mask` and `window`: no attention_mask, no attention scores."
            )
        if (value is not None and value is not query) or key is not None:
            raise ValueError(f"{name} is self-attention: pass `query` only (or `value` = `query`).")
        if length is not None and length > self.chunk_length and length % self.chunk_length:
            raise ValueError(
                f"A sequence longer than chunk_length={self.chunk_length} must be a multiple of it. "
                f"Received: a sequence of length {length}"
            )

    def _attend_in_chunks(self, q, k, v, query_buckets, key_buckets, training, **options):
        """`(B, T, N, H)` heads and `(B, N, R, T)` buckets -> `(B, T, N, Hv)` outputs in the compute dtype."""
        heads_first = [ops.cast(ops.transpose(x, (0, 2, 1, 3)), "float32") for x in (q, k, v)]
        dropout = None
        if self.dropout and training:
            dropout = lambda weights: self.dropout_layer(weights, training=True)  # noqa: E731
        outputs = chunked_bucket_attention(
            *heads_first, query_buckets, key_buckets, self.chunk_length, scale=self.scale, dropout=dropout, **options
        )
        return ops.cast(ops.transpose(outputs, (0, 2, 1, 3)), self.compute_dtype)

    def _output(self, outputs, query_mask):
        """`(B, T, N, Hv)` -> `(B, T, output_dim)`, padded queries zeroed."""
        if query_mask is not None:
            outputs = outputs * ops.cast(query_mask, outputs.dtype)[:, :, None, None]
        shape = ops.shape(outputs)
        return self.output_dense(ops.reshape(outputs, (shape[0], shape[1], self.num_heads * self.value_dim)))

    def get_config(self):
        config = super().get_config()
        config.update(chunk_length=self.chunk_length)
        return config
