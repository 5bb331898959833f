"""Generation requests: the arguments of `generate`, checked, and the static choices a compiled loop is keyed by."""

import dataclasses
import warnings
from typing import Optional

import numpy as np

from keras_tfam.engine import PLAIN, Engine
from keras_tfam.generation.decoding import plan_decoding
from keras_tfam.generation.processors import build_processors, stop_sequence_table
from keras_tfam.generation.prompts import as_padded_prompts, prompt_checks, raise_failed_checks
from keras_tfam.generation.protocol import check_protocol
from keras_tfam.generation.search import get_search
from keras_tfam.generation.speculative import DraftModel, PromptLookup
from keras_tfam.utils import check_positive_int, is_integer

OVERFLOWS = ("slide", "error")
ENGINES = ("auto", "plain")


def length_bucket(max_new_tokens):
    """`max_new_tokens` rounded up to one of four steps per octave (16, 20, 24, 28, 32, 40, ...).

    The buffer of a compiled loop has the bucket's width and the loop stops
    at the request's own length, so requests of nearby lengths share one
    compiled loop, for at most 25% more buffer (and no more steps).
    """
    if max_new_tokens <= 16:
        return max_new_tokens
    step = 1 << (max_new_tokens.bit_length() - 3)
    return -(-max_new_tokens // step) * step


def output_vocabulary_size(model):
    """The vocabulary of the ids a model generates (and reads as a prompt)."""
    return model.output_vocabulary_size or model.vocabulary_size


def resolve_window(model, window=None, overflow="slide", prompt_length=None, max_new_tokens=None):
    """The context each step may see: `window`, else the model's `max_length`, or `None`.

    Raises a `ValueError` for a window longer than the model's context (it
    would attend over untrained distances), and, with `overflow="error"`,
    for a request that does not fit in the context.
    """
    if overflow not in OVERFLOWS:
        raise ValueError(f"`overflow` must be one of {OVERFLOWS}. Received: overflow={overflow!r}")
    limit = model.max_length
    if window is not None:
        check_positive_int("window", window)
        if limit is not None and window > limit:
            raise ValueError(
                f"`window` cannot exceed the {limit} positions the model was trained on (max_length): it would "
                f"attend over untrained distances. Received: window={window}"
            )
    window = window or limit
    if window is None or prompt_length is None:
        return window
    total = prompt_length + max_new_tokens
    if total > window and overflow == "error":
        raise ValueError(
            f"Prompt length {prompt_length} + max_new_tokens {max_new_tokens} = {total} exceeds the model's "
            f"context of {window} positions (max_length={limit}). Use overflow='slide' to keep generating with "
            f"a sliding window of the last {window} tokens."
        )
    return window


def resolve_engine(engine="auto"):
    """The engine a decoding call enters (`keras_tfam.engine`): an `Engine` as it is, `"plain"` (Keras' own
    computation), or `"auto"`: the XLA-CPU engine on TensorFlow and JAX when every device is a CPU, else plain.
    """
    if isinstance(engine, Engine):
        return engine
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(
            f"`engine` must be one of {ENGINES} or a keras_tfam.engine.Engine. Received: engine={engine!r}"
        )
    if engine == "auto":
        from keras_tfam.engine.xla_cpu import XLA_CPU

        return XLA_CPU if XLA_CPU.runs_here() else PLAIN
    return PLAIN


def check_token_id(name, value, vocabulary_size):
    """`value` as a Python int; a `ValueError` naming `name` unless it is an integer id in `[0, vocabulary_size)`."""
    if not is_integer(value) or not 0 <= value < vocabulary_size:
        shown = value.item() if isinstance(value, np.generic) else value
        raise ValueError(
            f"`{name}` must hold token ids in [0, {vocabulary_size}) (the model's vocabulary). "
            f"Received: {name}={shown!r}"
        )
    return int(value)


@dataclasses.dataclass(frozen=True)
class Steering:
    """What a decoding call does besides choosing tokens: its logits processors, its stop sequences (a table,
    `processors.stop_sequence_table`) and whether it returns log-probabilities."""

    processors: tuple = ()
    stop_sequences: Optional[np.ndarray] = None
    logprobs: bool = False

    def cache_key(self):
        table = None if self.stop_sequences is None else self.stop_sequences.tobytes()
        shape = None if self.stop_sequences is None else self.stop_sequences.shape
        return (tuple(p.cache_key() for p in self.processors), table, shape, self.logprobs)


@dataclasses.dataclass(frozen=True)
class Request:
    """A checked generation request: the arrays the compiled loop takes and the static choices it is keyed by."""

    padded: np.ndarray
    lengths: np.ndarray
    max_new_tokens: int
    seed: np.ndarray
    stop: np.ndarray
    names: tuple
    values: tuple
    search: object
    plan: object
    bucket: int
    pad_token_id: int
    jit_compile: bool
    engine: object
    steering: object
    drafter: object = None

    def arguments(self):
        """The compiled loop's arguments."""
        max_new_tokens = np.asarray(self.max_new_tokens, np.int32)
        return (self.padded, self.lengths, max_new_tokens, self.seed, self.stop, *self.values)


def prepare_request(
    model,
    token_ids,
    max_new_tokens,
    sampler="greedy",
    beam_size=1,
    length_penalty=0.0,
    seed=None,
    stop_token_ids=None,
    pad_token_id=0,
    window=None,
    overflow="slide",
    jit_compile=True,
    cache_inputs=None,
    engine="auto",
    return_logprobs=False,
    min_p=None,
    stop_sequences=None,
    prompt_lookup_num_tokens=None,
    max_matching_ngram_size=None,
    draft_model=None,
    num_draft_tokens=None,
    **processor_options,
):
    """The `Request` of `Generator.generate`'s arguments for `model`, each checked (a `ValueError` naming a bad
    one)."""
    engine = resolve_engine(engine)
    search = get_search(sampler, beam_size, length_penalty, min_p)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    vocabulary = output_vocabulary_size(model)
    pad_token_id = check_token_id("pad_token_id", pad_token_id, vocabulary)
    if not isinstance(jit_compile, (bool, np.bool_)):
        raise ValueError(f"`jit_compile` must be True or False. Received: jit_compile={jit_compile!r}")
    jit_compile = bool(jit_compile)
    if stop_token_ids is None or is_integer(stop_token_ids):  # one id, or none
        stop_token_ids = [] if stop_token_ids is None else [stop_token_ids]
    if not isinstance(stop_token_ids, (list, tuple, np.ndarray)):
        raise ValueError(
            f"`stop_token_ids` must be a token id or a list of them. Received: stop_token_ids={stop_token_ids!r}"
        )
    stop = np.asarray(
        [check_token_id("stop_token_ids", i, vocabulary) for i in np.asarray(stop_token_ids, object).reshape(-1)],
        np.int32,
    )
    padded, lengths = as_padded_prompts(token_ids, pad_token_id)
    if len(lengths) * search.beam_size >= 2**31:
        raise ValueError(
            f"`beam_size` times the number of prompts ({len(lengths)}) must be below 2**31 (the rows are int32 "
            f"indices). Received: beam_size={search.beam_size}"
        )
    if padded.shape[1] + length_bucket(max_new_tokens) >= 2**31:
        raise ValueError(
            f"`max_new_tokens` plus the prompt length ({padded.shape[1]}) must fit the int32 positions "
            f"(below 2**31). Received: max_new_tokens={max_new_tokens}"
        )
    raise_failed_checks(prompt_checks(padded, lengths, max_new_tokens, vocabulary))
    window = resolve_window(model, window, overflow, padded.shape[1], max_new_tokens)
    bucket = length_bucket(max_new_tokens)
    drafter = resolve_drafter(
        model, search, prompt_lookup_num_tokens, max_matching_ngram_size, draft_model, num_draft_tokens
    )
    drafted = 0 if drafter is None else drafter.num_tokens
    if drafted and window is not None and padded.shape[1] + max_new_tokens + drafted <= window:
        bucket = min(bucket, window - padded.shape[1] - drafted)  # rounded up within the context only
    plan = plan_decoding(model, padded.shape[1] + bucket + drafted, int(lengths.min()), window)
    if drafter is not None:
        draft_context = None if draft_model is None else draft_model.max_length
        if plan.mode != "full":
            outside = f"the model's context ({window} positions)"
        elif draft_context is not None and padded.shape[1] + max_new_tokens + drafted > draft_context:
            outside = f"the draft model's context ({draft_context} positions)"
        else:
            outside = None
            plan = dataclasses.replace(plan, segment_ends=())  # the caches hold the whole buffer from the start
        if outside is not None:
            # Drafts change no token: plain decoding (sliding its window where it must) gives the same.
            warnings.warn(
                f"The prompt, max_new_tokens and the drafted tokens ({padded.shape[1]} + {max_new_tokens} + "
                f"{drafted}) do not fit {outside}: this call decodes without drafts, with the same tokens.",
                stacklevel=3,
            )
            drafter = None
            plan = plan_decoding(model, padded.shape[1] + bucket, int(lengths.min()), window)
    if seed is None:
        seed = int(np.random.randint(0, 2**31 - 1))
    if not is_integer(seed):
        raise ValueError(f"`seed` must be an integer or None. Received: seed={seed!r}")
    seed = np.asarray(int(seed) % 2**32, np.uint32).astype(np.int32)  # any int, as 32 bits
    names = tuple(sorted(cache_inputs or {}))
    values = tuple(np.asarray(cache_inputs[name]) for name in names)
    for name, value in zip(names, values):
        if value.ndim == 0 or value.shape[0] != len(lengths):
            raise ValueError(
                f"`cache_inputs[{name!r}]` must have one row per prompt ({len(lengths)}). Received: shape={value.shape}"
            )
    steering = Steering(
        build_processors(vocabulary, stop, **processor_options),
        stop_sequence_table(stop_sequences, vocabulary),
        bool(return_logprobs),
    )
    return Request(
        padded, lengths, max_new_tokens, seed, stop, names, values, search, plan, bucket, pad_token_id,
        jit_compile, engine, steering, drafter,
    )  # fmt: skip


def resolve_drafter(
    model, search, num_tokens=None, max_matching_ngram_size=None, draft_model=None, num_draft_tokens=None
):
    """The drafter of `generate`'s options (`PromptLookup`, `DraftModel`), or `None`; refused in one line for a
    model, draft or search it cannot draft for."""
    if num_tokens is None and max_matching_ngram_size is not None:
        raise ValueError(
            "`max_matching_ngram_size` sets prompt lookup, which `prompt_lookup_num_tokens` turns on. "
            f"Received: max_matching_ngram_size={max_matching_ngram_size!r}, prompt_lookup_num_tokens=None"
        )
    if draft_model is None and num_draft_tokens is not None:
        raise ValueError(
            "`num_draft_tokens` sets speculative decoding, which `draft_model` turns on. "
            f"Received: num_draft_tokens={num_draft_tokens!r}, draft_model=None"
        )
    if num_tokens is not None and draft_model is not None:
        raise ValueError(
            "Drafts come from prompt lookup or from a draft model, not both. "
            f"Received: prompt_lookup_num_tokens={num_tokens!r}, draft_model={type(draft_model).__name__}"
        )
    if num_tokens is None and draft_model is None:
        return None
    if draft_model is None:
        drafter = PromptLookup(num_tokens, 2 if max_matching_ngram_size is None else max_matching_ngram_size)
    else:
        check_protocol(draft_model)
        drafter = DraftModel(draft_model, 4 if num_draft_tokens is None else num_draft_tokens)
        vocabulary, drafts = output_vocabulary_size(model), output_vocabulary_size(draft_model)
        if drafts != vocabulary:
            raise ValueError(
                f"`draft_model` must draft in the model's vocabulary ({vocabulary} ids). Received: a draft model "
                f"of {drafts} ids"
            )
    kind = "Prompt lookup" if draft_model is None else "Speculative decoding"
    if search.beam_size != 1:
        raise ValueError(f"{kind} drafts for one hypothesis per prompt. Received: beam_size={search.beam_size}")
    for role, decoder in (("model", model), ("draft_model", draft_model)):
        if decoder is not None and (not decoder.positional_cache or decoder.reads_prompt_rows):
            verify = ""
            if role == "model" and hasattr(decoder, "draft_model"):  # an early-exit model drafts for its backbone
                verify = "; self-speculation: model.backbone.generate(..., draft_model=model.draft_model(layers))"
            raise ValueError(
                f"{kind} needs a {role} whose caches keep each position in a slot of its own (no ring, no "
                f"recurrent state, no early exits{verify}). Received: {role}={type(decoder).__name__}"
            )
    return drafter
