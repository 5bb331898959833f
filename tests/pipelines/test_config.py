"""Configuration from flags and JSON files: every bad value is one line naming it, before any work."""

import argparse
import json
import re

import numpy as np
import pytest

from pipelines.config import load_config
from pipelines.config_flags import parse_bool


@pytest.mark.parametrize(
    "text, value",
    [
        ("true", True),
        ("YES", True),
        ("On", True),
        ("1", True),
        ("false", False),
        ("no", False),
        ("OFF", False),
        ("0", False),
        (" Yes ", True),
    ],
)
def test_boolean_flags_take_the_usual_spellings(text, value):
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["maybe", "", "2", "truee", "nan"])
def test_other_boolean_spellings_are_a_usage_error(text):
    # `--use-bias yes` was a KeyError traceback (exit 1).
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"Received: {text!r}")):
        parse_bool(text)


@pytest.mark.parametrize("content, kind", [([1, 2], "list"), ("gpt2", "string"), (3, "number"), (None, "null")])
def test_a_json_config_that_is_not_an_object_is_one_line(tmp_path, content, kind):
    # A list was a TypeError traceback.
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError) as error:
        load_config(str(path))
    message = str(error.value)
    assert "\n" not in message
    assert message == (
        f"Invalid config: {str(path)!r} must hold a JSON object of config keys and values. Received: a JSON {kind}"
    )


def test_a_config_file_that_is_not_json_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{'learning_rate': 1e-3}")
    with pytest.raises(ValueError, match=r"is not valid JSON \(Expecting property name") as error:
        load_config(str(path))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "model, overrides, received",
    [
        ("gpt2_tiny", {"norm_epsilon": -1e-5}, "norm_epsilon=-1e-05"),
        ("gpt2_tiny", {"norm_epsilon": 0.0}, "norm_epsilon=0.0"),
        ("transformer_xl_tiny", {"span_penalty": -2e-6}, "span_penalty=-2e-06"),
        ("transformer_xl_tiny", {"reconstruction_weight": -1.0}, "reconstruction_weight=-1.0"),
        ("transformer_xl_tiny", {"memory_length": -1}, "memory_length=-1"),
        ("gpt2_tiny", {"local_layers": "even"}, "local_layers='even', local_window=None"),
    ],
)
def test_model_options_out_of_range_are_refused(model, overrides, received):
    with pytest.raises(ValueError) as error:
        load_config("gpt2_tiny", {"model": model, **overrides})
    message = str(error.value)
    assert "\n" not in message and message.endswith(f"Received: {received}"), message


def test_zero_memory_is_a_transformer_xl_setting():
    # `memory_length 0` (no memory) was refused as "not a positive integer"; the model takes it.
    config = load_config(
        "gpt2_tiny",
        {"model": "transformer_xl_tiny", "memory_length": 0, "compressed_memory_length": 0, "span_penalty": 0.0},
    )
    assert config.model_options["memory_length"] == 0
    from pipelines.training import build_model

    model = build_model(config, vocabulary_size=50)
    assert model.memory_length == 0 and not model.has_memory  # the model takes it: no memory
    with pytest.raises(ValueError, match="Received: num_layers=0$"):  # other sizes stay positive
        load_config("gpt2_tiny", {"model": "transformer_xl_tiny", "num_layers": 0})


def test_local_layers_with_a_window_are_accepted():
    config = load_config("gpt2_tiny", {"local_window": 8, "local_layers": "even"})
    assert config.model_options == {"local_window": 8, "local_layers": "even"}


def test_numpy_scalars_are_stored_as_python_numbers():
    import numpy as np

    config = load_config(
        "gpt2_tiny",
        {
            "batch_size": np.int64(4),
            "learning_rate": np.float32(0.5),
            "num_layers": np.int32(2),
            "dropout": np.float64(0.25),
        },
    )
    assert (config.batch_size, config.learning_rate) == (4, 0.5) and type(config.batch_size) is int
    assert (
        config.model_options == {"num_layers": 2, "dropout": 0.25} and type(config.model_options["num_layers"]) is int
    )
    json.dumps(config.to_dict())  # config.json can hold it


def test_export_is_a_boolean_in_a_config_file_and_on_the_command_line(tmp_path):
    assert load_config("gpt2_tiny").export is True
    assert load_config("gpt2_tiny", {"export": np.bool_(False)}).export is False
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"export": "no"}))  # a string in JSON is not a boolean
    with pytest.raises(ValueError, match=r"`export` must be a boolean \(true or false\). Received: export='no'"):
        load_config(str(path))
    with pytest.raises(ValueError, match=r"`export_dir` must be unset with `export` off. Received: export_dir='x'"):
        load_config("gpt2_tiny", {"export": False, "export_dir": "x"})


def test_export_batch_sizes_are_a_list_in_a_config_file_and_commas_on_the_command_line(tmp_path):
    from pipelines.cli import build_parser
    from pipelines.config_flags import overrides_from_args

    assert load_config("gpt2_tiny").export_batch_sizes == (1, 2, 4, 8)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"export_batch_sizes": [4, 1, 4]}))
    config = load_config(str(path))
    assert config.export_batch_sizes == (1, 4)
    assert json.loads(json.dumps(config.to_dict()))["export_batch_sizes"] == [1, 4]  # config.json holds it
    args = build_parser().parse_args(["train", "--export-batch-sizes", "8,2"])
    assert load_config("gpt2_tiny", overrides_from_args(args)).export_batch_sizes == (2, 8)
    for value in ([], [0, 1], "1,2", [1.5]):
        with pytest.raises(ValueError, match=r"`export_batch_sizes` must be a non-empty list of positive integers\. "):
            load_config("gpt2_tiny", {"export_batch_sizes": value})


def test_a_model_option_set_twice_in_a_config_file_is_refused(tmp_path):
    # The top level won silently over `model_options`.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_layers": 2, "model_options": {"num_layers": 4, "dropout": 0.1}}))
    with pytest.raises(ValueError) as error:
        load_config(str(path))
    assert str(error.value) == (
        f"Invalid config: `num_layers` is set both at the top level and under `model_options` in {path}: set it "
        "once. Received: num_layers=2 and model_options.num_layers=4"
    )
    path.write_text(json.dumps({"num_layers": 2, "model_options": {"dropout": 0.1}}))  # once each: both kept
    assert load_config(str(path)).model_options == {"num_layers": 2, "dropout": 0.1}


def test_model_options_that_are_not_a_mapping_are_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_options": ["num_layers", 2]}))
    with pytest.raises(ValueError) as error:
        load_config(str(path))
    assert str(error.value) == (
        "Invalid config: `model_options` must be a mapping. Received: model_options=['num_layers', 2]"
    )
