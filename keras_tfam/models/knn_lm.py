"""kNN-LM (Khandelwal et al. 2020): an LM interpolated with a nearest-neighbour datastore."""

import math

import keras
import numpy as np
from keras import ops

from keras_tfam.generation.generator import GenerationMixin
from keras_tfam.generation.protocol import DecodeStep, DecodingWrapper, check_protocol
from keras_tfam.models.model_mixin import ModelMixin
from keras_tfam.retrieval.datastore import Datastore, logits_and_hidden_states
from keras_tfam.utils import base_model_config


@keras.saving.register_keras_serializable(package="keras_tfam")
class KNNLM(GenerationMixin, DecodingWrapper, ModelMixin, keras.Model):
    """An LM's next-token distribution interpolated with a datastore's (kNN-LM).

    Khandelwal et al. 2020: `p(y | x) = lambda p_kNN(y | x) + (1 - lambda)
    p_LM(y | x)`, where `p_kNN` comes from the `Datastore` entries nearest to
    the LM's final hidden state (the input of its softmax). The mixture is
    taken in log space (`logaddexp`), so `interpolation=0` returns the LM's
    log-probabilities exactly.

    Its outputs are log-probabilities, used as logits: a softmax or a
    cross-entropy `from_logits=True` over them gives back `p`, so the model
    evaluates like any LM (`evaluate_perplexity`; `tfam eval RUN
    --knn-split valid` builds the datastore from a split and evaluates
    this model) and generates (`generate`, any sampler) through the
    generation protocol, which it implements by delegating to `lm` (the
    cache is the LM's).

    Args:
        lm: a decoding model whose steps carry its final hidden states
            (`returns_hidden_states`: `GPT2LM`, `TransformerXLLM`,
            `EarlyExitLM`, another `KNNLM`).
        datastore: a `Datastore` whose keys are `lm`'s hidden states.
        interpolation: `lambda`, in `[0, 1]` (the paper: 0.25).

    Call arguments:
        token_ids: int `(B, T)`.

    Returns:
        float32 log-probabilities `(B, T, V)`.

    Examples:
        >>> lm = GPT2LM(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32)
        >>> corpus = np.random.randint(0, 100, size=(4, 33))  # the datastore's text, as windows
        >>> datastore = Datastore.from_model(lm, corpus[:, :-1], corpus[:, 1:], k=8)
        >>> knn_lm = KNNLM(lm, datastore, interpolation=0.25)
        >>> knn_lm(np.array([[5, 7, 9]])).shape  # log-probabilities
        (1, 3, 100)
        >>> knn_lm.generate([[5, 7, 9]], max_new_tokens=4).shape
        (1, 7)
    """

    serves_token_ids = True

    def __init__(self, lm, datastore, interpolation=0.25, **kwargs):
        super().__init__(**kwargs)
        check_protocol(lm, hidden_states=True)
        if not isinstance(datastore, Datastore):
            raise ValueError(f"`datastore` must be a Datastore. Received: datastore={datastore!r}")
        if datastore.vocabulary_size != lm.vocabulary_size:
            raise ValueError(
                "The datastore and the LM must share a vocabulary. Received: datastore.vocabulary_size="
                f"{datastore.vocabulary_size}, lm.vocabulary_size={lm.vocabulary_size}"
            )
        if (
            isinstance(interpolation, bool)
            or not isinstance(interpolation, (int, float, np.number))
            or not (0.0 <= interpolation <= 1.0)
        ):
            raise ValueError(f"`interpolation` must be in [0, 1]. Received: interpolation={interpolation!r}")
        self.lm = lm
        self.datastore = datastore
        self.interpolation = float(interpolation)

    def _interpolate(self, logits, hidden):
        width = hidden.shape[-1]
        if width is not None and width != self.datastore.key_dim:
            raise ValueError(
                f"The datastore's keys have key_dim={self.datastore.key_dim} features but the LM's hidden states have "
                f"{width}: build the datastore from this LM (Datastore.from_model). Received: hidden states of shape "
                f"{tuple(hidden.shape)}"
            )
        log_lm = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        log_knn = ops.log(self.datastore(hidden))  # -inf for tokens no neighbour holds
        log_lambda = math.log(self.interpolation) if self.interpolation > 0 else float("-inf")
        log_rest = math.log1p(-self.interpolation) if self.interpolation < 1 else float("-inf")
        return ops.logaddexp(log_knn + log_lambda, log_lm + log_rest)

    def call(self, token_ids):
        return self._interpolate(*logits_and_hidden_states(self.lm, token_ids))

    # ------------------------------------------------------------------ generation protocol (delegated)

    @property
    def wrapped(self):
        return self.lm

    def call_with_cache(self, token_ids, cache, index, window=None, **options):
        """A `DecodeStep` of log-probabilities `(B, T, V)` for `token_ids` at positions `index ..`."""
        logits, cache, hidden = self.lm.call_with_cache(token_ids, cache, index, window=window, **options)
        return DecodeStep(self._interpolate(logits, hidden), cache, hidden)

    def get_config(self):
        return {
            **base_model_config(self),
            "lm": keras.saving.serialize_keras_object(self.lm),
            "datastore": keras.saving.serialize_keras_object(self.datastore),
            "interpolation": self.interpolation,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for name in ("lm", "datastore"):
            config[name] = keras.saving.deserialize_keras_object(config[name])
        return cls(**config)
