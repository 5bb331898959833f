"""GPT-2 with the efficient attention kinds of the registry: training, cached generation, the CLI's options."""

import json

import keras
import numpy as np
import pytest
from backend import greedy_rows_by_full_passes

from keras_tfam.layers.attention.registry import ATTENTIONS
from keras_tfam.models import GPT2LM

rng = np.random.default_rng(0)
# Options that keep each kind exact under cached decoding at these lengths (one chunk of <= 32 positions).
KINDS = {
    "performer": {"num_features": 16, "redraw": 3, "seed": 0},
    "rfa": {"num_features": 8, "gating": True, "seed": 0},
    "lsh": {"num_buckets": 4, "num_hashes": 2, "chunk_length": 32, "seed": 0},
    "routing": {"num_clusters": 2, "chunk_length": 32, "seed": 0},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_cached_generation_equals_uncached_passes(kind):
    # Training steps are the layers' harness (a compiled fit) and benchmarks/efficient_attention.py's quality runs.
    assert kind in ATTENTIONS
    keras.utils.set_random_seed(1)
    model = GPT2LM(
        61,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        max_sequence_length=32,
        position="rotary",
        attention=kind,
        attention_options=KINDS[kind],
    )
    prompts = [[5, 8, 11], [40, 43, 46, 49, 52]]
    # XLA on JAX (eager JAX is slow); a plain graph on TensorFlow (XLA compiles slowly; test_gpt2_lm has it).
    generated = model.generate(prompts, max_new_tokens=8, jit_compile=keras.config.backend() == "jax")
    for row, expected in zip(generated, greedy_rows_by_full_passes(model, prompts, 8)):
        assert list(row[: len(expected)]) == expected


def test_the_cli_builds_every_registered_kind_from_its_flags():
    from pipelines.cli import build_parser
    from pipelines.config import load_config
    from pipelines.config_flags import overrides_from_args
    from pipelines.training import build_model

    for kind, options in KINDS.items():
        args = build_parser().parse_args(
            [
                "train",
                "--attention",
                kind,
                "--attention-options",
                json.dumps(options),
                "--sequence-length",
                "32",
                "--num-layers",
                "1",
                "--hidden-dim",
                "16",
                "--num-heads",
                "2",
            ]
        )
        config = load_config("gpt2_tiny", overrides_from_args(args))
        model = build_model(config, vocabulary_size=50)
        layer = model.transformer_blocks[0].self_attention_layer
        assert isinstance(layer, ATTENTIONS[kind])
        assert all(getattr(layer, name) == value for name, value in options.items())
        assert np.asarray(model(np.zeros((1, 32), "int32"))).shape == (1, 32, 50)
