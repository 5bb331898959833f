"""The kNN-LM datastore: context vectors mapped to the tokens that followed them."""

import keras
import numpy as np
from keras import ops

from keras_tfam.retrieval.nearest_neighbors import nearest_neighbors
from keras_tfam.utils import check_positive_int

# Token ids are held in a float32 variable (exact below 2**24), so that every
# variable of the layer stays float32 under mixed precision.
_MAX_EXACT_ID = 2**24


def logits_and_hidden_states(lm, token_ids):
    """`(logits (B, T, V), hidden states (B, T, D))` of a full pass of a generation-protocol LM.

    Runs `lm.call_with_cache(..., return_hidden_states=True)` over fresh
    caches from position 0 (as `GPT2LM` and `EarlyExitLM` offer it): the
    hidden states are the input of the LM's softmax.
    """
    shape = ops.shape(token_ids)
    logits, hidden, _ = lm.call_with_cache(
        token_ids, lm.init_cache(shape[0], shape[1]), 0, return_hidden_states=True
    )
    return logits, hidden


@keras.saving.register_keras_serializable(package="keras_tfam")
class Datastore(keras.layers.Layer):
    """Key-value memory of a corpus and the kNN next-token distribution (Khandelwal et al. 2020).

    Entry `i` pairs a key `k_i`, an LM's context vector at some position of
    the corpus (kNN-LM: the final hidden state, the input of the softmax),
    with the value `v_i`, the token that came next. For a query `q` the `k`
    nearest keys by exact squared L2 distance `d` give

        p_kNN(y | q) = sum_{i in kNN(q), v_i = y} exp(-d(k_i, q) / T) / sum_{i in kNN(q)} exp(-d(k_i, q) / T)

    with temperature `T = 1` in the paper. Search is exact: a batched matmul
    and top-k over chunks of `chunk_size` keys.

    Fill it with `set_entries(keys, values)`, or from a model and a corpus
    with `Datastore.from_model`. The keys and values are non-trainable
    weights, saved with the layer.

    Args:
        size: number of entries `N`.
        key_dim: width `D` of the keys.
        vocabulary_size: number of token ids `V`.
        k: neighbours per query, `1 <= k <= size`.
        temperature: the distances are divided by it (`> 0`).
        chunk_size: keys compared per chunk (bounds the `(queries, chunk)`
            distance matrix).

    Call arguments:
        queries: `(B, T, D)`.

    Returns:
        float32 `p_kNN`, `(B, T, V)`; every row sums to 1.

    Example:

    >>> datastore = Datastore.from_model(lm, inputs, targets, k=64)
    >>> p_knn = datastore(hidden_states)
    """

    def __init__(self, size, key_dim, vocabulary_size, k=64, temperature=1.0, chunk_size=16384, **kwargs):
        super().__init__(**kwargs)
        if isinstance(size, int) and size == 0:
            raise ValueError("The datastore is empty: it needs at least one entry. Received: size=0")
        for name, value in (
            ("size", size),
            ("key_dim", key_dim),
            ("vocabulary_size", vocabulary_size),
            ("k", k),
            ("chunk_size", chunk_size),
        ):
            check_positive_int(name, value)
        if k > size:
            raise ValueError(f"`k` must be at most the datastore size. Received: k={k}, size={size}")
        if vocabulary_size > _MAX_EXACT_ID:
            raise ValueError(f"`vocabulary_size` must be at most 2**24. Received: vocabulary_size={vocabulary_size}")
        if not temperature > 0:
            raise ValueError(f"`temperature` must be positive. Received: temperature={temperature}")
        self.size = size
        self.key_dim = key_dim
        self.vocabulary_size = vocabulary_size
        self.k = k
        self.temperature = temperature
        self.chunk_size = chunk_size

    def build(self, queries_shape=None):
        if queries_shape is not None and queries_shape[-1] not in (None, self.key_dim):
            raise ValueError(
                f"Queries must have key_dim={self.key_dim} features. Received: queries.shape={tuple(queries_shape)}"
            )
        self.keys = self.add_weight(name="keys", shape=(self.size, self.key_dim), initializer="zeros", trainable=False)
        self.values = self.add_weight(name="values", shape=(self.size,), initializer="zeros", trainable=False)
        self.built = True

    def set_entries(self, keys, values):
        """Writes `keys (size, key_dim)` and their next tokens `values (size,)`."""
        keys = np.asarray(keys, "float32")
        values = np.asarray(values)
        if keys.shape != (self.size, self.key_dim) or values.shape != (self.size,):
            raise ValueError(
                f"`keys` must be ({self.size}, {self.key_dim}) and `values` ({self.size},). "
                f"Received: keys.shape={keys.shape}, values.shape={values.shape}"
            )
        if values.size and (values.min() < 0 or values.max() >= self.vocabulary_size):
            raise ValueError(
                f"`values` must be token ids in [0, {self.vocabulary_size}). "
                f"Received: values in [{values.min()}, {values.max()}]"
            )
        if not self.built:
            self.build()
        self.keys.assign(keys)
        self.values.assign(values.astype("float32"))

    def search(self, queries):
        """`(distances (..., k), token ids (..., k) int32)` of the nearest entries, nearest first."""
        distances, indices = nearest_neighbors(queries, self.keys, self.k, chunk_size=self.chunk_size)
        return distances, ops.cast(ops.take(self.values, indices, axis=0), "int32")

    def call(self, queries):
        distances, tokens = self.search(queries)  # [B, T, k]
        weights = ops.softmax(-distances / self.temperature, axis=-1)
        shape = ops.shape(weights)
        rows = shape[0] * shape[1]
        row_ids = ops.broadcast_to(ops.arange(rows, dtype="int32")[:, None], (rows, self.k))
        indices = ops.stack([ops.reshape(row_ids, (-1,)), ops.reshape(tokens, (-1,))], axis=-1)
        # Neighbours sharing a token add up (scatter sums duplicate indices).
        probabilities = ops.scatter(indices, ops.reshape(weights, (-1,)), (rows, self.vocabulary_size))
        return ops.reshape(probabilities, (shape[0], shape[1], self.vocabulary_size))

    def compute_output_spec(self, queries):
        return keras.KerasTensor(tuple(queries.shape[:-1]) + (self.vocabulary_size,), dtype="float32")

    @classmethod
    def from_model(cls, model, inputs, targets, weights=None, batch_size=16, **kwargs):
        """A datastore of every (context vector -> next token) pair of a corpus.

        Args:
            model: a generation-protocol LM whose `call_with_cache` takes
                `return_hidden_states=True` (`GPT2LM`, `EarlyExitLM`).
            inputs: int `(N, T)` token blocks.
            targets: int `(N, T)` next tokens.
            weights: `(N, T)`; positions with weight 0 (padding) are left out.
            batch_size: blocks per forward pass.
            **kwargs: `k`, `temperature`, `chunk_size`, ... of the layer.
        """
        inputs, targets = np.asarray(inputs), np.asarray(targets)
        if inputs.shape != targets.shape or inputs.ndim != 2:
            raise ValueError(
                f"`inputs` and `targets` must be (blocks, length) of one shape. "
                f"Received: inputs.shape={inputs.shape}, targets.shape={targets.shape}"
            )
        keep = np.ones(inputs.shape, bool) if weights is None else np.asarray(weights) > 0
        keys = []
        for start in range(0, len(inputs), batch_size):
            _, hidden = logits_and_hidden_states(model, inputs[start : start + batch_size].astype("int32"))
            keys.append(np.asarray(ops.convert_to_numpy(hidden), "float32")[keep[start : start + batch_size]])
        keys = np.concatenate(keys) if keys else np.zeros((0, 0), "float32")
        if len(keys) == 0:
            raise ValueError("The corpus gave no (context, next token) pair: the datastore would be empty")
        datastore = cls(len(keys), keys.shape[-1], model.vocabulary_size, **kwargs)
        datastore.set_entries(keys, targets[keep])
        return datastore

    def get_config(self):
        config = super().get_config()
        config.update(
            size=self.size,
            key_dim=self.key_dim,
            vocabulary_size=self.vocabulary_size,
            k=self.k,
            temperature=self.temperature,
            chunk_size=self.chunk_size,
        )
        return config
