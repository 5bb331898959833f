"""Linear attention (Katharopoulos et al. 2020; Shen et al. 2021)."""

import keras
from keras import ops

from keras_tfam.layers.attention.attention_kernels import AUTO, HOOK_KERNELS
from keras_tfam.layers.attention.caches.recurrent_state_cache import RecurrentStateCache
from keras_tfam.layers.attention.feature_maps.elu_feature_map import EluFeatureMap
from keras_tfam.layers.attention.feature_maps.feature_map import FeatureMap
from keras_tfam.layers.attention.feature_maps.random_feature_map import MAX_EXPONENT
from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.registry import register_attention
from keras_tfam.utils import check_positive_int, static_dim

# Feature maps by name; a `FeatureMap` object is accepted too.
FEATURE_MAPS = ("elu", "exp")


def prefix_sum(x, axis=1, block=16):
    """Inclusive prefix sum along `axis`, in time linear in its length.

    Sums inside blocks of `block` positions are products with a
    lower-triangular matrix of ones, and the block totals are summed the same
    way, recursively. `ops.cumsum` computes the same values, but XLA lowers it
    to a reduce-window whose cost on CPU grows faster than the length.
    Falls back to `ops.cumsum` when the length is not static.
    """
    if not isinstance(block, int) or isinstance(block, bool) or block < 2:
        raise ValueError(f"`block` must be an integer >= 2. Received: block={block!r}")
    length = static_dim(x.shape[axis])
    if length is None:
        return ops.cumsum(x, axis=axis)
    moved = ops.moveaxis(x, axis, 0)
    sums = _prefix_sum_rows(ops.reshape(moved, (length, -1)), block)
    return ops.moveaxis(ops.reshape(sums, ops.shape(moved)), 0, axis)


