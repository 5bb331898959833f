"""The exported `generate` as TF Serving runs it: in a TensorFlow-only process, requests merged by its batcher.

TF Serving's batcher (`--enable_batching` with `pad_variable_length_inputs`) concatenates every input of the
queued requests along dimension 0, first padding each input's other dimensions to the largest in the batch
with that input's first element, runs the signature once, and splits every output along dimension 0. A merged
call must give each row what it gets alone: the same new tokens, counts and log-probabilities (greedy and seeded
rows, with stop ids and penalties), and the same as the library's `generate` for the greedy rows.
"""

import json
import os
import subprocess
import sys
import textwrap
import types

import keras
import numpy as np
import pytest

from keras_tfam.models import GPT2LM
from pipelines.export import export_model
from pipelines.serving_requests import generate_request
from pipelines.serving_warmup import WARMUP_FILE, read_warmup_requests

# Three clients' requests: prompts of different widths, every setting different per row.
REQUESTS = [
    generate_request([[5, 17, 3], [9, 4]], max_new_tokens=[6, 9], seed=[0, 11], temperature=[0.0, 0.9], top_k=[0, 8]),
    generate_request([[1, 2, 3, 4, 5]], max_new_tokens=7, repetition_penalty=1.8, stop_token_ids=[[20, 21]]),
    generate_request([[8], [30, 2, 2]], max_new_tokens=[12, 4], top_p=[1.0, 0.8], temperature=[0.0, 1.2], seed=5),
]


def with_stop(model):
    """`REQUESTS` and one more, whose stop id greedy decoding meets."""
    plain = model.generate([[5, 17, 3]], 10)[0, 3:]
    return REQUESTS + [generate_request([[5, 17, 3]], 10, stop_token_ids=[[-1, int(plain[2]), -1]])]


SERVER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf

    def merge(requests):
        # TF Serving's batching: each input padded with its first element, then concatenated along axis 0.
        merged = {}
        for name in requests[0]:
            values = [np.asarray(r[name]) for r in requests]
            shape = np.max([v.shape for v in values], axis=0)
            padded = []
            for v in values:
                out = np.full((v.shape[0],) + tuple(shape[1:]), v.flat[0], v.dtype)
                out[tuple(slice(0, n) for n in v.shape)] = v
                padded.append(out)
            merged[name] = np.concatenate(padded)
        return merged

    def call(signature, request):
        dtypes = {"temperature": tf.float32, "top_p": tf.float32, "repetition_penalty": tf.float32}
        inputs = {k: tf.constant(v, dtypes.get(k, tf.int32)) for k, v in request.items()}
        return {k: v.numpy().tolist() for k, v in signature(**inputs).items()}

    requests = json.loads(sys.stdin.read())
    signature = tf.saved_model.load(sys.argv[1]).signatures["generate"]
    alone = [call(signature, r) for r in requests]
    together = call(signature, merge(requests))
    modules = [m for m in ("keras_tfam", "pipelines", "keras_hub") if m in sys.modules]
    print(json.dumps(dict(alone=alone, together=together, modules=modules)))
    """
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    keras.utils.set_random_seed(4)
    model = GPT2LM(vocabulary_size=37, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=32)
    path = export_model(model, str(tmp_path_factory.mktemp("export") / "model"), max_new_tokens_limit=16)
    requests = [{k: v.tolist() for k, v in r.items()} for r in with_stop(model)]
    result = subprocess.run(
        [sys.executable, "-c", SERVER, path],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return types.SimpleNamespace(model=model, path=path, **json.loads(result.stdout.strip().splitlines()[-1]))


def rows_of(request):
    return [(request["token_ids"][b, : request["lengths"][b]], b) for b in range(len(request["lengths"]))]


def test_a_merged_call_gives_each_row_what_it_gets_alone(served):
    out = vars(served)
    assert out["modules"] == []
    start = 0
    for request, alone in zip(REQUESTS, out["alone"]):
        for prompt, b in rows_of(request):
            row = start + b
            count = alone["num_generated"][b]
            assert out["together"]["num_generated"][row] == count
            new_alone = alone["token_ids"][b][len(prompt) : len(prompt) + count]
            new_together = out["together"]["token_ids"][row][len(prompt) : len(prompt) + count]
            assert new_together == new_alone
            np.testing.assert_allclose(
                out["together"]["logprobs"][row][:count], alone["logprobs"][b][:count], atol=1e-5
            )
        start += len(request["lengths"])


def test_served_greedy_rows_are_the_library_s_generate(served):
    model, out = served.model, vars(served)
    for request, alone in zip(REQUESTS, out["alone"]):
        for prompt, b in rows_of(request):
            if request["temperature"][b] > 0:
                continue
            stop = [int(i) for i in request["stop_token_ids"][b] if i >= 0]
            expected = model.generate(
                [prompt.tolist()],
                int(request["max_new_tokens"][b]),
                stop_token_ids=stop,
                repetition_penalty=float(request["repetition_penalty"][b]),
                return_logprobs=True,
            )
            count = int(expected["num_generated"][0])
            assert alone["num_generated"][b] == count
            width = len(prompt) + int(request["max_new_tokens"][b])
            assert alone["token_ids"][b][:width] == expected["token_ids"][0].tolist()
            np.testing.assert_allclose(alone["logprobs"][b][:count], expected["logprobs"][0][:count], atol=1e-5)


def test_a_row_stops_at_its_stop_ids_and_is_padded(served):
    model = served.model
    request, alone = with_stop(model)[-1], served.alone[-1]
    plain = model.generate([[5, 17, 3]], 10)[0, 3:]
    first = 1 + int(np.flatnonzero(plain == request["stop_token_ids"][0, 1])[0])
    assert first < 10 and alone["num_generated"] == [first]
    assert alone["token_ids"][0][3 : 3 + first] == plain[:first].tolist()
    assert alone["token_ids"][0][3 + first :] == [0] * (10 - first)
    assert alone["logprobs"][0][first:] == [0.0] * (10 - first)


def test_the_export_holds_warmup_requests_for_each_signature_that_it_serves(served):
    import tensorflow as tf

    model, path = served.model, served.path
    requests = read_warmup_requests(os.path.join(path, WARMUP_FILE))
    signatures = tf.saved_model.load(path).signatures
    assert sorted({name for name, _ in requests}) == ["generate", "serving_default"]
    assert sorted({len(next(iter(inputs.values()))) for _, inputs in requests}) == [1, 8]
    for name, inputs in requests:
        signature = signatures[name]
        specs = signature.structured_input_signature[1]
        assert sorted(inputs) == sorted(specs)
        outputs = signature(**{key: tf.constant(value, specs[key].dtype) for key, value in inputs.items()})
        if name == "generate":
            expected = model.generate(inputs["token_ids"].tolist(), int(inputs["max_new_tokens"][0]))
            np.testing.assert_array_equal(outputs["token_ids"].numpy(), expected)
