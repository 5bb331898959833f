"""A compiled decoding loop never outlives the weights it was traced with (LoRA, quantization)."""

import keras
import numpy as np
import pytest
from backend import compiled, forward, greedy_by_full_passes

from keras_tfam.engine.xla_cpu import XLA_CPU
from keras_tfam.generation import Generator, GreedySampler, Sampling, ServingLoop
from keras_tfam.models import GPT2LM
from keras_tfam.models.lora import sublayers

PROMPT = [3, 1, 4, 1, 5]


def tiny():
    keras.utils.set_random_seed(0)
    return GPT2LM(vocabulary_size=41, num_layers=2, num_heads=2, hidden_dim=32, max_sequence_length=32)


def test_generate_after_enable_lora_uses_the_lora_weights():
    # Keras' own LoRA on every projection, after a first generate: the loop traced before would ignore it.
    model = tiny()
    model.generate([PROMPT], 8)
    for layer in [model, *sublayers(model)]:
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
            layer.enable_lora(2)
            draws = np.random.default_rng(len(layer.name)).normal(size=layer.lora_kernel_b.shape)
            layer.lora_kernel_b.assign(0.5 * draws)  # B = 0 at first: make the adapters matter
    expected = greedy_by_full_passes(model, PROMPT, 8)
    assert expected != greedy_by_full_passes(tiny(), PROMPT, 8)  # the adapters change the tokens
    assert model.generate([PROMPT], 8)[0].tolist() == expected


def test_generate_after_quantize_traces_a_new_loop_with_the_quantized_weights():
    model = tiny()
    model.generate([PROMPT], 8)
    loops = dict(Generator.for_model(model)._functions)
    model.quantize("int8")
    assert model.generate([PROMPT], 8)[0].tolist() == greedy_by_full_passes(model, PROMPT, 8)
    assert set(Generator.for_model(model)._functions) - set(loops)  # not the float32 loop


WEIGHT_ONLY = keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)


@pytest.mark.parametrize("config", [None, WEIGHT_ONLY], ids=["int8", "weight-only-int8"])
def test_int8_one_sequence_decodes_as_its_full_pass(config):
    """In the XLA-CPU engine one sequence decodes through int8 rows (`rows_product`), the full pass through Keras'
    int8 product.

    Token by token and prefill + steps equal the full pass (the compiled loop's greedy tokens: the test above).
    The steps are compiled (XLA on TensorFlow and JAX), as in the decoding loop.
    """
    model = tiny()
    model.quantize("int8", config=config)
    tokens = np.array([PROMPT + [7, 2, 9, 4]], "int32")
    full = forward(model, tokens)

    def in_engine(*args):
        with XLA_CPU.decoding(model.variables, rows=1):
            return model.call_with_cache(*args)

    call_with_cache = compiled(in_engine)
    for prefill in (1, 4):
        cache = model.init_cache(1, tokens.shape[1])
        step = call_with_cache(tokens[:, :prefill], cache, np.int32(0))
        logits = [keras.ops.convert_to_numpy(step.logits)]
        for t in range(prefill, tokens.shape[1]):
            step = call_with_cache(tokens[:, t : t + 1], step.cache, np.int32(t))
            logits.append(keras.ops.convert_to_numpy(step.logits))
        np.testing.assert_allclose(np.concatenate(logits, axis=1), full, rtol=1e-5, atol=1e-5)


def test_an_int8_serving_loop_run_by_the_executor_decodes_as_the_library():
    """`ServingLoop.start` runs its prefill op by op (many int8 rows by `int8_sums` in the CPU engine), the loop
    after it too, uncompiled: the greedy tokens of the library's compiled `generate`, and of full passes."""
    keras.utils.set_random_seed(0)
    model = GPT2LM(vocabulary_size=41, num_layers=2, num_heads=2, hidden_dim=32, max_sequence_length=64)
    model.quantize("int8")
    prompts = np.array([[7, *range(2, 40)], [9, *range(3, 41)]], "int32")  # 76 prefilled rows
    loop = ServingLoop(model, Sampling(GreedySampler()), fits_context=True)
    state = loop.start(prompts, np.array([39, 39]), np.array([6, 6]), np.array([0, 0]))
    tokens = keras.ops.convert_to_numpy(loop.finish(loop.run(state, compiled=False))["token_ids"])
    assert tokens.tolist() == model.generate(prompts, 6).tolist()
    assert tokens[0, 39:].tolist() == greedy_by_full_passes(model, prompts[0].tolist(), 6)[39:]
