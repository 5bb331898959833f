"""Attention patterns by name: `get_pattern` turns a name and arguments, or a config, into a pattern.

A pattern registers itself next to its class (`@register_pattern("name")`)
and `patterns/__init__.py` imports its file: a new pattern is a new file
plus one import line; attention takes any `AttentionPattern` and never
branches on the kind.
"""

import keras

from keras_tfam.layers.attention.patterns.attention_pattern import AttentionPattern

# name -> class, filled by `register_pattern` as the pattern files are imported.
PATTERNS = {}


def register_pattern(name):
    """Class decorator: registers an `AttentionPattern` subclass under `name` (for configs and the CLI)."""

    def register(cls):
        PATTERNS[name] = cls
        return cls

    return register


def get_pattern(pattern):
    """An `AttentionPattern` from a pattern, `None`, a name, or a config.

    Args:
        pattern: an `AttentionPattern`; `None`; a dict `{"name": NAME,
            **arguments}` with `NAME` a key of `PATTERNS` (e.g.
            `{"name": "sliding_window", "window": 256}`, as a training
            config gives it); or a serialized pattern
            (`keras.saving.serialize_keras_object`).

    Raises:
        ValueError: naming the unknown pattern, or the missing or unexpected
            arguments.
    """
    if pattern is None or isinstance(pattern, AttentionPattern):
        return pattern
    if isinstance(pattern, dict) and "class_name" in pattern:
        return keras.saving.deserialize_keras_object(pattern)
    if isinstance(pattern, str):
        name, arguments = pattern, {}
    elif isinstance(pattern, dict):
        arguments = dict(pattern)
        name = arguments.pop("name", None)
    else:
        raise ValueError(
            "`pattern` must be an AttentionPattern, a dict {'name': ..., **arguments} or None. "
            f"Received: pattern={pattern!r}"
        )
    if name not in PATTERNS:
        raise ValueError(f"`pattern` must be one of {tuple(PATTERNS)}. Received: pattern={name!r}")
    try:
        return PATTERNS[name](**arguments)
    except TypeError as error:
        raise ValueError(f"Bad arguments for the {name!r} pattern ({error}). Received: pattern={pattern!r}") from None


def interleave(patterns, num_layers):
    """One pattern per layer, cycling through `patterns`: the Sparse Transformer's interleaved subsets.

    Child et al. 2019, section 4.3: layer `r` uses `A(r mod p)`.

    Examples:
        >>> interleave([Strided(32, subset=1), Strided(32, subset=2)], 4)  # A(1), A(2), A(1), A(2)
        [Strided(stride=32, subset=1), Strided(stride=32, subset=2),
         Strided(stride=32, subset=1), Strided(stride=32, subset=2)]
    """
    patterns = [get_pattern(pattern) for pattern in patterns]
    if not patterns:
        raise ValueError(f"`patterns` must be a non-empty list of patterns. Received: patterns={patterns!r}")
    return [patterns[layer % len(patterns)] for layer in range(num_layers)]