def _prefix_sum_rows(rows, block):
    """Prefix sums down the rows of a `(n, M)` matrix with static `n`."""
    n = rows.shape[0]
    if n <= block:
        return ops.matmul(ops.tril(ops.ones((n, n), rows.dtype)), rows)
    groups = -(-n // block)
    blocks = ops.reshape(ops.pad(rows, [[0, groups * block - n], [0, 0]]), (groups, block, -1))
    inner = ops.einsum("ij,gjm->gim", ops.tril(ops.ones((block, block), rows.dtype)), blocks)
    totals = inner[:, -1]
    carried = _prefix_sum_rows(totals, block) - totals  # sum of the earlier blocks
    return ops.reshape(inner + carried[:, None], (groups * block, -1))[:n]


def _decay_matrix(cumulative):
    """`exp(c_t - c_j)` for `j <= t`, else 0: `(..., n)` -> `(..., n, n)`, entries <= 1."""
    n = cumulative.shape[-1] or ops.shape(cumulative)[-1]
    lower = ops.cast(ops.tril(ops.ones((n, n))), "bool")
    differences = cumulative[..., :, None] - cumulative[..., None, :]
    return ops.exp(ops.where(lower, differences, -1e30))


def decayed_prefix_sum(x, log_decay, block=16):
    """`y_t = sum_{j <= t} exp(a_{j+1} + ... + a_t) x_j` along axis -2, in linear time.

    The gated recurrence `y_t = exp(a_t) y_{t-1} + x_t` of a whole sequence
    at once: inside blocks of `block` rows a decay matrix, across blocks the
    same sum over the block totals, recursively (as `prefix_sum`).

    Args:
        x: `(..., n, F)`; with `n` unknown until run time, one `n x n` decay matrix.
        log_decay: `(..., n)` log decays `a_t <= 0`.
    """
    n = x.shape[-2]
    if n is None or n <= block:
        cumulative = ops.cumsum(log_decay, axis=-1)
        return ops.matmul(_decay_matrix(cumulative), x)
    groups = -(-n // block)
    lead = [[0, 0]] * (len(x.shape) - 2)
    padded = ops.pad(x, lead + [[0, groups * block - n], [0, 0]])
    x = ops.reshape(padded, (*ops.shape(x)[:-2], groups, block, x.shape[-1]))
    log_decay = ops.pad(log_decay, lead + [[0, groups * block - n]])  # decay 1 past the end
    cumulative = ops.cumsum(ops.reshape(log_decay, (*ops.shape(log_decay)[:-1], groups, block)), axis=-1)
    inner = ops.matmul(_decay_matrix(cumulative), x)  # (..., G, block, F)
    totals = decayed_prefix_sum(inner[..., -1, :], cumulative[..., -1], block)  # inclusive, per block
    carried = ops.pad(totals[..., :-1, :], lead + [[1, 0], [0, 0]])  # what enters each block
    outputs = inner + ops.exp(cumulative)[..., None] * carried[..., None, :]
    return ops.reshape(outputs, (*ops.shape(outputs)[:-3], groups * block, x.shape[-1]))[..., :n, :]


def causal_linear_numerator(query, key, value, state=None, chunk_size=64, log_decay=None):
    """`sum_{j <= t} (q_t . k_j) v_j` for every `t`, in chunks, plus the final state.

    Within a chunk of `L` positions the products are computed directly (an
    `L x L` lower-triangular block); across chunks through prefix sums of the
    chunk states `sum_j k_j v_j^T`, so time and memory grow linearly with the
    sequence. Heads are moved next to the batch so that every product is a
    plain batched matmul.

    With `log_decay` (`a_t`, the log of a gate `g_t`), the state decays:
    `S_t = g_t S_{t-1} + k_t v_t^T` (Peng et al. 2021, gated RFA), so term
    `j` is weighted by `g_{j+1} ... g_t`; decays inside a chunk are an
    `L x L` matrix of `exp(c_t - c_j)`, across chunks a `decayed_prefix_sum`.

    Args:
        query, key: `(B, T, N, H)` features.
        value: `(B, T, N, Hv)`.
        state: `(B, N, H, Hv)` sum over earlier positions, or `None`.
        chunk_size: positions per chunk.
        log_decay: `(B, T, N)` log gates `<= 0`, or `None` (no decay).

    Returns:
        `(B, T, N, Hv)` numerators and the `(B, N, H, Hv)` state after `T`.
    """
    length = static_dim(query.shape[1])
    chunk = min(chunk_size, length) if length is not None else chunk_size
    shape = ops.shape(query)
    batch, steps, heads = shape[0], shape[1], shape[2]
    padded = (steps + chunk - 1) // chunk * chunk
    chunks = padded // chunk if length is None else -(-length // chunk)

    def split(x):  # (B, T, N, H) -> (B, N, C, L, H)
        x = ops.pad(x, [[0, 0], [0, padded - steps], [0, 0], [0, 0]])
        return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (batch, heads, chunks, chunk, x.shape[-1]))

    q, k, v = split(query), split(key), split(value)
    if log_decay is not None:
        decays = ops.cumsum(split(log_decay[..., None])[..., 0], axis=-1)  # (B, N, C, L): c_t within the chunk
        return _decayed_linear_numerator(q, k, v, decays, state, (batch, heads, padded, steps))
    chunk_states = ops.matmul(ops.swapaxes(k, -1, -2), v)  # (B, N, C, H, Hv)
    inclusive = prefix_sum(chunk_states, axis=2)
    exclusive = inclusive - chunk_states
    if state is not None:
        exclusive = exclusive + state[:, :, None]
    lower = ops.tril(ops.ones((chunk, chunk), q.dtype))
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) * lower  # (B, N, C, L, L)
    outputs = ops.matmul(q, exclusive) + ops.matmul(scores, v)  # (B, N, C, L, Hv)
    outputs = ops.reshape(outputs, (batch, heads, padded, value.shape[-1]))[:, :, :steps]
    final = inclusive[:, :, -1] if state is None else inclusive[:, :, -1] + state
    return ops.transpose(outputs, (0, 2, 1, 3)), final


def _decayed_linear_numerator(q, k, v, decays, state, sizes):
    """`causal_linear_numerator` with decays; `(B, N, C, L, .)` chunks, `decays` `(B, N, C, L)`."""
    batch, heads, padded, steps = sizes
    totals = decays[..., -1]  # (B, N, C): log decay across each chunk
    ends = ops.exp(totals[..., None] - decays)[..., None]  # decay from each position to its chunk's end
    chunk_states = ops.matmul(ops.swapaxes(k * ends, -1, -2), v)  # (B, N, C, H, Hv)
    chunks = chunk_states.shape[2] or ops.shape(chunk_states)[2]
    flat = ops.reshape(chunk_states, (batch, heads, chunks, chunk_states.shape[-2] * chunk_states.shape[-1]))
    inclusive = ops.reshape(decayed_prefix_sum(flat, totals), ops.shape(chunk_states))
    if state is not None:  # the earlier state, decayed up to the end of each chunk
        inclusive = inclusive + ops.exp(ops.cumsum(totals, axis=-1))[..., None, None] * state[:, :, None]
        first = state[:, :, None]
    else:
        first = ops.zeros_like(inclusive[:, :, :1])
    exclusive = ops.concatenate([first, inclusive[:, :, :-1]], axis=2)  # the state entering each chunk
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) * _decay_matrix(decays)  # (B, N, C, L, L)
    outputs = ops.matmul(q * ops.exp(decays)[..., None], exclusive) + ops.matmul(scores, v)
    outputs = ops.reshape(outputs, (batch, heads, padded, v.shape[-1]))[:, :, :steps]
    return ops.transpose(outputs, (0, 2, 1, 3)), inclusive[:, :, -1]


