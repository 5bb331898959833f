"""One harness every decoding model passes.

For each model: it is a `DecodingModel`; its `DecodeStep`s carry hidden states exactly when it
declares `returns_hidden_states`; the full pass == token-by-token decoding == prompt prefill + steps
(float32, <= 1e-5); and greedy `generate` picks, at every step, the argmax of the full pass over the
sequence so far. GPT-2 LMs are built for every registered decoder attention kind (read at run time).
"""

import keras
import numpy as np
import pytest
from backend import forward

from keras_tfam.engine.xla_cpu import XLA_CPU
from keras_tfam.generation import DecodingModel, Generator, check_protocol
from keras_tfam.layers.attention.registry import attention_kinds
from keras_tfam.models import (
    GPT2LM,
    KNNLM,
    AttentionPoolingLM,
    DecisionTransformer,
    DecoderLM,
    EarlyExitLM,
    Transformer,
    TransformerXLLM,
)
from keras_tfam.retrieval import Datastore

VOCABULARY, LENGTH = 13, 9
# JAX compiles the decoding loop faster than it runs it op by op; TensorFlow the other way round.
JIT = keras.config.backend() == "jax"
TINY = dict(vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=8, max_sequence_length=16)


def numpy(tensor):
    """A backend tensor as NumPy (torch's need detaching)."""
    return keras.ops.convert_to_numpy(tensor)


def _seeded(factory):
    def make():
        keras.utils.set_random_seed(3)
        return factory()

    return make


def _gpt2(kind, **overrides):
    cls = attention_kinds(decoder=True)[kind]
    options = cls.example_options[0]
    position = "learned" if kind == "softmax" else "rotary" if cls.accepts_position else "none"
    return GPT2LM(**TINY, attention=kind, attention_options=options, position=position, **overrides)


def _txl(**overrides):
    return TransformerXLLM(VOCABULARY, num_layers=2, num_heads=2, hidden_dim=8, memory_length=LENGTH, **overrides)


def _knn(lm):
    stream = np.random.default_rng(5).integers(0, VOCABULARY, size=3 * LENGTH + 1)
    inputs, targets = stream[:-1].reshape(3, LENGTH), stream[1:].reshape(3, LENGTH)
    return KNNLM(lm, Datastore.from_model(lm, inputs, targets, k=4), interpolation=0.3)


def _source():
    return np.random.default_rng(6).integers(1, VOCABULARY, size=(2, 5)).astype("int32")


MODELS = {
    **{f"gpt2_{kind}": (lambda kind=kind: _gpt2(kind)) for kind in attention_kinds(decoder=True)},
    "gpt2_local_layers_alibi": lambda: GPT2LM(**TINY, position="alibi", local_window=3, num_key_value_heads=1),
    # Every option of the Llama family at once (the imported checkpoints' conventions), on a local layer too.
    "gpt2_llama_family_options": lambda: DecoderLM(
        **TINY,
        head_dim=6,
        num_key_value_heads=1,
        position="rotary",
        norm="gemma_rms",
        activation="geglu_tanh",
        position_options={
            "max_wavelength": 5e5,
            "pairing": "half",
            "scaling": {
                "type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 4,
            },
        },
        use_bias=False,
        attention_options={"qkv_bias": True},
        tie_embeddings=False,
        embedding_scale=2.0,
        local_window=3,
        local_layers=[1],
    ),
    "transformer_xl": _txl,
    "transformer_xl_gtrxl_adaptive_span": lambda: _txl(residual="gru", max_span=6),
    "compressive_transformer": lambda: _txl(compressed_memory_length=4, compression_rate=2),
    "early_exit": lambda: EarlyExitLM(GPT2LM(**TINY), threshold=1.0),
    "knn_lm_over_gpt2": lambda: _knn(GPT2LM(**TINY)),
    "knn_lm_over_transformer_xl": lambda: _knn(_txl()),
    "knn_lm_over_early_exit": lambda: _knn(EarlyExitLM(GPT2LM(**TINY), threshold=1.0)),
    "attention_pooling": lambda: AttentionPoolingLM(
        VOCABULARY, context_length=4, num_layers=1, num_heads=2, hidden_dim=8
    ),
    "transformer": lambda: Transformer(vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=8),
}


def cache_inputs(model):
    return {"source": _source()} if isinstance(model, Transformer) else {}


def full_pass(model, tokens):
    """`(B, T, V)` logits of every position in one pass."""
    if isinstance(model, AttentionPoolingLM):
        width = model.context_length
        padded = np.pad(tokens, [[0, 0], [width, 0]])
        windows = np.stack([padded[:, p + 1 : p + 1 + width] for p in range(tokens.shape[1])], axis=1)
        return forward(model, windows.reshape(-1, width)).reshape(*tokens.shape, -1)
    if isinstance(model, (TransformerXLLM, Transformer)) or (
        isinstance(model, KNNLM) and isinstance(model.lm, TransformerXLLM)
    ):
        return numpy(
            model.call_with_cache(
                tokens, model.init_cache(len(tokens), tokens.shape[1], **cache_inputs(model)), 0
            ).logits
        )
    return forward(model, tokens)


