"""`Option`: one declaration per model option, which the constructor, `get_config`, presets and the CLI read."""

import inspect

import numpy as np
import pytest

from keras_tfam.models import GPT2LM, TransformerXLLM
from keras_tfam.models.option import Option, check_options
from keras_tfam.models.presets import PRESETS, check_model_option, model_options
from pipelines.config import MODEL_OPTIONS

GPT2 = dict(vocabulary_size=31, num_layers=1, num_heads=2, hidden_dim=8, max_sequence_length=16)
XL = dict(vocabulary_size=31, num_layers=1, num_heads=2, hidden_dim=8, memory_length=4)
MODELS = {GPT2LM: GPT2, TransformerXLLM: XL}


@pytest.mark.parametrize("model_class", list(MODELS), ids=lambda cls: cls.__name__)
def test_every_option_is_a_constructor_argument_and_a_config_entry(model_class):
    parameters = inspect.signature(model_class.__init__).parameters
    assert set(model_class.OPTIONS) <= set(parameters)
    config = model_class(**MODELS[model_class]).get_config()
    assert set(config) == {"name", "trainable", "dtype", "vocabulary_size", *model_class.OPTIONS}
    # Every default passes its own declaration.
    defaults = {name: parameters[name].default for name in model_class.OPTIONS}
    defaults = {name: value for name, value in defaults.items() if value is not inspect.Parameter.empty}
    assert check_options({name: model_class.OPTIONS[name] for name in defaults}, defaults) == defaults


def test_the_cli_offers_the_options_of_every_preset_class():
    assert (
        set(MODEL_OPTIONS)
        == set(model_options())
        == {name for model_class, _ in PRESETS.values() for name in model_class.OPTIONS}
    )
    assert MODEL_OPTIONS["attention"] is GPT2LM.OPTIONS["attention"]


@pytest.mark.parametrize(
    "model_class, name, value, message",
    [
        (GPT2LM, "num_layers", 0, "`num_layers` must be a positive integer. Received: num_layers=0"),
        (GPT2LM, "num_layers", 2.0, "`num_layers` must be a positive integer. Received: num_layers=2.0"),
        (GPT2LM, "dropout", 1.0, "`dropout` must be a finite number in [0, 1). Received: dropout=1.0"),
        (
            GPT2LM,
            "norm_epsilon",
            float("nan"),
            "`norm_epsilon` must be a finite number > 0. Received: norm_epsilon=nan",
        ),
        (GPT2LM, "use_bias", "yes", "`use_bias` must be True or False. Received: use_bias='yes'"),
        (GPT2LM, "attention_options", [1], "`attention_options` must be a mapping. Received: attention_options=[1]"),
        (GPT2LM, "position", "sinusoid", "`position` must be one of ('learned', 'none', "),
        (
            GPT2LM,
            "local_layers",
            "first",
            "`local_layers` must be one of ('odd', 'even', 'all') or a list of layer "
            "indices. Received: local_layers='first'",
        ),
        (
            GPT2LM,
            "local_layers",
            [0, -1],
            "`local_layers` must list non-negative layer indices. Received: local_layers=[0, -1]",
        ),
        (
            TransformerXLLM,
            "memory_length",
            -1,
            "`memory_length` must be a non-negative integer (0: no memory). Received: memory_length=-1",
        ),
        (
            TransformerXLLM,
            "span_penalty",
            -1e-6,
            "`span_penalty` must be a finite number >= 0. Received: span_penalty=-1e-06",
        ),
        (
            TransformerXLLM,
            "compression",
            "sum",
            "`compression` must be one of ('mean', 'max', 'conv'). Received: compression='sum'",
        ),
    ],
)
def test_the_constructor_and_the_preset_check_refuse_alike(model_class, name, value, message):
    with pytest.raises(ValueError) as from_check:
        check_model_option(model_class, name, value)
    with pytest.raises(ValueError) as from_constructor:
        model_class(**{**MODELS[model_class], name: value})
    assert str(from_check.value) == str(from_constructor.value)
    assert str(from_check.value).startswith(message) and "\n" not in str(from_check.value)


def test_an_unknown_option_names_the_class_options():
    message = r"GPT2LM has no option `memory_length`; its options: .*Received: memory_length=4"
    with pytest.raises(ValueError, match=message):
        check_model_option(GPT2LM, "memory_length", 4)


def test_numpy_scalars_become_python_values():
    assert type(check_model_option(GPT2LM, "num_layers", np.int64(3))) is int
    assert type(check_model_option(GPT2LM, "dropout", np.float32(0.5))) is float
    assert check_model_option(GPT2LM, "dropout", 0) == 0.0  # an integer is a number
    assert check_model_option(GPT2LM, "use_bias", np.bool_(False)) is False
    assert check_model_option(GPT2LM, "local_layers", (np.int64(0), 2)) == [0, 2]
    model = GPT2LM(**{**GPT2, "num_layers": np.int32(2), "dropout": np.float64(0.25)})
    assert type(model.get_config()["num_layers"]) is int and type(model.get_config()["dropout"]) is float


def test_zero_is_a_setting_only_where_declared():
    assert check_model_option(TransformerXLLM, "memory_length", 0) == 0
    assert TransformerXLLM(**{**XL, "memory_length": 0}).has_memory is False
    message = r"`compression_rate` must be a positive integer. Received: compression_rate=0"
    with pytest.raises(ValueError, match=message):
        check_model_option(TransformerXLLM, "compression_rate", 0)


def test_optional_options_take_none_and_derive_their_value():
    assert check_model_option(GPT2LM, "intermediate_dim", None) is None
    config = GPT2LM(**GPT2).get_config()
    assert (config["intermediate_dim"], config["head_dim"], config["num_key_value_heads"]) == (32, 4, 2)
    with pytest.raises(ValueError, match=r"`num_layers` must be a positive integer. Received: num_layers=None"):
        check_model_option(GPT2LM, "num_layers", None)


def test_choices_are_read_at_each_check():
    names = ["a"]
    option = Option(str, choices=lambda: tuple(names))
    assert option.check("kind", "a") == "a"
    with pytest.raises(ValueError, match=r"`kind` must be one of \('a',\). Received: kind='b'"):
        option.check("kind", "b")
    names.append("b")
    assert option.check("kind", "b") == "b" and option.values() == ("a", "b")


def test_a_declaration_is_checked_itself():
    with pytest.raises(ValueError, match=r"`kind` must be one of \('int', 'float', 'bool', 'dict', 'str'\)"):
        Option(list)
    with pytest.raises(ValueError, match=r"A `str` option, and only it, has `choices`"):
        Option(int, choices=("a",))
