"""A model option's closed set is read from its registry at each check: an attention kind registered after
import is accepted by the constructor, the config round trip, the preset check and `tfam train`'s flags alike,
and refused by all four once it is gone."""

import keras
import numpy as np
import pytest

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.attention.registry import attention_kinds, register_attention, unregister_attention
from keras_tfam.models import GPT2LM
from keras_tfam.models.presets import check_model_option
from pipelines.cli import build_parser
from pipelines.config import load_config
from pipelines.config_flags import overrides_from_args

KIND = "softmax_registered_at_test_time"
TINY = dict(vocabulary_size=31, num_layers=1, num_heads=2, hidden_dim=8, max_sequence_length=16)


def _register():
    @register_attention(KIND)
    class RegisteredAtTestTime(MultiHeadAttention):
        """Softmax attention under a name that did not exist when the library was imported."""

    return RegisteredAtTestTime


def _unregister():
    # The test takes back what it added, so that no other test sees it.
    if KIND in attention_kinds():
        unregister_attention(KIND)


def _train_flags_accept(kind):
    """Whether `tfam train --attention kind` parses and validates (a usage error exits with 2)."""
    try:
        args = build_parser().parse_args(["train", "--attention", kind])
    except SystemExit as exit_:
        assert exit_.code == 2
        return False
    assert load_config("gpt2_tiny", overrides_from_args(args)).model_options == {"attention": kind}
    return True


def test_a_kind_registered_after_import_is_accepted_everywhere_and_refused_once_gone(capsys):
    assert KIND not in attention_kinds()
    kind_class = _register()
    try:
        keras.utils.set_random_seed(0)
        model = GPT2LM(**TINY, attention=KIND)
        assert isinstance(model.transformer_blocks[0].self_attention_layer, kind_class)
        config = model.get_config()
        assert config["attention"] == KIND
        restored = GPT2LM.from_config(config)
        assert isinstance(restored.transformer_blocks[0].self_attention_layer, kind_class)
        restored.set_weights(model.get_weights())
        tokens = np.arange(10, dtype="int32").reshape(1, 10) % TINY["vocabulary_size"]
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(restored(tokens)),
            keras.ops.convert_to_numpy(model(tokens)),
            rtol=1e-6,
            atol=1e-6,
        )
        assert check_model_option(GPT2LM, "attention", KIND) == KIND
        assert _train_flags_accept(KIND)
    finally:
        _unregister()
    assert KIND not in attention_kinds()
    with pytest.raises(ValueError, match=f"`attention` must be one of .*Received: attention='{KIND}'"):
        GPT2LM(**TINY, attention=KIND)
    with pytest.raises(ValueError, match=f"`attention` must be one of .*Received: attention='{KIND}'"):
        GPT2LM.from_config(config)
    with pytest.raises(ValueError, match=f"`attention` must be one of .*Received: attention='{KIND}'"):
        check_model_option(GPT2LM, "attention", KIND)
    assert not _train_flags_accept(KIND)
    assert f"argument --attention: invalid choice: '{KIND}'" in capsys.readouterr().err
