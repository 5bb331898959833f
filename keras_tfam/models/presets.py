"""Models by preset name: the list `tfam train --model` and `from_preset` read.

A preset is a model class and its constructor arguments. A model family
adds its presets here; the options a user may set on top of a preset are
the class's own `OPTIONS` (argument -> type, or its closed set of values).
"""

import math

import numpy as np

from keras_tfam.models.gpt2_lm import GPT2LM
from keras_tfam.models.gpt2_presets import GPT2_PRESETS
from keras_tfam.models.transformer_xl_lm import TransformerXLLM
from keras_tfam.models.transformer_xl_presets import TRANSFORMER_XL_PRESETS
from keras_tfam.utils import is_integer

PRESETS = {name: (GPT2LM, arguments) for name, arguments in GPT2_PRESETS.items()}
PRESETS.update({name: (TransformerXLLM, arguments) for name, arguments in TRANSFORMER_XL_PRESETS.items()})

# Integer options whose 0 is a setting (the feature off: no memory, no compressed memory); the
# other integer options are sizes, at least 1.
ZERO_MEANS_OFF = {TransformerXLLM: ("memory_length", "compressed_memory_length")}


def get_preset(name):
    """`(model class, constructor arguments)` of preset `name`; a `ValueError` otherwise."""
    if name not in PRESETS:
        raise ValueError(f"`model` must be one of {tuple(PRESETS)}. Received: model={name!r}")
    model_class, arguments = PRESETS[name]
    return model_class, dict(arguments)


def model_options():
    """`{option: type or choices}` over every preset's model class (what the CLI offers)."""
    options = {}
    for model_class, _ in PRESETS.values():
        options.update(model_class.OPTIONS)
    return options


_KINDS = {int: "an integer", float: "a finite number", bool: "a boolean", dict: "a mapping", str: "a string"}


def check_model_option(model_class, name, value):
    """`value` checked against `model_class.OPTIONS[name]`: a `ValueError` naming `name`, or the value.

    NumPy scalars are accepted and returned as Python numbers (an integer of
    any integer type for an `int` option).
    """
    if name not in model_class.OPTIONS:
        raise ValueError(
            f"{model_class.__name__} has no option `{name}`; its options: {sorted(model_class.OPTIONS)}. "
            f"Received: {name}={value!r}"
        )
    kind = model_class.OPTIONS[name]
    if isinstance(kind, tuple):
        if not isinstance(value, (str, type(None))) or value not in kind:
            raise ValueError(f"`{name}` must be one of {kind}. Received: {name}={value!r}")
        return value
    if kind is int:
        valid = is_integer(value)
    elif kind is float:
        valid = (is_integer(value) or isinstance(value, (float, np.floating))) and math.isfinite(value)
    elif kind is bool:
        valid = isinstance(value, (bool, np.bool_))
    else:
        valid = isinstance(value, kind)
    if not valid:
        raise ValueError(f"`{name}` must be {_KINDS.get(kind, kind.__name__)}. Received: {name}={value!r}")
    if kind is int and name in ZERO_MEANS_OFF.get(model_class, ()):
        if value < 0:
            raise ValueError(f"`{name}` must be a non-negative integer (0: none). Received: {name}={value!r}")
    elif kind is int and value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    if kind is int:
        return int(value)
    if kind is float:
        return float(value)
    if kind is bool:
        return bool(value)
    return value
