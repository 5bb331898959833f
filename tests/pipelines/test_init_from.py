"""`tfam train --init-from`: fine-tune an imported Llama-family checkpoint (full, or LoRA) with its own
tokenizer, then export it and serve text from the SavedModel in a TensorFlow-only process."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from pipeline_runs import run_tfam

FIXTURE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf-llama-tiny"))


def _args(data_dir, out, **overrides):
    values = {
        "init-from": FIXTURE,
        "data-dir": data_dir,
        "train-split": "valid",
        "eval-split": "test",
        "sequence-length": 32,
        "batch-size": 4,
        "max-steps": 12,
        "backup-every": 4,
        "eval-every": 12,
        "warmup-steps": 2,
        "learning-rate": 3e-3,
        "samples": 0,
        "jit": "off",
        "out": out,
    }
    values.update(overrides)
    return ["train"] + [item for key, value in values.items() for item in (f"--{key}", str(value))]


def _losses(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(os.path.join(run, "logs", "train"))
    accumulator.Reload()
    return [float(tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors("epoch_loss")]


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory, small_wikitext):
    run = str(tmp_path_factory.mktemp("init-from") / "llama")
    run_tfam(_args(small_wikitext, run))
    return run


def test_fine_tuning_an_imported_llama_lowers_its_loss_with_its_own_tokenizer(fine_tuned):
    losses = _losses(fine_tuned)
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2] and losses[2] < losses[0] - 0.2, losses
    with open(os.path.join(fine_tuned, "summary.json")) as f:
        summary = json.load(f)
    assert summary["tokenizer"] == "huggingface" and summary["steps"] == 12
    from pipelines.commands import load_run

    model, tokenizer = load_run(fine_tuned)
    assert type(model).__name__ == "DecoderLM" and model.output_head is not None  # Llama's untied head
    from keras_tfam.convert import HuggingFaceTokenizer

    text = "The game 's battle system , the BliTZ system , is carried over directly from Valkyira Chronicles ."
    expected = HuggingFaceTokenizer(FIXTURE).encode(text, add_special_tokens=False)
    assert np.asarray(tokenizer.tokenize_prompt(tf.constant([text])).flat_values).tolist() == expected


def test_the_export_serves_text_in_a_tensorflow_only_process(fine_tuned):
    from pipelines.commands import load_run

    export = os.path.join(fine_tuned, "export", "1")
    text_export = os.path.join(fine_tuned, "export-text", "1")
    assets = os.path.join(export, "assets.extra", "tokenizer")
    assert os.path.isfile(os.path.join(assets, "tokenizer.json"))
    model, tokenizer = load_run(fine_tuned)
    prompts = ["The album was released in", "  Two  spaces , 1,234 and émigrés"]
    expected = []
    for prompt in prompts:
        ids = [tokenizer.eos_id] + np.asarray(tokenizer.tokenize_prompt(tf.constant([prompt])).flat_values).tolist()
        generated = model.generate([ids], max_new_tokens=8, stop_token_ids=[tokenizer.eos_id])[0, len(ids) :]
        ends = np.flatnonzero(generated == tokenizer.eos_id)
        text_ids = generated[: ends[0] if len(ends) else len(generated)]  # the end token and after it are no text
        expected.append(tokenizer.detokenize(text_ids[None]).numpy()[0].decode())
    # Clients in plain TensorFlow: text in and out of `generate_text` (the tokenizer in the graph, tensorflow-text's
    # ops), and token ids through `generate` with the `tokenizers` library reading the files carried in the export.
    script = textwrap.dedent(
        f"""
        import json, sys
        import tensorflow as tf
        import tensorflow_text  # the ops of the tokenizer's graph
        from tokenizers import Tokenizer
        def per_row(n):
            return dict(max_new_tokens=tf.fill([n], 8), temperature=tf.fill([n], 0.0), top_k=tf.fill([n], 0),
                        top_p=tf.fill([n], 1.0), seed=tf.fill([n], 0), repetition_penalty=tf.fill([n], 1.0),
                        stop_token_ids=tf.fill([n, 1], {tokenizer.eos_id}))
        generate_text = tf.saved_model.load({text_export!r}).signatures["generate_text"]
        stop_strings = tf.fill([{len(prompts)}, 1], "")
        served = generate_text(prompts=tf.constant({prompts!r}), stop_strings=stop_strings, **per_row({len(prompts)}))
        served = served["completions"].numpy()
        texts = [t.decode() for t in served]
        tokenizer = Tokenizer.from_file({os.path.join(assets, "tokenizer.json")!r})
        newline = tokenizer.encode("\\n", add_special_tokens=False).ids[-1]
        ids = [newline] + tokenizer.encode({prompts[0]!r}, add_special_tokens=False).ids
        generate = tf.saved_model.load({export!r}).signatures["generate"]
        out = generate(token_ids=tf.constant([ids], tf.int32), lengths=tf.constant([len(ids)]), **per_row(1))
        out = out["token_ids"].numpy()[0, len(ids):len(ids) + int(out["num_generated"].numpy()[0])]
        out = [i for i in out.tolist() if i != {tokenizer.eos_id}]
        modules = [m for m in ("keras_tfam", "pipelines", "keras_hub") if m in sys.modules]
        print(json.dumps(dict(texts=texts, tokens_text=tokenizer.decode(out), modules=modules)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served == {"texts": expected, "tokens_text": expected[0], "modules": []}


def test_lora_fine_tuning_changes_only_the_adapted_projections(tmp_path, small_wikitext):
    from keras_tfam.models import from_huggingface
    from pipelines.commands import load_run

    run = str(tmp_path / "lora")
    run_tfam(_args(small_wikitext, run, **{"lora-rank": 2, "max-steps": 4, "eval-every": 4, "export": "off"}))
    tuned, _ = load_run(run, "final")
    imported = from_huggingface(FIXTURE)

    def array(variable):
        return keras.ops.convert_to_numpy(variable)

    for tuned_block, block in zip(tuned.transformer_blocks, imported.transformer_blocks):
        tuned_attention, attention = tuned_block.self_attention_layer, block.self_attention_layer
        np.testing.assert_array_equal(array(tuned_attention.key_dense.kernel), array(attention.key_dense.kernel))
        np.testing.assert_array_equal(
            array(tuned_block.feed_forward.gate_dense.kernel), array(block.feed_forward.gate_dense.kernel)
        )
        assert not np.array_equal(array(tuned_attention.query_dense.kernel), array(attention.query_dense.kernel))
    np.testing.assert_array_equal(array(tuned.output_head.kernel), array(imported.output_head.kernel))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--init-from", "/nonexistent/llama"], "`init_from` must be a Hugging Face checkpoint directory"),
        (["--init-from", FIXTURE, "--tokenizer", "bpe"], "uses the checkpoint's own tokenizer"),
        (["--tokenizer", "huggingface"], "set `init_from` to its directory"),
        (["--init-from", FIXTURE, "--lora-rank", "0"], "`lora_rank` must be unset or a positive integer"),
    ],
)
def test_bad_init_from_options_are_one_line_usage_errors(tmp_path, small_wikitext, extra, message):
    result = run_tfam(["train", "--data-dir", small_wikitext, "--out", str(tmp_path / "run"), *extra], check=False)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
