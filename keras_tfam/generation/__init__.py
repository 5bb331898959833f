"""Generation: samplers and the KV-cached decoding loop."""

from keras_tfam.generation.decoding import decode
from keras_tfam.generation.samplers import (
    GreedySampler,
    RandomSampler,
    Sampler,
    TopKSampler,
    TopPSampler,
    get_sampler,
)

__all__ = [
    "GreedySampler",
    "RandomSampler",
    "Sampler",
    "TopKSampler",
    "TopPSampler",
    "decode",
    "get_sampler",
]
