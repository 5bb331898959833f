"""keras.distribution on two virtual CPU devices (JAX): DecoderLM.get_layout_map shards the weights
(Megatron's split), and data-parallel and model-parallel training equal single-device training."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json
    import keras
    import numpy as np
    from keras_tfam.models import DecoderLM

    def build():
        keras.utils.set_random_seed(0)
        return DecoderLM(vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64,
                         position="rotary", norm="rms", activation="swiglu", num_key_value_heads=2,
                         tie_embeddings=False, use_bias=False)

    rng = np.random.default_rng(0)
    x = rng.integers(0, 64, (8, 13))

    def train(model, weights):
        model.set_weights(weights)
        model.compile(keras.optimizers.SGD(0.5), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x[:, :-1], x[:, 1:], batch_size=4, epochs=2, shuffle=False, verbose=0)
        return [keras.ops.convert_to_numpy(w) for w in model.weights]

    single = build()
    weights = single.get_weights()
    logits = keras.ops.convert_to_numpy(single(x))
    trained = train(single, weights)

    devices = keras.distribution.list_devices()
    results = {"devices": len(devices)}
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices)
    layouts = {
        "model_parallel": keras.distribution.ModelParallel(
            layout_map=DecoderLM.get_layout_map(mesh), batch_dim_name="batch"),
        "data_parallel": keras.distribution.DataParallel(devices=devices),
    }
    for name, distribution in layouts.items():
        with distribution.scope():
            model = build()
            model.set_weights(weights)
            query = model.transformer_blocks[0].self_attention_layer.query_dense.kernel
            shards = len({tuple(map(str, shard.index)) for shard in query.value.addressable_shards})
            error = float(np.abs(keras.ops.convert_to_numpy(model(x)) - logits).max())
            after = train(model, weights)
        results[name] = dict(
            logits_error=error,
            weights_error=max(float(np.abs(a - b).max()) for a, b in zip(after, trained)),
            moved=max(float(np.abs(a - b).max()) for a, b in zip(after, weights)),
            query_shards=shards,
        )
    # GPT-2's vocabulary (50,257) is no multiple of the model axis: a vocabulary of 61 on 2 devices.
    from keras_tfam.models import GPT2LM

    def gpt2():
        keras.utils.set_random_seed(0)
        return GPT2LM(vocabulary_size=61, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)

    ids = rng.integers(0, 61, (2, 9))
    expected = keras.ops.convert_to_numpy(gpt2()(ids))
    with layouts["model_parallel"].scope():
        model = gpt2()
        embedding = model.token_embedding.embeddings
        results["odd_vocabulary"] = dict(
            logits_error=float(np.abs(keras.ops.convert_to_numpy(model(ids)) - expected).max()),
            embedding_shards=len({tuple(map(str, shard.index)) for shard in embedding.value.addressable_shards}),
        )
    print(json.dumps(results))
    """
)


def test_model_and_data_parallel_training_equal_one_device():
    pytest.importorskip("jax")
    environment = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        # The suite's compiler flags (scripts/test.sh), and two host devices.
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip(),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results["devices"] == 2
    for name in ("model_parallel", "data_parallel"):
        outcome = results[name]
        assert outcome["logits_error"] < 1e-5 and outcome["weights_error"] < 1e-5, (name, outcome)
        assert outcome["moved"] > 1e-3, (name, outcome)  # training changed the weights
    assert results["model_parallel"]["query_shards"] == 2  # split over the model axis
    assert results["data_parallel"]["query_shards"] == 1  # replicated
    assert results["odd_vocabulary"]["logits_error"] < 1e-5, results["odd_vocabulary"]
    assert results["odd_vocabulary"]["embedding_shards"] == 2  # split by the hidden width


def test_a_layout_map_needs_the_mesh_axes_it_names():
    import keras

    from keras_tfam.models import DecoderLM

    mesh = keras.distribution.DeviceMesh((1,), ["batch"], keras.distribution.list_devices()[:1])
    with pytest.raises(ValueError, match=r"'model' is not an axis of the device mesh, whose axes are \['batch'\]"):
        DecoderLM.get_layout_map(mesh)
