"""The exported `generate` as TF Serving runs it: in a TensorFlow-only process, requests merged by its batcher.

TF Serving's batcher (`--enable_batching` with `pad_variable_length_inputs`) concatenates every input of the
queued requests along dimension 0, first padding each input's other dimensions to the largest in the batch
with that input's first element, runs the signature once, and splits every output along dimension 0. A merged
call must give each row what it gets alone: the same new tokens, counts and log-probabilities (greedy and seeded
rows, with stop ids and penalties), and the same as the library's `generate` for the greedy rows. The export
compiles its loop for batch sizes 1, 2, 4 and 8, so the requests alone and merged run at different sizes (a
merged batch of 5 rows at 8, its last row repeated), within the model's context and past it (a sliding window).

A client streams by calling `prefill` once and `decode_chunk` until every row is finished: the chunks
concatenated are the new tokens of `generate`.
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


# Past the model's context (32): the window slides.
PAST_CONTEXT = generate_request([list(range(1, 25)), [3, 1]], max_new_tokens=[16, 5], temperature=[0.0, 0.7])
CHUNK = 3


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
        specs = signature.structured_input_signature[1]
        inputs = {k: tf.constant(v, specs[k].dtype) for k, v in request.items()}
        return {k: v.numpy() for k, v in signature(**inputs).items()}

    def listed(outputs):
        return {k: v.tolist() for k, v in outputs.items()}

    def streamed(signatures, request, chunk):
        # A streaming client: `prefill`, then `decode_chunk` on the state it returns until every row is finished.
        state = call(signatures["prefill"], request)
        chunks = []
        while True:
            rows = len(state["state_index"])
            out = call(signatures["decode_chunk"], dict(state, num_tokens=np.full(rows, chunk, np.int32)))
            chunks.append(out["token_ids"])
            state = {k: v for k, v in out.items() if k.startswith("state_")}
            if out["finished"].all():
                return np.concatenate(chunks, axis=1).tolist()

    inputs = json.loads(sys.stdin.read())
    signatures = tf.saved_model.load(sys.argv[1]).signatures
    generate = signatures["generate"]
    alone = [listed(call(generate, r)) for r in inputs["requests"]]
    together = listed(call(generate, merge(inputs["requests"])))
    past_context = listed(call(generate, inputs["past_context"]))
    chunks = [streamed(signatures, r, inputs["chunk"]) for r in inputs["requests"]]
    modules = [m for m in ("keras_tfam", "pipelines", "keras_hub") if m in sys.modules]
    print(json.dumps(dict(alone=alone, together=together, past_context=past_context, chunks=chunks, modules=modules)))
    """
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    keras.utils.set_random_seed(4)
    model = GPT2LM(vocabulary_size=37, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=32)
    path = export_model(model, str(tmp_path_factory.mktemp("export") / "model"), max_new_tokens_limit=16)
    requests = [{k: v.tolist() for k, v in r.items()} for r in with_stop(model)]
    past_context = {k: v.tolist() for k, v in PAST_CONTEXT.items()}
    result = subprocess.run(
        [sys.executable, "-c", SERVER, path],
        input=json.dumps(dict(requests=requests, past_context=past_context, chunk=CHUNK)),
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
    for request, alone in [*zip(REQUESTS, out["alone"]), (PAST_CONTEXT, out["past_context"])]:
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


def test_prefill_and_decode_chunk_stream_what_generate_returns(served):
    for request, alone, chunks in zip(with_stop(served.model), served.alone, served.chunks):
        assert len(chunks[0]) % CHUNK == 0
        for prompt, b in rows_of(request):
            count = alone["num_generated"][b]
            assert chunks[b][:count] == alone["token_ids"][b][len(prompt) : len(prompt) + count]
            assert chunks[b][count:] == [0] * (len(chunks[b]) - count)  # nothing past a row's end


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
    # `generate` at every batch size its loop is compiled for, and every buffer width within the context.
    shapes = {(len(inputs["lengths"]), inputs["token_ids"].shape[1] + int(inputs["max_new_tokens"][0]))
              for name, inputs in requests if name == "generate"}  # fmt: skip
    assert shapes == {(batch, width) for batch in (1, 2, 4, 8) for width in (16, 32)}
    for name, inputs in requests:
        signature = signatures[name]
        specs = signature.structured_input_signature[1]
        assert sorted(inputs) == sorted(specs)
        outputs = signature(**{key: tf.constant(value, specs[key].dtype) for key, value in inputs.items()})
        if name == "generate":
            # Every row is the same prompt: the library's tokens for one.
            expected = model.generate(inputs["token_ids"][:1].tolist(), int(inputs["max_new_tokens"][0]))
            np.testing.assert_array_equal(outputs["token_ids"].numpy(), np.repeat(expected, len(inputs["lengths"]), 0))


def test_an_export_without_xla_serves_the_same(served, tmp_path):
    import tensorflow as tf

    path = export_model(served.model, str(tmp_path / "model"), max_new_tokens_limit=16, jit_compile=False)
    signatures = tf.saved_model.load(path).signatures
    for request, alone in zip(with_stop(served.model), served.alone):
        specs = signatures["generate"].structured_input_signature[1]
        out = signatures["generate"](**{k: tf.constant(v, specs[k].dtype) for k, v in request.items()})
        assert out["num_generated"].numpy().tolist() == alone["num_generated"]
        for prompt, b in rows_of(request):
            count = alone["num_generated"][b]
            new = out["token_ids"].numpy()[b, len(prompt) : len(prompt) + count].tolist()
            assert new == alone["token_ids"][b][len(prompt) : len(prompt) + count]
            np.testing.assert_allclose(out["logprobs"].numpy()[b, :count], alone["logprobs"][b][:count], atol=1e-5)
