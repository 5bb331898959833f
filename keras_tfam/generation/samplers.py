"""Samplers: how the next token is chosen from float32 logits.

Sampling is stateless: each call receives a `(2,)` int32 seed, so a
generation with the same `seed` draws the same tokens, and a compiled
decoding loop (or a SavedModel signature) takes the seed as an input. This
module uses TensorFlow's stateless random ops; keras-hub's samplers (whose
randomness is a stateful seed generator of their own) are accepted too
through `get_sampler`.
"""

import keras
import tensorflow as tf

from keras_tfam.utils import check_positive_int


class Sampler:
    """Base class: `sampler(logits (B, V) float32, seed (2,) int32) -> (B,) int32`.

    Args:
        temperature: logits are divided by it before sampling.
    """

    def __init__(self, temperature=1.0):
        if not temperature > 0:
            raise ValueError(f"`temperature` must be positive. Received: temperature={temperature}")
        self.temperature = float(temperature)

    def __call__(self, logits, seed):
        logits = tf.cast(logits, tf.float32) / self.temperature
        return tf.cast(tf.random.stateless_categorical(self.filter(logits), 1, seed)[:, 0], tf.int32)

    def filter(self, logits):
        """Returns logits with the excluded tokens set to `-inf`."""
        return logits

    def get_config(self):
        return {"temperature": self.temperature}

    def cache_key(self):
        """Samplers with equal keys share a compiled decoding loop."""
        return (type(self).__name__, tuple(sorted(self.get_config().items())))


class GreedySampler(Sampler):
    """Always the most likely token (ties: the lowest id)."""

    def __init__(self):
        super().__init__()

    def __call__(self, logits, seed):
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    def get_config(self):
        return {}


class RandomSampler(Sampler):
    """Samples from `softmax(logits / temperature)`."""


class TopKSampler(Sampler):
    """Samples among the `k` most likely tokens (Fan et al. 2018).

    Args:
        k: number of tokens kept.
        temperature: see `Sampler`.
    """

    def __init__(self, k=50, temperature=1.0):
        super().__init__(temperature)
        check_positive_int("k", k)
        self.k = k

    def filter(self, logits):
        k = min(self.k, logits.shape[-1])
        kth = tf.math.top_k(logits, k=k, sorted=True).values[:, -1:]
        return tf.where(logits < kth, tf.constant(-float("inf"), logits.dtype), logits)

    def get_config(self):
        return {"k": self.k, "temperature": self.temperature}


class TopPSampler(Sampler):
    """Nucleus sampling (Holtzman et al. 2020): the smallest set of most
    likely tokens whose probability reaches `p`.

    Args:
        p: probability mass kept, in `(0, 1]`.
        temperature: see `Sampler`.
    """

    def __init__(self, p=0.9, temperature=1.0):
        super().__init__(temperature)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"`p` must be in (0, 1]. Received: p={p}")
        self.p = float(p)

    def filter(self, logits):
        sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")
        probabilities = tf.nn.softmax(sorted_logits, axis=-1)
        # Mass strictly before each token: a token is kept while that is < p,
        # so the most likely token is always kept.
        mass_before = tf.cumsum(probabilities, axis=-1, exclusive=True)
        kept = tf.cast(mass_before < self.p, tf.int32)
        cutoff_index = tf.reduce_sum(kept, axis=-1, keepdims=True) - 1
        cutoff = tf.gather(sorted_logits, cutoff_index, batch_dims=1)
        return tf.where(logits < cutoff, tf.constant(-float("inf"), logits.dtype), logits)

    def get_config(self):
        return {"p": self.p, "temperature": self.temperature}


class KerasHubSampler(Sampler):
    """Adapts a `keras_hub.samplers.Sampler` to the decoding loop.

    Uses its `compute_probabilities` and `get_next_token`; its randomness is
    its own seed generator, so the `seed` of `generate` does not apply.
    """

    def __init__(self, sampler):
        self.sampler = sampler
        self.temperature = getattr(sampler, "temperature", 1.0)

    def __call__(self, logits, seed):
        probabilities = self.sampler.compute_probabilities(tf.cast(logits, tf.float32))
        return tf.cast(self.sampler.get_next_token(probabilities), tf.int32)

    def get_config(self):
        return {"keras_hub": keras.saving.serialize_keras_object(self.sampler)}

    def cache_key(self):
        return (type(self).__name__, id(self.sampler))


class TensorSampler(Sampler):
    """Greedy, temperature, top-k and top-p in one sampler whose settings are tensors.

    For serving signatures, where the settings arrive as inputs:
    `temperature <= 0` is greedy; `top_k <= 0` and `top_p >= 1` switch those
    filters off.
    """

    def __init__(self, temperature, top_k, top_p):
        self.temperature = tf.cast(temperature, tf.float32)
        self.top_k = tf.cast(top_k, tf.int32)
        self.top_p = tf.cast(top_p, tf.float32)

    def __call__(self, logits, seed):
        logits = tf.cast(logits, tf.float32)
        greedy = tf.argmax(logits, axis=-1, output_type=tf.int32)
        scaled = logits / tf.maximum(self.temperature, 1e-6)
        vocabulary = tf.shape(scaled)[-1]
        k = tf.where(self.top_k > 0, tf.minimum(self.top_k, vocabulary), vocabulary)
        sorted_logits = tf.sort(scaled, axis=-1, direction="DESCENDING")
        kth = tf.gather(sorted_logits, tf.fill([tf.shape(scaled)[0], 1], k - 1), batch_dims=1)
        minus_inf = tf.constant(-float("inf"), tf.float32)
        scaled = tf.where(scaled < kth, minus_inf, scaled)
        sorted_logits = tf.where(tf.range(vocabulary)[None, :] < k, sorted_logits, minus_inf)
        mass_before = tf.cumsum(tf.nn.softmax(sorted_logits, axis=-1), axis=-1, exclusive=True)
        kept = tf.reduce_sum(tf.cast(mass_before < self.top_p, tf.int32), axis=-1, keepdims=True)
        cutoff = tf.gather(sorted_logits, tf.maximum(kept, 1) - 1, batch_dims=1)
        scaled = tf.where(scaled < cutoff, minus_inf, scaled)
        sampled = tf.cast(tf.random.stateless_categorical(scaled, 1, seed)[:, 0], tf.int32)
        return tf.where(self.temperature > 0, sampled, greedy)


SAMPLERS = {
    "greedy": GreedySampler,
    "random": RandomSampler,
    "temperature": RandomSampler,
    "top_k": TopKSampler,
    "top_p": TopPSampler,
}


def get_sampler(sampler="greedy", **kwargs):
    """A `Sampler` from a name in `SAMPLERS` (with its keyword arguments),
    a `Sampler`, or a keras-hub sampler."""
    if isinstance(sampler, Sampler):
        if kwargs:
            raise ValueError(f"Sampler options go to its constructor, not here. Received: {kwargs}")
        return sampler
    if isinstance(sampler, str):
        if sampler not in SAMPLERS:
            raise ValueError(f"`sampler` must be one of {tuple(SAMPLERS)}. Received: sampler={sampler!r}")
        return SAMPLERS[sampler](**kwargs)
    try:
        import keras_hub

        if isinstance(sampler, keras_hub.samplers.Sampler):
            return KerasHubSampler(sampler)
    except ImportError:  # pragma: no cover - keras-hub is a dependency
        pass
    raise ValueError(
        "`sampler` must be a name, a keras_tfam Sampler or a keras_hub sampler. "
        f"Received: sampler={sampler!r}"
    )
