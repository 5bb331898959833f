"""A next-token LM from encoder blocks and attention pooling (the project's seed recipe)."""

import keras
from keras import ops

from keras_tfam.layers.blocks.transformer_encoder_block import TransformerEncoderBlock
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.position.position_embedding import PositionEmbedding
from keras_tfam.layers.set.pma import PMA
from keras_tfam.utils import base_model_config, check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class AttentionPoolingLM(keras.Model):
    """`token_ids (B, T)` context window -> float32 logits `(B, V)` of the next token.

    Token embeddings plus learned positions, `num_layers` pre-norm
    (bidirectional) encoder blocks over the window, then attention pooling:
    one learned query attends over the window (`PMA` with one seed, Lee et
    al. 2019), a final LayerNorm and the vocabulary projection through the
    tied embedding. One prediction per window, where a causal decoder makes
    one per position: the comparison with GPT-2 is in `BENCHMARKS.md`.

    Args:
        vocabulary_size: number of token ids.
        context_length: tokens per window `T`.
        num_layers: encoder blocks.
        num_heads: attention heads.
        hidden_dim: model width.
        intermediate_dim: feed-forward width (default `4 * hidden_dim`).
        dropout: dropout rate.

    Example:

    >>> model = AttentionPoolingLM(33278, context_length=64, num_layers=2, num_heads=4, hidden_dim=128)
    >>> model(token_windows).shape
    (B, 33278)
    """

    def __init__(
        self,
        vocabulary_size,
        context_length,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim=None,
        dropout=0.0,
        dtype=None,
        **kwargs,
    ):
        for name, value in (
            ("vocabulary_size", vocabulary_size), ("context_length", context_length), ("num_layers", num_layers),
            ("num_heads", num_heads), ("hidden_dim", hidden_dim),
        ):
            check_positive_int(name, value)
        intermediate_dim = intermediate_dim or 4 * hidden_dim
        initializer = keras.initializers.RandomNormal(stddev=0.02)
        self.token_embedding = TiedEmbedding(
            vocabulary_size, hidden_dim, embeddings_initializer=initializer, dtype=dtype, name="token_embedding"
        )
        self.position_embedding = PositionEmbedding(context_length, initializer=initializer, dtype=dtype, name="position_embedding")
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        self.encoder_blocks = [
            TransformerEncoderBlock(
                num_heads, intermediate_dim, norm_position="pre", dropout=dropout, activation="gelu_tanh",
                kernel_initializer=initializer, dtype=dtype, name=f"encoder_block_{i}",
            )
            for i in range(num_layers)
        ]
        self.pooling = PMA(num_heads, num_seeds=1, dtype=dtype, name="attention_pooling")
        self.final_norm = keras.layers.LayerNormalization(epsilon=1e-5, dtype=dtype, name="final_norm")

        token_ids = keras.Input((context_length,), dtype="int32", name="token_ids")
        x = self.token_embedding(token_ids)
        x = self.embedding_dropout(x + self.position_embedding(x))
        for block in self.encoder_blocks:
            x = block(x)
        pooled = self.final_norm(ops.squeeze(self.pooling(x), axis=1))
        logits = self.token_embedding(pooled, reverse=True)
        super().__init__(inputs=token_ids, outputs=logits, dtype=dtype, **kwargs)

        self.vocabulary_size = vocabulary_size
        self.context_length = context_length
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout

    def get_config(self):
        return {
            **base_model_config(self),
            "vocabulary_size": self.vocabulary_size,
            "context_length": self.context_length,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "hidden_dim": self.hidden_dim,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

