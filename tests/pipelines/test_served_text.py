"""The exported `generate_text` with stop strings, called by plain TensorFlow in its own process.

Each row's text is cut before the first occurrence of any of its stop strings (OpenAI's `stop`), and its
`num_generated` counts the tokens up to the one whose text completed it (transformers' `stop_strings`): the
reference is the library's `generate` and the tokenizer, searched in Python.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_tfam.models import GPT2LM
from pipelines.data.tokenizers import WordTokenizer
from pipelines.export import export_model
from pipelines.serving_requests import generate_text_request

LINES = ["the cat sat on the mat", "a dog ran in the park", "the bird flew over the old tree", "we saw a red fox"]
PROMPTS = ["the cat", "a dog", "we saw"]
NEW_TOKENS = 14

CLIENT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf

    requests = json.loads(sys.stdin.read())
    signature = tf.saved_model.load(sys.argv[1]).signatures["generate_text"]
    specs = signature.structured_input_signature[1]
    outputs = []
    for request in requests:
        out = signature(**{k: tf.constant(v, specs[k].dtype) for k, v in request.items()})
        outputs.append(dict(completions=[t.decode() for t in out["completions"].numpy()],
                            num_generated=out["num_generated"].numpy().tolist()))
    modules = [m for m in ("keras_tfam", "pipelines", "keras_hub") if m in sys.modules]
    print(json.dumps(dict(outputs=outputs, modules=modules)))
    """
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The model, its tokenizer, its export, and each prompt's new tokens and their text (greedy, the
    library's `generate` stopping at the end token)."""
    tokenizer = WordTokenizer.train(LINES * 2)
    keras.utils.set_random_seed(7)
    model = GPT2LM(vocabulary_size=tokenizer.vocabulary_size, num_layers=2, num_heads=2, hidden_dim=16)
    path = export_model(model, str(tmp_path_factory.mktemp("export") / "model"), tokenizer, batch_sizes=(1, 4))
    rows = []
    for prompt in PROMPTS:
        ids = [tokenizer.eos_id] + tokenizer.tokenize_prompt([prompt]).to_list()[0]
        out = model.generate([ids], NEW_TOKENS, stop_token_ids=[tokenizer.eos_id], return_logprobs=True)
        new = out["token_ids"][0, len(ids) : len(ids) + int(out["num_generated"][0])].tolist()
        rows.append([i for i in new if i != tokenizer.eos_id])
    return model, tokenizer, path, rows


def text_of(tokenizer, ids):
    return tokenizer.detokenize(np.array([ids], np.int32)).numpy()[0].decode()


def expected(tokenizer, new_tokens, stops):
    """`(text, num_generated)` by the definition: the fewest tokens whose text holds a stop string, and the
    whole text cut before the first one."""
    full = text_of(tokenizer, new_tokens)
    for count in range(1, len(new_tokens) + 1):
        if any(stop and stop in text_of(tokenizer, new_tokens[:count]) for stop in stops):
            return full[: min(full.index(stop) for stop in stops if stop and stop in full)], count
    return full, None


def served(path, requests):
    result = subprocess.run(
        [sys.executable, "-c", CLIENT, path],
        input=json.dumps([{k: v.tolist() for k, v in r.items()} for r in requests]),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_generate_text_cuts_each_row_before_its_first_stop_string(reference):
    model, tokenizer, path, rows = reference
    full = [text_of(tokenizer, new) for new in rows]
    assert all(len(text) > 8 for text in full)
    # Row 0 stops inside its text (mid-word too), row 1 at a string found nowhere, row 2 at its last words.
    stops = [[full[0][5:8], full[0][9:11]], ["not in any text", ""], [full[2][-6:]]]
    requests = [
        generate_text_request(PROMPTS, NEW_TOKENS, stop_strings=stops),
        generate_text_request(PROMPTS[:1], NEW_TOKENS, stop_strings=stops[:1]),
        generate_text_request(PROMPTS, NEW_TOKENS),
    ]
    out = served(path, requests)
    assert out["modules"] == []
    merged, alone, plain = out["outputs"]
    for b, new in enumerate(rows):
        text, count = expected(tokenizer, new, stops[b])
        assert merged["completions"][b] == text
        if count is not None:
            assert merged["num_generated"][b] == count
        assert plain["completions"][b] == full[b]
    assert merged["num_generated"][0] < len(rows[0])
    assert alone["completions"] == merged["completions"][:1] and alone["num_generated"] == merged["num_generated"][:1]
