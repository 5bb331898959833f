import keras
import keras_hub
import numpy as np

from keras_tfam.models import GPT2LM


def test_logits_and_greedy_generation_equal_keras_hub():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=97, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=128, max_sequence_length=64
    )
    model = GPT2LM.from_keras_hub(backbone)
    tokens = np.random.default_rng(0).integers(0, 97, size=(2, 11))
    hidden = backbone({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})
    expected = keras.ops.convert_to_numpy(backbone.token_embedding(hidden, reverse=True))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(tokens)), expected, atol=1e-5)

    causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    causal_lm.compile(sampler="greedy")
    prompt = tokens[:, :6]
    length = 6 + 10
    padded = np.zeros((2, length), "int32")
    padded[:, :6] = prompt
    mask = np.zeros((2, length), bool)
    mask[:, :6] = True
    theirs = causal_lm.generate({"token_ids": padded, "padding_mask": mask}, stop_token_ids=None)
    ours = model.generate(prompt, max_new_tokens=10)
    np.testing.assert_array_equal(ours, np.asarray(theirs["token_ids"]))
