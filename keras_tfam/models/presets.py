"""Models by preset name: the list `tfam train --model` and `from_preset` read.

A preset is a model class and its constructor arguments. A model family
adds its presets here; the options a user may set on top of a preset are
the class's own `OPTIONS` (`{argument: Option}`, see `keras_tfam.models.option`).
"""

from keras_tfam.models.gpt2_lm import GPT2LM
from keras_tfam.models.gpt2_presets import GPT2_PRESETS
from keras_tfam.models.transformer_xl_lm import TransformerXLLM
from keras_tfam.models.transformer_xl_presets import TRANSFORMER_XL_PRESETS

PRESETS = {name: (GPT2LM, arguments) for name, arguments in GPT2_PRESETS.items()}
PRESETS.update({name: (TransformerXLLM, arguments) for name, arguments in TRANSFORMER_XL_PRESETS.items()})


def get_preset(name):
    """`(model class, constructor arguments)` of preset `name`; a `ValueError` otherwise."""
    if name not in PRESETS:
        raise ValueError(f"`model` must be one of {tuple(PRESETS)}. Received: model={name!r}")
    model_class, arguments = PRESETS[name]
    return model_class, dict(arguments)


def model_options():
    """`{option: Option}` over every preset's model class (what the CLI offers)."""
    options = {}
    for model_class, _ in PRESETS.values():
        options.update(model_class.OPTIONS)
    return options


def check_model_option(model_class, name, value):
    """`value` checked against `model_class.OPTIONS[name]`: a `ValueError` naming `name`, or the value.

    The check the constructor makes: NumPy scalars are accepted and returned
    as Python numbers, a closed set is read from its registry now.
    """
    if name not in model_class.OPTIONS:
        raise ValueError(
            f"{model_class.__name__} has no option `{name}`; its options: {sorted(model_class.OPTIONS)}. "
            f"Received: {name}={value!r}"
        )
    return model_class.OPTIONS[name].check(name, value)
