"""Generation: one generator for every model that implements the generation protocol.

`Generator` (and `GenerationMixin`, which gives a model `generate`) drives
any `DecodingModel` (the declared protocol, `keras_tfam.generation.protocol`:
`init_cache`, `resize_cache`, `call_with_cache` returning a `DecodeStep`,
`vocabulary_size`, `max_length`, and capabilities such as
`sliding_window_cache`): prompt packing and checks, the compiled
`keras.ops.while_loop`, cache growth, the sliding window past the model's
context, sampling or beam search, logits processors (`processors`), stop
sequences and log-probabilities. Backend-neutral (`keras.ops` only); the
engine a decoding call enters (`keras_tfam.engine`) decides the form of its
products. The loop's parts (`decoding.decode`, `decoding.plan_decoding`,
`prompts.pack_prompts`, ...) stay in their modules.
"""

from keras_tfam.generation.generator import GenerationMixin, Generator
from keras_tfam.generation.precision import with_dtype
from keras_tfam.generation.processors import (
    DecodeContext,
    LogitBias,
    LogitsProcessor,
    MinNewTokens,
    NoRepeatNGram,
    OccurrencePenalty,
    RepetitionPenalty,
    SuppressTokens,
)
from keras_tfam.generation.prompts import prompt_checks
from keras_tfam.generation.protocol import DecodeStep, DecodingModel, DecodingWrapper, check_protocol
from keras_tfam.generation.samplers import (
    SAMPLERS,
    GreedySampler,
    MinPSampler,
    RandomSampler,
    Sampler,
    TensorSampler,
    TopKSampler,
    TopPSampler,
    get_sampler,
)
from keras_tfam.generation.scoring import windowed_logits
from keras_tfam.generation.search import BeamSearch, Sampling
from keras_tfam.generation.serving import ServingLoop, generate_graph
from keras_tfam.generation.speculative import DraftModel, PromptLookup

__all__ = [
    "DraftModel",
    "PromptLookup",
    "BeamSearch",
    "DecodeContext",
    "DecodeStep",
    "DecodingModel",
    "DecodingWrapper",
    "GenerationMixin",
    "Generator",
    "GreedySampler",
    "LogitBias",
    "LogitsProcessor",
    "MinNewTokens",
    "MinPSampler",
    "NoRepeatNGram",
    "OccurrencePenalty",
    "RandomSampler",
    "RepetitionPenalty",
    "SAMPLERS",
    "Sampler",
    "Sampling",
    "SuppressTokens",
    "TensorSampler",
    "TopKSampler",
    "TopPSampler",
    "check_protocol",
    "ServingLoop",
    "generate_graph",
    "get_sampler",
    "prompt_checks",
    "windowed_logits",
    "with_dtype",
]
