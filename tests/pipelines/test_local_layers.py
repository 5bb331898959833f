"""`tfam train` options for local (sliding-window) layers, read from GPT2LM.OPTIONS."""

import pytest

from keras_tfam.layers.attention.patterns import SlidingWindow
from pipelines.cli import build_parser
from pipelines.config import load_config
from pipelines.config_flags import overrides_from_args
from pipelines.training import build_model


def test_flags_build_a_model_with_alternating_dense_and_local_layers():
    args = build_parser().parse_args(
        [
            "train",
            "--num-layers",
            "4",
            "--hidden-dim",
            "32",
            "--num-heads",
            "2",
            "--sequence-length",
            "64",
            "--local-window",
            "16",
            "--local-layers",
            "odd",
        ]
    )
    config = load_config("gpt2_tiny", overrides_from_args(args))
    assert config.model_options["local_window"] == 16
    model = build_model(config, vocabulary_size=50)
    patterns = [block.self_attention_layer.pattern for block in model.transformer_blocks]
    assert patterns == [None, SlidingWindow(16), None, SlidingWindow(16)]


def test_a_pattern_for_every_layer_through_attention_options():
    config = load_config(
        "gpt2_tiny", {"num_layers": 2, "attention_options": {"pattern": {"name": "strided", "stride": 8}}}
    )
    model = build_model(config, vocabulary_size=50)
    assert all(block.self_attention_layer.pattern.stride == 8 for block in model.transformer_blocks)


def test_bad_values_are_config_errors():
    with pytest.raises(ValueError, match="Received: local_layers='middle'"):
        load_config("gpt2_tiny", {"local_layers": "middle"})
    with pytest.raises(ValueError, match="Received: local_window=0"):
        load_config("gpt2_tiny", {"local_window": 0})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--local-layers", "middle"])
