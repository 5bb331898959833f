"""The generation protocol, declared: what `Generator` asks of a model, and a base for model wrappers."""

from typing import Any, NamedTuple


class DecodeStep(NamedTuple):
    """What `call_with_cache` returns, always this one structure.

    Args:
        logits: float32 `(B, T, V)` next-token logits (or log-probabilities).
        cache: the updated caches (any nest of tensors, batch on axis 0).
        hidden_states: `(B, T, D)` final hidden states (the input of the
            output head), for models that declare `returns_hidden_states`;
            else `None`.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> step = model.call_with_cache(np.array([[5, 7, 9]]), model.init_cache(1, 8), 0)  # a prefill
        >>> step.logits.shape, step.hidden_states.shape
        ((1, 3, 64), (1, 3, 16))
    """

    logits: Any
    cache: Any
    hidden_states: Any = None


class DecodingModel:
    """Base of every model the generator drives (`Generator`, `GenerationMixin`).

    A decoding model has `vocabulary_size` (ids are in `[0, V)`) and
    `max_length` (the longest context it was trained on, or `None`) and
    implements three methods:

    - `init_cache(batch_size, length, window=None, **cache_inputs)`: empty
      caches, any nest of tensors with the batch on axis 0;
    - `resize_cache(cache, length)`: the caches grown to `length` positions;
    - `call_with_cache(token_ids (B, T), cache, index, window=None)`: a
      `DecodeStep` for the tokens at positions `index .. index + T - 1`.

    Its capabilities are declared, as class or instance attributes:

    - `sliding_window_cache`: `call_with_cache` accepts `window=W` with
      ring caches of `W` slots (relative or no positions); otherwise the
      generator re-encodes the window at positions `0 .. W - 1`.
    - `returns_hidden_states`: each `DecodeStep` carries the final hidden
      states (what retrieval, `KNNLM`, keys on).
    - `output_vocabulary_size`: the vocabulary of the generated ids when it
      differs from `vocabulary_size` (an encoder-decoder's target side), or
      `None`.
    - `reads_prompt_rows`: `call_with_cache` accepts `prompt_rows`, a `(B,)`
      bool that is true where the token fed is still part of the row's
      prompt (rows of different lengths finish their prompts inside the
      loop); a model whose steps differ on prompt tokens (early exits) reads
      it. Otherwise the generator does not pass it.
    - `positional_cache`: each position's cache entries live in slots of
      their own, which a call at that position rewrites (no ring, no
      recurrent state), so a step may write positions it then discards
      (drafted decoding, `speculative.py`).

    Args:
        None: a base that declares the protocol; a model's constructor takes
            its own arguments.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> isinstance(model, DecodingModel), model.returns_hidden_states
        (True, True)
        >>> check_protocol(model)  # raises, naming what is missing, for a model that breaks it
    """

    sliding_window_cache = False
    returns_hidden_states = False
    output_vocabulary_size = None
    reads_prompt_rows = False
    positional_cache = False

    def init_cache(self, batch_size, length, window=None, **cache_inputs):
        raise NotImplementedError

    def resize_cache(self, cache, length):
        raise NotImplementedError

    def call_with_cache(self, token_ids, cache, index, window=None):
        raise NotImplementedError


class DecodingWrapper(DecodingModel):
    """Base of models that wrap a decoding model (`KNNLM`, `EarlyExitLM`): the protocol delegated to `self.wrapped`.

    A wrapper overrides what it changes (usually `call_with_cache`) and
    inherits the rest, so any decoding model can be wrapped, and wrappers
    stack. Subclasses set `self.wrapped` in their constructor.

    Args:
        None: a subclass takes the model it wraps in its own constructor.

    Examples:
        >>> class Tempered(DecodingWrapper):  # logits divided by 2: a flatter distribution
        ...     def __init__(self, wrapped):
        ...         self.wrapped = wrapped
        ...     def call_with_cache(self, token_ids, cache, index, window=None, **options):
        ...         step = self.wrapped.call_with_cache(token_ids, cache, index, window=window, **options)
        ...         return DecodeStep(step.logits / 2.0, step.cache, step.hidden_states)
        >>> model = Tempered(GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16))
        >>> Generator(model).generate([[5, 7]], max_new_tokens=4, sampler="top_k", seed=0).shape
        (1, 6)
    """

    wrapped = None

    @property
    def vocabulary_size(self):
        return self.wrapped.vocabulary_size

    @property
    def max_length(self):
        return self.wrapped.max_length

    @property
    def sliding_window_cache(self):
        return self.wrapped.sliding_window_cache

    @property
    def returns_hidden_states(self):
        return self.wrapped.returns_hidden_states

    @property
    def reads_prompt_rows(self):
        return self.wrapped.reads_prompt_rows

    @property
    def positional_cache(self):
        return self.wrapped.positional_cache

    def init_cache(self, batch_size, length, window=None, **cache_inputs):
        return self.wrapped.init_cache(batch_size, length, window=window, **cache_inputs)

    def resize_cache(self, cache, length):
        return self.wrapped.resize_cache(cache, length)

    def call_with_cache(self, token_ids, cache, index, window=None, **options):
        return self.wrapped.call_with_cache(token_ids, cache, index, window=window, **options)


def check_protocol(model, hidden_states=False):
    """Raises a `ValueError` unless `model` is a `DecodingModel` (with `returns_hidden_states` when asked)."""
    if not isinstance(model, DecodingModel):
        raise ValueError(
            "The model does not implement the generation protocol: subclass keras_tfam.generation.DecodingModel "
            f"(or GenerationMixin) and implement init_cache, resize_cache and call_with_cache. "
            f"Received: model={type(model).__name__}"
        )
    missing = [name for name in ("vocabulary_size", "max_length") if not hasattr(model, name)]
    if missing:
        raise ValueError(
            f"The model does not implement the generation protocol: it lacks {missing}. "
            f"Received: model={type(model).__name__}"
        )
    if hidden_states and not model.returns_hidden_states:
        raise ValueError(
            "The model's decoding steps carry no hidden states (returns_hidden_states=False). "
            f"Received: model={type(model).__name__}"
        )