def stepwise(model, tokens, prefill):
    cache = model.init_cache(len(tokens), tokens.shape[1], **cache_inputs(model))
    step = model.call_with_cache(tokens[:, :prefill], cache, 0)
    outputs = [numpy(step.logits)]
    assert (step.hidden_states is not None) == bool(model.returns_hidden_states)
    for t in range(prefill, tokens.shape[1]):
        step = model.call_with_cache(tokens[:, t : t + 1], step.cache, t)
        outputs.append(numpy(step.logits))
    return np.concatenate(outputs, axis=1)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return _seeded(MODELS[request.param])()


def test_is_a_declared_decoding_model(model):
    assert isinstance(model, DecodingModel)
    check_protocol(model)


def test_full_pass_equals_token_by_token_and_prefill_plus_steps(model):
    tokens = np.random.default_rng(1).integers(0, VOCABULARY, size=(2, LENGTH)).astype("int32")
    full = full_pass(model, tokens)
    for prefill in (1, 4):
        np.testing.assert_allclose(stepwise(model, tokens, prefill), full, rtol=1e-5, atol=1e-5)


def test_greedy_generate_is_the_argmax_of_the_full_pass_on_the_growing_sequence(model):
    if isinstance(model, Transformer):
        source = _source()
        stop = VOCABULARY - 1
        generated = model.generate(source, start_token_id=1, stop_token_id=stop, max_length=4, jit_compile=JIT)
        tokens = np.concatenate([np.ones((2, 1), "int32"), numpy(generated).astype("int32")], axis=1)
        logits = numpy(model.call_with_cache(tokens, model.init_cache(2, tokens.shape[1], source=source), 0).logits)
        for row in range(2):
            for t in range(1, tokens.shape[1]):
                assert int(logits[row, t - 1].argmax()) == int(tokens[row, t]), (row, t)
                if tokens[row, t] == stop:
                    break  # then padding
        return
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    generated = numpy(model.generate(prompts, max_new_tokens=4, jit_compile=JIT)).astype("int32")
    # The full pass over the whole sequence gives, at position t - 1, what the full pass over
    # `sequence[:t]` gives (checked: causal), so one pass holds every step's argmax; the shorter row's
    # padding comes after all its positions.
    logits = full_pass(model, generated)
    prefix = full_pass(model, generated[:, : len(prompts[0]) + 1])
    np.testing.assert_allclose(prefix, logits[:, : prefix.shape[1]], rtol=1e-5, atol=1e-5)
    for row, prompt in enumerate(prompts):
        for t in range(len(prompt), len(prompt) + 4):
            assert int(logits[row, t - 1].argmax()) == int(generated[row, t]), (row, t)


# The engine changes the products of `Dense` and `TiedEmbedding` layers (and 16-bit caches' storage), which
# every attention kind feeds alike, `(B, T, D)` projections of the hidden states: its test takes one GPT-2 of
# each head and layer layout, and every other model.
ENGINE_MODELS = sorted(
    name for name in MODELS if not name.startswith("gpt2_") or name in ("gpt2_softmax", "gpt2_local_layers_alibi",
                                                                        "gpt2_llama_family_options")
)  # fmt: skip


@pytest.mark.parametrize("model", ENGINE_MODELS, indirect=True)
def test_greedy_tokens_are_the_same_with_the_engine_on_and_off(model):
    """The plain engine (Keras' own computation) and the XLA-CPU engine's forms (the same sums in another order,
    or exactly) choose the same float32 greedy tokens, for one sequence (one-row forms) and a batch (a few rows)."""
    generator = Generator.for_model(model)
    for prompts in ([[3, 1, 4, 1, 5]], [[3, 1, 4, 1, 5], [9, 2, 6]]):
        options = dict(max_new_tokens=4, jit_compile=JIT)
        if isinstance(model, Transformer):
            prompts = np.ones((len(prompts), 1), "int32")  # the start token, then the target
            options["cache_inputs"] = {"source": _source()[: len(prompts)]}
        plain = generator.generate(prompts, engine="plain", **options)
        for engine in ("auto", XLA_CPU):
            np.testing.assert_array_equal(generator.generate(prompts, engine=engine, **options), plain)


def test_decision_transformer_actions_depend_on_the_past_only():
    # Not a token LM (its inputs are trajectories): decoding it means predicting each action from the
    # trajectory so far, which must equal the full pass's prediction there.
    keras.utils.set_random_seed(4)
    model = DecisionTransformer(
        state_dim=3, num_actions=4, max_timestep=20, hidden_dim=8, num_layers=1, num_heads=2, dropout=0.0
    )
    rng = np.random.default_rng(2)
    inputs = {
        "returns_to_go": rng.normal(size=(1, 6)).astype("float32"),
        "states": rng.normal(size=(1, 6, 3)).astype("float32"),
        "actions": rng.integers(0, 4, size=(1, 6)).astype("int32"),
        "timesteps": np.arange(6, dtype="int32")[None],
    }
    full = numpy(model(inputs))
    for t in range(1, 7):
        prefix = {name: value[:, :t] for name, value in inputs.items()}
        np.testing.assert_allclose(numpy(model(prefix)), full[:, :t], rtol=1e-5, atol=1e-5)
