"""A BPE run's export: token-level signatures any TensorFlow loads, `generate_text` beside them."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import tensorflow as tf

from keras_tfam.models import GPT2LM
from pipelines.data.tokenizers import BPETokenizer
from pipelines.export import export_model, text_export_dir

LINES = [
    "The game began development in 2010 , carrying over a large portion of the work .",
    "It met with positive sales in Japan , and was praised by both Japanese and western critics .",
    "The music was composed by Hitoshi Sakimoto , who had also worked on the previous games .",
] * 20


def _run(script, cwd):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_token_signatures_load_without_tensorflow_text(tmp_path):
    tokenizer = BPETokenizer.train(LINES, vocabulary_size=300)
    keras.utils.set_random_seed(0)
    model = GPT2LM(
        vocabulary_size=tokenizer.vocabulary_size, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=32
    )
    version = export_model(model, str(tmp_path / "models"), tokenizer, jit_compile=False)
    text_version = os.path.join(text_export_dir(str(tmp_path / "models")), "1")
    assert version == str(tmp_path / "models" / "1") and os.path.isdir(text_version)
    prompt = [5, 17, 30]
    expected = model.generate([prompt], 6)
    ids = [tokenizer.eos_id] + list(np.asarray(tokenizer.tokenize_prompt(tf.constant(["The game"])).flat_values))
    generated = model.generate([ids], 5, stop_token_ids=[tokenizer.eos_id])[0, len(ids) :]
    ends = np.flatnonzero(generated == tokenizer.eos_id)
    text_ids = generated[: ends[0] if len(ends) else len(generated)]  # the end token and after it are no text
    completion = tokenizer.detokenize(text_ids[None]).numpy()[0].decode()

    def per_row(new):
        return (
            f"max_new_tokens=tf.constant([{new}]), temperature=tf.constant([0.0]), top_k=tf.constant([0]), "
            "top_p=tf.constant([1.0]), seed=tf.constant([0]), stop_token_ids=tf.constant([[-1]]), "
            "repetition_penalty=tf.constant([1.0])"
        )

    # One process: the token-level signatures load before tensorflow_text is imported, then the text ones.
    loaded = _run(
        f"""
        import json, sys
        import tensorflow as tf
        sig = tf.saved_model.load({version!r}).signatures
        out = sig["generate"](token_ids=tf.constant([{prompt}]), lengths=tf.constant([3]),
                              {per_row(6)})["token_ids"].numpy()
        plain = dict(signatures=sorted(sig.keys()), tokens=out.tolist(), text_ops="tensorflow_text" in sys.modules)
        import tensorflow_text  # registers the ops of the BPE tokenizer's graph
        sig = tf.saved_model.load({text_version!r}).signatures
        out = sig["generate_text"](prompts=tf.constant(["The game"]), stop_strings=tf.constant([[""]]), {per_row(5)})
        text = dict(signatures=sorted(sig.keys()), text=out["completions"].numpy()[0].decode())
        print(json.dumps(dict(plain=plain, text=text)))
        """,
        str(tmp_path),
    )
    plain, text = loaded["plain"], loaded["text"]
    token_level = ["decode_chunk", "generate", "prefill", "serving_default"]
    assert plain == {"signatures": token_level, "tokens": expected.tolist(), "text_ops": False}
    assert text == {"signatures": sorted([*token_level, "generate_text"]), "text": completion}
