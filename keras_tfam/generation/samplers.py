"""Samplers: how the next token is chosen from float32 logits.

Sampling is stateless and the same on every Keras backend: each call
receives an int32 `key` (the generator derives one per step from the
`seed` of `generate`), and the random draws are a counter-based hash of
(key, row, token id) turned into Gumbel noise, so `argmax(logits / T + g)`
samples from `softmax(logits / T)` (the Gumbel-max trick). The same seed
draws the same tokens on TensorFlow, JAX and PyTorch, in a compiled loop or
in a SavedModel signature that takes the seed as an input. keras-hub's
samplers (whose randomness is a seed generator of their own) are accepted
too through `get_sampler`.
"""

import keras
from keras import ops

from keras_tfam.utils import check_positive_int, check_real

_GOLDEN = -1640531527  # 0x9E3779B9 as an int32


def _shift_right(x, bits):
    """Logical right shift of int32 values (the sign bit shifted in as 0)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def mix(x):
    """A 32-bit integer hash (Wellons' "lowbias32"), on int32 with wrapping products."""
    x = ops.cast(x, "int32")
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = ops.multiply(x, 0x7FEB352D)
    x = ops.bitwise_xor(x, _shift_right(x, 15))
    x = ops.multiply(x, -2073254261)  # 0x846CA68B
    return ops.bitwise_xor(x, _shift_right(x, 16))


def step_key(seed, step):
    """The int32 key of one decoding step: a hash of the seed and the step."""
    return mix(ops.add(mix(seed), ops.cast(step, "int32")))


def first_argmax(logits):
    """`(B,)` int32: NumPy's `argmax` of each row of `(B, V)` `logits`: the first index of its largest value, or
    of its first NaN.

    `ops.argmax` gives the same tokens (but that it puts `-0.0` before `0.0`) as one reduction of (value,
    index) pairs, which XLA's CPU code runs one element at a time, fused with whatever computes the logits
    (a head's dequantization, a temperature). Here the maximum and the first indices holding it and a NaN are
    reductions XLA vectorizes (`benchmarks/experiments/argmax.py` compares the two).
    """
    vocabulary = ops.shape(logits)[-1]
    ids = ops.arange(vocabulary, dtype="int32")[None, :]
    nan = ops.isnan(logits)  # a backend's maximum may skip NaNs (TensorFlow's eager one does)
    largest = ops.max(ops.where(nan, float("-inf"), logits), axis=-1, keepdims=True)
    first_nan = ops.min(ops.where(nan, ids, vocabulary), axis=-1)
    first_largest = ops.min(ops.where(ops.equal(logits, largest), ids, vocabulary), axis=-1)
    return ops.where(first_nan < vocabulary, first_nan, first_largest)


def uniform_noise(key, batch_size, vocabulary_size):
    """`(B, V)` float32 uniform draws in `(0, 1)`, a pure function of `key` (a scalar, or `(B,)`: one per row)."""
    columns = ops.expand_dims(ops.arange(vocabulary_size, dtype="int32"), 0)
    key = ops.convert_to_tensor(key, "int32")
    if len(key.shape) == 1:  # a key per row: each row's draws depend on its key alone, not on its place
        row_keys = mix(key)[:, None]
    else:
        rows = ops.expand_dims(ops.arange(batch_size, dtype="int32"), 1)
        row_keys = mix(ops.bitwise_xor(mix(key), ops.multiply(rows, _GOLDEN)))
    bits = _shift_right(mix(ops.add(row_keys, columns)), 8)  # 24 random bits
    return (ops.cast(bits, "float32") + 0.5) / float(1 << 24)


def gumbel_noise(key, batch_size, vocabulary_size):
    """`(B, V)` standard Gumbel draws, `-log(-log(u))`."""
    return -ops.log(-ops.log(uniform_noise(key, batch_size, vocabulary_size)))


def sample_from_logits(logits, key):
    """One token per row from `softmax(logits)`; `-inf` logits are never drawn."""
    shape = ops.shape(logits)
    return first_argmax(logits + gumbel_noise(key, shape[0], shape[1]))


class Sampler:
    """Base class: `sampler(logits (B, V) float32, key int32) -> (B,) int32`.

    Subclasses override `filter` (the tokens excluded from sampling).

    Args:
        temperature: logits are divided by it before sampling.

    Examples:
        >>> class BanToken(Sampler):  # never samples token 0
        ...     def filter(self, logits):
        ...         return keras.ops.where(keras.ops.arange(logits.shape[-1]) == 0, float("-inf"), logits)
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> tokens = model.generate([[5, 7]], max_new_tokens=8, sampler=BanToken(), seed=0)
        >>> bool((tokens[:, 2:] != 0).all())
        True
    """

    def __init__(self, temperature=1.0):
        self.temperature = check_real("temperature", temperature, "> 0", lambda t: t > 0)

    def __call__(self, logits, key):
        logits = ops.cast(logits, "float32") / self.temperature
        return sample_from_logits(self.filter(logits), key)

    def filter(self, logits):
        """Returns logits with the excluded tokens set to `-inf`."""
        return logits

    def get_config(self):
        return {"temperature": self.temperature}

    def cache_key(self):
        """Samplers with equal keys share a compiled decoding loop."""
        return (type(self).__name__, tuple(sorted(self.get_config().items())))


class GreedySampler(Sampler):
    """Always the most likely token (ties: the lowest id).

    Args:
        None: greedy decoding has no setting.

    Examples:
        >>> keras.ops.convert_to_numpy(GreedySampler()(np.array([[0.1, 2.0, 2.0]], "float32"), None))
        array([1], dtype=int32)
    """

    def __init__(self):
        super().__init__()

    def __call__(self, logits, key):
        return first_argmax(logits)

    def get_config(self):
        return {}


class RandomSampler(Sampler):
    """Samples from `softmax(logits / temperature)`.

    Args:
        temperature: logits are divided by it before sampling.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> model.generate([[5, 7]], max_new_tokens=4, sampler=RandomSampler(0.7), seed=0).shape
        (1, 6)
    """


def top_k_filter(logits, k):
    """Logits outside the `k` largest of each row set to `-inf` (ties at the k-th kept)."""
    kth = ops.top_k(logits, k, sorted=True)[0][:, -1:]
    return ops.where(logits < kth, float("-inf"), logits)


def top_p_filter(logits, p):
    """Nucleus filter (Holtzman et al. 2020): the smallest set of most likely
    tokens whose probability reaches `p` keeps its logits, the rest `-inf`."""
    logits = ops.convert_to_tensor(logits)  # NumPy logits too, on every backend (`<` below)
    sorted_logits = ops.flip(ops.sort(logits, axis=-1), axis=-1)
    probabilities = ops.softmax(sorted_logits, axis=-1)
    # Mass strictly before each token: a token is kept while that is < p, so
    # the most likely token is always kept.
    mass_before = ops.cumsum(probabilities, axis=-1) - probabilities
    kept = ops.sum(ops.cast(mass_before < p, "int32"), axis=-1, keepdims=True)
    cutoff = ops.take_along_axis(sorted_logits, ops.maximum(kept, 1) - 1, axis=-1)
    return ops.where(logits < cutoff, float("-inf"), logits)


def min_p_filter(logits, p):
    """Min-p filter (Nguyen et al. 2024): tokens less likely than `p` times the most likely one get `-inf`."""
    probabilities = ops.softmax(logits, axis=-1)
    top = ops.max(probabilities, axis=-1, keepdims=True)
    return ops.where(probabilities < p * top, float("-inf"), logits)


class TopKSampler(Sampler):
    """Samples among the `k` most likely tokens (Fan et al. 2018).

    Args:
        k: number of tokens kept.
        temperature: see `Sampler`.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> model.generate([[5, 7]], max_new_tokens=4, sampler=TopKSampler(k=5), seed=0).shape
        (1, 6)
    """

    def __init__(self, k=50, temperature=1.0):
        super().__init__(temperature)
        self.k = check_positive_int("k", k)

    def filter(self, logits):
        return top_k_filter(logits, min(self.k, logits.shape[-1]))

    def get_config(self):
        return {"k": self.k, "temperature": self.temperature}


class TopPSampler(Sampler):
    """Nucleus sampling (Holtzman et al. 2020).

    Samples among the smallest set of most likely tokens whose probability
    reaches `p`.

    Args:
        p: probability mass kept, in `(0, 1]`.
        temperature: see `Sampler`.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> model.generate([[5, 7]], max_new_tokens=4, sampler=TopPSampler(p=0.8), seed=0).shape
        (1, 6)
    """

    def __init__(self, p=0.9, temperature=1.0):
        super().__init__(temperature)
        self.p = check_real("p", p, "in (0, 1]", lambda p: 0.0 < p <= 1.0)

    def filter(self, logits):
        return top_p_filter(logits, self.p)

    def get_config(self):
        return {"p": self.p, "temperature": self.temperature}


class MinPSampler(Sampler):
    """A sampler whose draws are also min-p filtered (Nguyen et al. 2024).

    The filter runs after the sampler's temperature and its own filter
    (transformers' order: temperature, top-k, top-p, min-p).

    Args:
        sampler: a `Sampler` that samples (not greedy).
        min_p: in `[0, 1]`; 0 keeps every token.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> model.generate([[5, 7]], max_new_tokens=4, sampler="top_k", min_p=0.1, seed=0).shape
        (1, 6)
    """

    def __init__(self, sampler, min_p):
        if isinstance(sampler, (GreedySampler, KerasHubSampler)) or not isinstance(sampler, Sampler):
            raise ValueError(
                "`min_p` filters what a keras_tfam sampler draws: use it with sampler='random', 'top_k' or 'top_p'. "
                f"Received: sampler={type(sampler).__name__}"
            )
        self.sampler = sampler
        self.min_p = check_real("min_p", min_p, "in [0, 1]", lambda p: 0.0 <= p <= 1.0)
        self.temperature = sampler.temperature

    def filter(self, logits):
        return min_p_filter(self.sampler.filter(logits), self.min_p)

    def get_config(self):
        return {"min_p": self.min_p, "sampler": self.sampler.cache_key()}


class KerasHubSampler(Sampler):
    """Adapts a `keras_hub.samplers.Sampler` to the decoding loop.

    Uses its `compute_probabilities` and `get_next_token`; its randomness is
    its own seed generator, so the `seed` of `generate` does not apply.
    """

    def __init__(self, sampler):
        self.sampler = sampler
        self.temperature = getattr(sampler, "temperature", 1.0)

    def __call__(self, logits, key):
        probabilities = self.sampler.compute_probabilities(ops.cast(logits, "float32"))
        return ops.cast(self.sampler.get_next_token(probabilities), "int32")

    def get_config(self):
        return {"keras_hub": keras.saving.serialize_keras_object(self.sampler)}

    def cache_key(self):
        return (type(self).__name__, id(self.sampler))


class TensorSampler(Sampler):
    """Greedy, temperature, top-k, top-p and min-p in one sampler whose settings are tensors.

    For serving signatures, where the settings arrive as inputs: scalars
    (one for every row) or `(R,)` (one per row). `temperature <= 0` is
    greedy; `top_k <= 0`, `top_p >= 1` and `min_p <= 0` switch those
    filters off. `checks()` lists what the settings must satisfy.

    Args:
        temperature: float tensor; `<= 0` is greedy.
        top_k: int tensor; `<= 0` keeps every token.
        top_p: float tensor in `(0, 1]`; `>= 1` keeps every token.
        min_p: float tensor in `[0, 1]`, or `None`.

    Examples:
        >>> sampler = TensorSampler(temperature=0.0, top_k=0, top_p=1.0)  # greedy
        >>> keras.ops.convert_to_numpy(sampler(np.array([[0.1, 2.0, 0.3]], "float32"), 0))
        array([1], dtype=int32)
    """

    def __init__(self, temperature, top_k, top_p, min_p=None):
        self.temperature = ops.cast(temperature, "float32")
        self.top_k = ops.cast(top_k, "int32")
        self.top_p = ops.cast(top_p, "float32")
        self.min_p = None if min_p is None else ops.cast(min_p, "float32")

    def checks(self):
        """`(ok, message, values)` conditions on the settings (see `prompts.prompt_checks`)."""
        yield (
            ops.logical_not(ops.any(ops.isnan(self.temperature))),
            "`temperature` must be a number (<= 0 for greedy). Received: temperature={}",
            [self.temperature],
        )
        yield (
            ops.all(ops.logical_and(ops.logical_not(ops.isnan(self.top_p)), self.top_p > 0.0)),
            "`top_p` must be in (0, 1] (>= 1 switches it off). Received: top_p={}",
            [self.top_p],
        )
        if self.min_p is not None:
            yield (
                ops.all(ops.logical_and(self.min_p >= 0.0, self.min_p <= 1.0)),
                "`min_p` must be in [0, 1] (0 switches it off). Received: min_p={}",
                [self.min_p],
            )

    def __call__(self, logits, key):
        logits = ops.cast(logits, "float32")
        rows, vocabulary = ops.shape(logits)[0], ops.shape(logits)[-1]

        def column(setting):  # (R, 1), a scalar setting repeated for every row
            return ops.reshape(setting, (-1, 1)) * ops.ones((rows, 1), setting.dtype)

        temperature, top_k, top_p = column(self.temperature), column(self.top_k), column(self.top_p)
        greedy = first_argmax(logits)
        sampled = temperature[:, 0] > 0

        def truncated(scaled):
            """`scaled` less the tokens past each row's top-k and outside its top-p mass (one sort)."""
            k = ops.where(top_k > 0, ops.minimum(top_k, vocabulary), vocabulary)
            sorted_logits = ops.flip(ops.sort(scaled, axis=-1), axis=-1)
            kth = ops.take_along_axis(sorted_logits, k - 1, axis=-1)
            scaled = ops.where(scaled < kth, float("-inf"), scaled)
            sorted_logits = ops.where(ops.arange(vocabulary)[None, :] < k, sorted_logits, float("-inf"))
            probabilities = ops.softmax(sorted_logits, axis=-1)
            mass_before = ops.cumsum(probabilities, axis=-1) - probabilities
            kept = ops.sum(ops.cast(mass_before < top_p, "int32"), axis=-1, keepdims=True)
            cutoff = ops.take_along_axis(sorted_logits, ops.maximum(kept, 1) - 1, axis=-1)
            return ops.where(scaled < cutoff, float("-inf"), scaled)

        def draw():
            scaled = logits / ops.maximum(temperature, 1e-6)
            # The sort only where a sampled row filters (a greedy row's settings do not count).
            filters = ops.logical_and(sampled[:, None], ops.logical_or(top_k > 0, top_p < 1.0))
            scaled = ops.cond(ops.any(filters), lambda: truncated(scaled), lambda: scaled)
            if self.min_p is not None:
                scaled = min_p_filter(scaled, column(self.min_p))
            return ops.where(sampled, sample_from_logits(scaled, key), greedy)

        # A greedy batch draws nothing: its step is the argmax alone.
        return ops.cond(ops.any(sampled), draw, lambda: greedy)


SAMPLERS = {
    "greedy": GreedySampler,
    "random": RandomSampler,
    "temperature": RandomSampler,
    "top_k": TopKSampler,
    "top_p": TopPSampler,
}


def get_sampler(sampler="greedy", **kwargs):
    """A `Sampler` from a name in `SAMPLERS` (with its keyword arguments), a `Sampler`, or a keras-hub sampler."""
    if isinstance(sampler, Sampler):
        if kwargs:
            raise ValueError(f"Sampler options go to its constructor, not here. Received: {kwargs}")
        return sampler
    if isinstance(sampler, str):
        if sampler not in SAMPLERS:
            raise ValueError(f"`sampler` must be one of {tuple(SAMPLERS)}. Received: sampler={sampler!r}")
        return SAMPLERS[sampler](**kwargs)
    if type(sampler).__module__.startswith("keras_hub"):
        import keras_hub

        if isinstance(sampler, keras_hub.samplers.Sampler):
            return KerasHubSampler(sampler)
    raise ValueError(
        f"`sampler` must be a name, a keras_tfam Sampler or a keras_hub sampler. Received: sampler={sampler!r}"
    )