@register_attention("linear")
@keras.saving.register_keras_serializable(package="keras_tfam")
class LinearAttention(MultiHeadAttention):
    """Attention of cost linear in sequence length, through a feature map `phi`.

    `"elu"` is Katharopoulos et al. 2020 ("Transformers are RNNs"):
    `phi(x) = elu(x) + 1` and `V' = phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1)`.
    `"exp"` is Shen et al. 2021 ("Efficient Attention"): a softmax over the
    feature dimension of each query and over the sequence for each key
    feature, `V' = softmax_feat(Q) (softmax_seq(K)^T V)`; causally, the key
    softmax runs over the positions up to the query.
    A `FeatureMap` object is any other `phi` (`keras_tfam.layers.attention.
    feature_maps`): `PositiveRandomFeatures` (Performer's FAVOR+) and
    `TrigonometricRandomFeatures` (RFA) estimate the softmax kernel, and
    inherit the causal parallel form, the recurrent cache and the windowed
    form; `PerformerAttention` and `RandomFeatureAttention` build them. The
    layer holds its map as `phi` (`None` for `"exp"`).

    Causal attention is computed in parallel for training (chunked prefix
    sums, memory linear in the sequence) and as a recurrence for decoding:
    the cache is the running state `(S, z)`, `S = sum phi(k) v^T` and
    `z = sum phi(k)`, packed as `(B, N, M, Hv + 1)` (`M` features per head,
    `H` for elu and exp), and each new token costs
    O(1). Same call convention as `MultiHeadAttention`; padding masks are
    supported (padded keys contribute nothing), arbitrary `attention_mask`s
    and bias position schemes are not (rotary is). A `memory` (past hidden
    states) is seen by every query: causally it enters as the initial
    state.

    With a `window`, each query attends (through the same kernel) to the
    `window` most recent positions only, for a model trained on contexts
    of that length: the cache is then a ring of the last `window` keys and
    values, `(B, 2, window, K, H)` as `MultiHeadAttention`'s
    (`init_cache(..., window=W)`), O(window) per token. An attention
    `pattern` is applied the same way (masked kernel, banded when the
    pattern is local; a KV cache, a ring when its `lookback` is bounded).

    Args:
        num_heads, key_dim: as in `MultiHeadAttention`, and so are
            `value_dim`, `num_key_value_heads`, `output_dim`, `use_bias`,
            `kernel_initializer`, `bias_initializer` and
            `output_kernel_initializer`.
        feature_map: `"elu"`, `"exp"` or a `FeatureMap`.
        position: `RotaryEmbedding` or `None`.
        chunk_size: positions per chunk of the causal parallel form.
        epsilon: added to the normaliser.

    Call arguments:
        As `MultiHeadAttention` (`query`, `value`, `key`, padding masks,
        `use_causal_mask`, `cache`, `cache_update_index`, `training`). With a
        cache the attention is causal and continues from the cached state.

    Returns:
        `(B, T, output_dim)`, or `(outputs, cache)` with a cache.

    Examples:
        >>> attention = LinearAttention(num_heads=8, key_dim=64, feature_map="elu")
        >>> attention(keras.random.normal((2, 4096, 512)), use_causal_mask=True).shape
        (2, 4096, 512)
    """

    # No attention weights to drop out: models skip their attention dropout.
    has_attention_weights = False
    supports_attention_mask = False
    supports_attention_scores = False
    accepts_score_bias = False
    decodes_causally = True
    # The named kernels of the windowed form; without a window or pattern the linear form alone runs.
    attention_kernels = HOOK_KERNELS
    example_options = ({}, {"feature_map": "exp", "chunk_size": 4})

    def __init__(self, num_heads, key_dim, feature_map="elu", chunk_size=64, epsilon=1e-6, **kwargs):
        super().__init__(num_heads, key_dim, **kwargs)
        if not isinstance(feature_map, FeatureMap) and feature_map not in FEATURE_MAPS:
            raise ValueError(
                f"`feature_map` must be one of {FEATURE_MAPS} or a FeatureMap. Received: feature_map={feature_map!r}"
            )
        check_positive_int("chunk_size", chunk_size)
        self.feature_map = feature_map
        self.chunk_size = int(chunk_size)
        self.epsilon = epsilon
        # The kernel's feature map; None for Shen et al.'s "exp", normalised differently.
        self.phi = {"elu": EluFeatureMap(name="phi"), "exp": None}.get(feature_map, feature_map)

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self.phi is not None and not self.phi.built:
            self.phi.build((None, None, self.num_heads, self.key_dim))

    @property
    def feature_dim(self):
        """Features per head `M`: the first axis of each head's state."""
        return self.key_dim if self.phi is None else self.phi.output_dim(self.key_dim)

    # A gated layer (`_gate_logits`) is a causal recurrence, with no windowed form.
    is_gated = False

    def _gate_logits(self, key):
        """`(B, S, N)` logits of the gates of a gated recurrence (`is_gated`), or `None`.

        Gates `g = sigmoid(logits)` turn the causal state into
        `S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T`.
        """
        return None

    def _windowed(self, window):
        """Whether a call computes the windowed form (a `window` or a `pattern`): masked kernel, KV ring cache."""
        return window is not None or self.pattern is not None

    def cache_for(self, window=None):
        """The recurrent state `(B, N, M, Hv + 1)`, or with a `window` (or pattern) a ring of keys and values."""
        if self._windowed(window):
            return super().cache_for(window)
        return RecurrentStateCache(self.num_heads, self.feature_dim, self.value_dim)

    def attend(self, query, key, value, context):
        kind = type(self).__name__
        if self.is_gated and not context.causal:
            raise ValueError(
                f"A gated {kind} is a causal recurrence: call it with use_causal_mask=True or a cache. "
                "Received: use_causal_mask=False"
            )
        if self.is_gated and context.window is not None:
            raise ValueError(
                "A gated recurrence has no windowed form (its state forgets by itself). "
                f"Received: window={context.window}"
            )
        memory_length = context.memory_length
        if self.is_gated and (not isinstance(memory_length, int) or memory_length):
            raise ValueError(f"A gated {kind} takes no `memory`: its state is the memory. Received: a memory")
        if self.phi is not None:
            self.phi.advance(context.training)
        if self._windowed(context.window):
            # The windowed form: MultiHeadAttention's masks, bands and ring
            # cache, with the kernel of `_compute_attention` below.
            return super().attend(query, key, value, context)
        if self.attention_kernel != AUTO:
            raise ValueError(
                f"{kind} runs attention_kernel={self.attention_kernel!r} in its windowed form only (a `window` or a "
                f"`pattern`); this call computes its linear form. Received: attention_kernel={self.attention_kernel!r}"
            )
        q, k, v = query, self.repeat_key_value_heads(key), self.repeat_key_value_heads(value)
        q, k, v = (ops.cast(x, "float32") for x in (q, k, v))
        key_mask = context.key_mask
        keep = None if key_mask is None else ops.cast(key_mask, "float32")[:, :, None, None]
        gate_logits = self._gate_logits(context.inputs["key"])
        if gate_logits is not None:
            gate_logits = ops.cast(gate_logits, "float32")
        state = context.state
        if context.causal and (not isinstance(memory_length, int) or memory_length):
            # Every query sees the whole memory: it enters as the initial state.
            memory_keep = None if keep is None else keep[:, :memory_length]
            state = self._memory_state(k[:, :memory_length], v[:, :memory_length], memory_keep)
            k, v = k[:, memory_length:], v[:, memory_length:]
            keep = None if keep is None else keep[:, memory_length:]
        outputs, state = self._linear_attention(q, k, v, keep, context.causal, state, gate_logits)
        if context.query_mask is not None:
            outputs = outputs * ops.cast(context.query_mask, outputs.dtype)[:, :, None, None]
        return outputs, None, state if context.cached else None

    def _memory_state(self, key, value, keep):
        """The state `(B, N, M, Hv + 1)` of a memory's float32 keys and values `(B, M, N, .)`, every one visible."""
        _, k_features = self._features(key, key)
        if keep is not None:
            k_features = k_features * keep
        value = ops.concatenate([value, ops.ones_like(value[..., :1])], axis=-1)
        return ops.einsum("bsnm,bsnv->bnmv", k_features, value)

    def _compute_attention(self, query, key, value, attention_mask, bias, training, return_attention_scores):
        """The windowed form: the kernel `phi(q) . phi(k)` in place of `exp(q . k)`, under an explicit mask.

        `(B, T, N, H)` queries over `(B, S, K, H)` keys; O(T * S), for
        windows and ring caches (the unmasked forms use `_linear_attention`).
        """
        key, value = self.repeat_key_value_heads(key), self.repeat_key_value_heads(value)
        q, k, v = (ops.cast(x, "float32") for x in (query, key, value))
        mask = ops.cast(attention_mask, "float32")
        if len(mask.shape) == 3:
            mask = ops.expand_dims(mask, 1)
        batch, length = ops.shape(q)[0], ops.shape(q)[1]
        mask = ops.broadcast_to(mask, (batch, self.num_heads, length, ops.shape(k)[1]))  # [B, N, T, S]
        q_features, k_features = self._features(q, k)
        if self.phi is None:
            # Shen et al., causally: each key feature's softmax runs over the
            # keys the query sees.
            totals = ops.einsum("bnts,bsnh->btnh", mask, k_features)
            q_features = q_features / (totals + self.epsilon)
        scores = ops.einsum("btnh,bsnh->bnts", q_features, k_features) * mask
        outputs = ops.einsum("bnts,bsnv->btnv", scores, v)
        if self.phi is not None:
            normaliser = ops.transpose(ops.sum(scores, axis=-1), (0, 2, 1))[..., None]  # [B, T, N, 1]
            outputs = outputs / (normaliser + self.epsilon)
        return ops.cast(outputs, value.dtype), None

    def _features(self, q, k):
        """`(phi(q), phi(k))`; for "exp", `softmax_feat(q)` and `exp(k)` (clipped)."""
        if self.phi is None:
            return ops.softmax(q, axis=-1), ops.exp(ops.minimum(k, MAX_EXPONENT))
        return self.phi(q, query=True), self.phi(k)

    def _linear_attention(self, q, k, v, keep, causal, state, gate_logits=None):
        """float32 `(B, T, N, Hv)` outputs and the state `(B, N, M, Hv + 1)` (or None)."""
        if self.phi is None and not causal:
            # Shen et al.: softmax over the sequence for each key feature.
            scores = k if keep is None else ops.where(keep > 0, k, -1e9)
            k_features = ops.softmax(scores, axis=1)
            q_features = ops.softmax(q, axis=-1)
            context = ops.einsum("bsnh,bsnv->bnhv", k_features, v)
            return ops.einsum("btnh,bnhv->btnv", q_features, context), None

        q_features, k_features = self._features(q, k)
        log_decay = None
        if gate_logits is not None:  # S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T
            log_decay = ops.log_sigmoid(gate_logits)
            k_features = k_features * ops.sigmoid(-gate_logits)[..., None]
        if keep is not None:
            k_features = k_features * keep
            log_decay = None if log_decay is None else log_decay * keep[..., 0]  # padding keeps the state
        # A column of ones appended to the values carries the key sums through
        # the same products: the normaliser phi(q) . sum phi(k) of the elu
        # form, and `z` of the recurrent state.
        v = ops.concatenate([v, ops.ones_like(v[..., :1])], axis=-1)
        if not causal:  # Katharopoulos, non-causal
            heads_first = [ops.transpose(x, (0, 2, 1, 3)) for x in (q_features, k_features, v)]
            q_features, k_features, v = heads_first  # (B, N, T, H): plain batched matmuls
            numerator = ops.matmul(q_features, ops.matmul(ops.swapaxes(k_features, -1, -2), v))
            numerator = ops.transpose(numerator, (0, 2, 1, 3))
            return numerator[..., :-1] / (numerator[..., -1:] + self.epsilon), None

        if self.phi is None:
            # Causal softmax over the sequence: each key feature is normalised by
            # its sum over the positions up to the query's.
            prefix = prefix_sum(k_features, axis=1)  # (B, T, N, H)
            if state is not None:
                prefix = prefix + state[:, None, :, :, -1]
            q_features = q_features / (prefix + self.epsilon)
        numerator, state = causal_linear_numerator(q_features, k_features, v, state, self.chunk_size, log_decay)
        if self.phi is None:
            return numerator[..., :-1], state
        return numerator[..., :-1] / (numerator[..., -1:] + self.epsilon), state

    def get_config(self):
        config = super().get_config()
        feature_map = self.feature_map
        if isinstance(feature_map, FeatureMap):
            feature_map = keras.saving.serialize_keras_object(feature_map)
        config.update(feature_map=feature_map, chunk_size=self.chunk_size, epsilon=self.epsilon)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("feature_map"), dict):
            config["feature_map"] = keras.saving.deserialize_keras_object(config["feature_map"])
        return super().from_config(config)
