"""The kNN-LM datastore: context vectors mapped to the tokens that followed them."""

import keras
import numpy as np
from keras import ops

from keras_tfam.generation.protocol import check_protocol
from keras_tfam.ops.in_place import write_rows
from keras_tfam.retrieval.nearest_neighbors import nearest_neighbors
from keras_tfam.utils import check_positive_int, is_integer

# Token ids are held in a float32 variable (exact below 2**24), so that every
# variable of the layer stays float32 under mixed precision.
_MAX_EXACT_ID = 2**24


def logits_and_hidden_states(lm, token_ids):
    """`(logits (B, T, V), hidden states (B, T, D))` of a full pass of a decoding model.

    Runs `lm.call_with_cache` over fresh caches from position 0; the model
    must declare `returns_hidden_states` (its `DecodeStep`s carry the input
    of its softmax: `GPT2LM`, `TransformerXLLM`, `EarlyExitLM`, `KNNLM`).
    """
    check_protocol(lm, hidden_states=True)
    shape = ops.shape(token_ids)
    step = lm.call_with_cache(token_ids, lm.init_cache(shape[0], shape[1]), 0)
    return step.logits, step.hidden_states


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

    Examples:
        >>> lm = GPT2LM(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32)
        >>> corpus = np.random.randint(0, 100, size=(4, 33))
        >>> datastore = Datastore.from_model(lm, corpus[:, :-1], corpus[:, 1:], k=8)
        >>> datastore.size  # one entry per (context, next token) pair
        128
        >>> datastore(keras.random.normal((1, 3, 32))).shape  # p_kNN of 3 queries
        (1, 3, 100)
    """

    def __init__(self, size, key_dim, vocabulary_size, k=64, temperature=1.0, chunk_size=16384, **kwargs):
        super().__init__(**kwargs)
        if is_integer(size) and size == 0:
            raise ValueError("The datastore is empty: it needs at least one entry. Received: size=0")
        size = check_positive_int("size", size)
        key_dim = check_positive_int("key_dim", key_dim)
        vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        k = check_positive_int("k", k)
        chunk_size = check_positive_int("chunk_size", chunk_size)
        if k > size:
            raise ValueError(f"`k` must be at most the datastore size. Received: k={k}, size={size}")
        if vocabulary_size > _MAX_EXACT_ID:
            raise ValueError(f"`vocabulary_size` must be at most 2**24. Received: vocabulary_size={vocabulary_size}")
        real = isinstance(temperature, (int, float, np.integer, np.floating)) and not isinstance(
            temperature, (bool, np.bool_)
        )
        if not real or not 0 < temperature < float("inf"):
            raise ValueError(f"`temperature` must be positive and finite. Received: temperature={temperature!r}")
        temperature = float(temperature)
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
        """Writes `keys (size, key_dim)` and their next tokens `values (size,)`.

        Raises a `ValueError` naming the first key row holding a NaN or an
        infinity (its distances would be NaN, and so would every query's
        `p_kNN`), or the first value that is not a token id.
        """
        keys, values = np.asarray(keys), np.asarray(values)
        if keys.shape != (self.size, self.key_dim) or values.shape != (self.size,):
            raise ValueError(
                f"`keys` must be ({self.size}, {self.key_dim}) and `values` ({self.size},). "
                f"Received: keys.shape={keys.shape}, values.shape={values.shape}"
            )
        self.write_entries(0, keys, values)

    def write_entries(self, start, keys, values):
        """Writes entries `start .. start + n - 1`: `keys (n, key_dim)` and `values (n,)`.

        Fills a datastore block by block (as `from_model` does) without
        holding all the keys twice: the rows are written into the layer's
        variable, in place on TensorFlow and PyTorch. The checks are
        `set_entries`'; rows are named by their entry index.
        """
        keys, values = _checked_entries(keys, values, start, self.key_dim, self.vocabulary_size)
        start = int(start)
        if start < 0 or start + len(keys) > self.size:
            raise ValueError(
                f"Entries {start} .. {start + len(keys) - 1} do not fit a datastore of size={self.size}. "
                f"Received: start={start}, keys.shape={keys.shape}"
            )
        if not self.built:
            self.build()
        write_rows(self.keys, start, keys)
        write_rows(self.values, start, values.astype("float32"))

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

        Streamed: each batch's keys are written into the datastore as they
        come, so the build peaks near the bytes of the keys themselves
        (`benchmarks/datastore_memory.py`).

        Args:
            model: a generation-protocol LM whose `call_with_cache` takes
                `returns_hidden_states` (`GPT2LM`, `TransformerXLLM`, `EarlyExitLM`).
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
        batch_size = check_positive_int("batch_size", batch_size)
        keep = np.ones(inputs.shape, bool) if weights is None else np.asarray(weights) > 0
        if keep.shape != inputs.shape:
            raise ValueError(
                f"`weights` must have the shape of `inputs`. Received: weights.shape={keep.shape}, "
                f"inputs.shape={inputs.shape}"
            )
        size = int(keep.sum())
        if size == 0:
            raise ValueError("The corpus gave no (context, next token) pair: the datastore would be empty")
        # Streamed: the keys of each batch go straight into the layer's variable, so the build holds
        # them once, not as a list of batches, their concatenation and the variable's copy.
        datastore, written = None, 0
        for start in range(0, len(inputs), batch_size):
            rows = keep[start : start + batch_size]
            if not rows.any():
                continue
            _, hidden = logits_and_hidden_states(model, inputs[start : start + batch_size].astype("int32"))
            keys = np.asarray(ops.convert_to_numpy(hidden), "float32")[rows]
            if datastore is None:
                datastore = cls(size, keys.shape[-1], model.vocabulary_size, **kwargs)
            try:
                datastore.write_entries(written, keys, targets[start : start + batch_size][rows])
            except ValueError as error:
                last = min(start + batch_size, len(inputs)) - 1
                raise ValueError(f"The hidden states of blocks {start} .. {last}: {error}") from None
            written += len(keys)
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


def _checked_entries(keys, values, start, key_dim, vocabulary_size):
    """`(keys float32 (n, key_dim), values int64 (n,))`; a one-line `ValueError` naming the first bad row."""
    keys, values = np.asarray(keys), np.asarray(values)
    if keys.ndim != 2 or keys.shape[1] != key_dim or values.shape != (len(keys),):
        raise ValueError(
            f"`keys` must be (n, {key_dim}) and `values` (n,). Received: keys.shape={keys.shape}, "
            f"values.shape={values.shape}"
        )
    if not (np.issubdtype(keys.dtype, np.floating) or np.issubdtype(keys.dtype, np.integer)):
        raise ValueError(f"`keys` must be numbers. Received: keys of dtype {keys.dtype}")
    keys = keys.astype("float32", copy=False)
    finite = np.isfinite(keys).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        bad = keys[row][~np.isfinite(keys[row])][0]
        raise ValueError(
            f"Every key must be finite: a NaN or infinite key gives NaN distances, and NaN p_kNN for every query. "
            f"Received: keys[{start + row}] holds {bad}"
        )
    # Distances are |q|^2 - 2 q.k + |k|^2 in float32: a longer key makes them inf - inf = NaN too.
    lengths = np.einsum("ij,ij->i", keys, keys, dtype=np.float64)
    too_long = lengths > np.finfo(np.float32).max
    if too_long.any():
        row = int(np.argmax(too_long))
        raise ValueError(
            "Every key's squared length must fit float32, in which distances are computed. "
            f"Received: keys[{start + row}] of squared length {lengths[row]:.3g}"
        )
    if values.size and not np.issubdtype(values.dtype, np.integer):
        if not (np.issubdtype(values.dtype, np.floating) and np.all(values == np.floor(values))):
            raise ValueError(f"`values` must be token ids (integers). Received: values of dtype {values.dtype}")
    if values.size and (values.min() < 0 or values.max() >= vocabulary_size):
        row = int(np.argmax((values < 0) | (values >= vocabulary_size)))
        raise ValueError(
            f"`values` must be token ids in [0, {vocabulary_size}). Received: values in [{values.min()}, "
            f"{values.max()}], values[{start + row}]={values[row]}"
        )
    return keys, values.astype("int64")
