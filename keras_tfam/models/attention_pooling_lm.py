"""A next-token LM from encoder blocks and attention pooling (the project's seed recipe)."""

import keras
from keras import ops

from keras_tfam.generation.generator import GenerationMixin
from keras_tfam.generation.protocol import DecodeStep
from keras_tfam.layers.blocks.transformer_encoder_block import TransformerEncoderBlock
from keras_tfam.layers.embedding.tied_embedding import TiedEmbedding
from keras_tfam.layers.position.position_embedding import PositionEmbedding
from keras_tfam.layers.set.pma import PMA
from keras_tfam.models.functional_model import FunctionalModel
from keras_tfam.models.token_ids import check_token_ids
from keras_tfam.utils import base_model_config, check_positive_int


@keras.saving.register_keras_serializable(package="keras_tfam")
class AttentionPoolingLM(GenerationMixin, FunctionalModel):
    """`token_ids (B, T)` context window -> float32 logits `(B, V)` of the next token.

    Token embeddings plus learned positions, `num_layers` pre-norm
    (bidirectional) encoder blocks over the window, then attention pooling:
    one learned query attends over the window (`PMA` with one seed, Lee et
    al. 2019), a final LayerNorm and the vocabulary projection through the
    tied embedding. One prediction per window, where a causal decoder makes
    one per position.

    Args:
        vocabulary_size: number of token ids.
        context_length: tokens per window `T`.
        num_layers: encoder blocks.
        num_heads: attention heads.
        hidden_dim: model width.
        intermediate_dim: feed-forward width (default `4 * hidden_dim`).
        dropout: dropout rate.

    It decodes through the generator like every LM (`generate`): the cache
    is the `(B, L)` buffer of the ids so far, and each step predicts from
    the window of the last `context_length` ids (a window that starts
    before the text is filled with id 0 on the left, as short texts are
    padded for training).

    Examples:
        >>> model = AttentionPoolingLM(1000, context_length=16, num_layers=2, num_heads=4, hidden_dim=32)
        >>> token_windows = np.random.randint(0, 1000, size=(8, 16))  # the 16 tokens before each target
        >>> model(token_windows).shape
        (8, 1000)
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
            ("vocabulary_size", vocabulary_size),
            ("context_length", context_length),
            ("num_layers", num_layers),
            ("num_heads", num_heads),
            ("hidden_dim", hidden_dim),
        ):
            check_positive_int(name, value)
        intermediate_dim = intermediate_dim or 4 * hidden_dim
        initializer = keras.initializers.RandomNormal(stddev=0.02)
        self.token_embedding = TiedEmbedding(
            vocabulary_size, hidden_dim, embeddings_initializer=initializer, dtype=dtype, name="token_embedding"
        )
        self.position_embedding = PositionEmbedding(
            context_length, initializer=initializer, dtype=dtype, name="position_embedding"
        )
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        self.encoder_blocks = [
            TransformerEncoderBlock(
                num_heads,
                intermediate_dim,
                norm_position="pre",
                dropout=dropout,
                activation="gelu_tanh",
                kernel_initializer=initializer,
                dtype=dtype,
                name=f"encoder_block_{i}",
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

    def call(self, inputs, training=None, mask=None):
        check_token_ids(inputs)
        return super().call(inputs, training=training, mask=mask)

    # ------------------------------------------------------------------ generation protocol

    @property
    def max_length(self):
        """`None`: each prediction reads a fixed window, whatever the length so far."""
        return None

    def init_cache(self, batch_size, length, window=None):
        """The buffer of ids `(B, length)`: a step needs the last `context_length` of them."""
        return ops.zeros((batch_size, length), "int32")

    def resize_cache(self, cache, length):
        return ops.pad(cache, [[0, 0], [0, length - ops.shape(cache)[1]]])

    def call_with_cache(self, token_ids, cache, index, window=None):
        """A `DecodeStep`: for each position `p` of `token_ids (B, T)` (at `index ..`), the logits of the next
        token from the window of ids `p - context_length + 1 .. p`."""
        cache = ops.slice_update(cache, (0, index), ops.cast(token_ids, "int32"))
        width = self.context_length
        padded = ops.pad(cache, [[0, 0], [width, 0]])  # id 0 before the text
        length = ops.shape(token_ids)[1]
        # Window of position p: padded[:, p + 1 : p + 1 + width].
        starts = ops.arange(length, dtype="int32") + ops.cast(index, "int32") + 1
        columns = starts[:, None] + ops.arange(width, dtype="int32")[None, :]  # [T, W]
        windows = ops.take(padded, ops.reshape(columns, (-1,)), axis=1)  # [B, T * W]
        batch = ops.shape(token_ids)[0]
        logits = self(ops.reshape(windows, (-1, width)), training=False)  # [B * T, V]
        return DecodeStep(ops.reshape(logits, (batch, length, self.vocabulary_size)), cache)

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
