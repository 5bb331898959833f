import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from pipeline_runs import REPO, TRAINED_RUN_OPTIONS, copy_run, run_tfam, tiny_args

from pipelines.serving_requests import generate_request
from pipelines.serving_warmup import WARMUP_FILE, read_warmup_requests


def _tags(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(folder)
    accumulator.Reload()
    return set(accumulator.Tags().get("scalars", [])) | set(accumulator.Tags().get("tensors", []))


def _steps(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(folder)
    accumulator.Reload()
    return sorted(event.step for event in accumulator.Tensors(tag))


def test_tensorboard_has_the_promised_series(trained_run):
    logs = os.path.join(trained_run, "logs")
    train, validation = _tags(os.path.join(logs, "train")), _tags(os.path.join(logs, "validation"))
    assert {"learning_rate", "tokens_per_second", "epoch_loss"} <= train, train
    assert {"loss", "token_perplexity", "word_perplexity", "sample_0"} <= validation, validation
    # Every series on one axis, the global step (2 steps per epoch here), not the epoch index.
    assert _steps(os.path.join(logs, "train"), "epoch_loss") == [2, 4]
    assert _steps(os.path.join(logs, "validation"), "epoch_loss") == [2, 4]
    assert _steps(os.path.join(logs, "train"), "learning_rate") == [2, 4]


def _load(run):
    from pipelines.commands import load_run

    return load_run(run)


def test_exported_signatures_match_the_model_in_a_tensorflow_only_process(trained_run, tmp_path):
    export = os.path.join(trained_run, "export", "1")
    assert os.path.isfile(os.path.join(export, "saved_model.pb"))
    # The loop is compiled for the run's --export-batch-sizes: its warmup requests are at those sizes.
    requests = read_warmup_requests(os.path.join(export, WARMUP_FILE))
    assert {len(inputs["lengths"]) for name, inputs in requests if name == "generate"} == {1, 2}
    model, tokenizer = _load(trained_run)
    prompts = np.array([[5, 17, 30, 2], [9, 4, 0, 0]], np.int32)
    lengths = np.array([4, 2], np.int32)
    expected_logits = np.asarray(model(prompts))[:, -1]
    expected_greedy = model.generate([list(prompts[0]), list(prompts[1, :2])], max_new_tokens=6)
    prompt_text = "the game"
    ids = [tokenizer.eos_id] + list(np.asarray(tokenizer.tokenize_prompt(tf.constant([prompt_text])).flat_values))
    greedy_text = model.generate([ids], 5, stop_token_ids=[tokenizer.eos_id], return_logprobs=True)
    count = int(greedy_text["num_generated"][0])
    greedy_text_ids = greedy_text["token_ids"][0, len(ids) : len(ids) + count]
    greedy_text_ids = greedy_text_ids[greedy_text_ids != tokenizer.eos_id]  # the end token is not text
    expected_text = tokenizer.detokenize(greedy_text_ids[None]).numpy()[0].decode()

    script = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np
        import tensorflow as tf
        loaded = tf.saved_model.load({export!r})
        sig = loaded.signatures
        def per_row(n, new, temperature=0.0, top_k=0, top_p=1.0, seed=0):
            return dict(max_new_tokens=tf.fill([n], new), temperature=tf.fill([n], temperature),
                        top_k=tf.fill([n], top_k), top_p=tf.fill([n], top_p), seed=tf.fill([n], seed),
                        stop_token_ids=tf.fill([n, 1], -1), repetition_penalty=tf.fill([n], 1.0))
        logits = sig["serving_default"](token_ids=tf.constant({prompts.tolist()}, tf.int32))["logits"].numpy()
        rows = dict(token_ids=tf.constant({prompts.tolist()}, tf.int32), lengths=tf.constant({lengths.tolist()}))
        greedy = sig["generate"](**rows, **per_row(2, 6))["token_ids"].numpy()
        sampled = sig["generate"](**rows, **per_row(2, 6, 0.8, 20, 0.9, 3))["token_ids"].numpy()
        text = sig["generate_text"](prompts=tf.constant([{prompt_text!r}]), stop_strings=tf.constant([[""]]),
                                    **per_row(1, 5))
        modules = [m for m in ("keras_tfam", "keras_hub", "pipelines") if m in sys.modules]
        completion = text["completions"].numpy()[0].decode()
        print(json.dumps(dict(logits=logits.tolist(), greedy=greedy.tolist(), sampled=sampled.tolist(),
                              text=completion, modules=modules, signatures=sorted(sig.keys()))))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["modules"] == []
    assert out["signatures"] == ["decode_chunk", "generate", "generate_text", "prefill", "serving_default"]
    np.testing.assert_allclose(out["logits"], expected_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out["greedy"], expected_greedy)
    sampled = np.array(out["sampled"])
    np.testing.assert_array_equal(sampled[:, :2], prompts[:, :2])
    assert sampled.shape == (2, 10) and np.all(sampled[1, 8:] == 0)
    assert out["text"] == expected_text

    cli = shutil.which("saved_model_cli", path=os.path.dirname(sys.executable))
    shown = subprocess.run([cli, "show", "--dir", export, "--all"], capture_output=True, text=True, timeout=120)
    for name in ("serving_default", "generate", "generate_text", "prefill", "decode_chunk"):
        assert f"signature_def['{name}']" in shown.stdout


def test_cli_eval_generate_and_export(trained_run, small_wikitext, tmp_path):
    result = run_tfam(["eval", trained_run, "--data-dir", small_wikitext, "--split", "test", "--sequence-length", "32"])
    evaluation = json.loads(result.stdout.strip().splitlines()[-1])
    with open(os.path.join(small_wikitext, "wiki.test.tokens")) as f:
        lines = f.read().split("\n")[:-1]
    assert evaluation["words"] == sum(len(line.split()) for line in lines) + len(lines)
    assert evaluation["tokens"] == evaluation["words"]  # word-level tokenizer
    assert np.isclose(evaluation["word_perplexity"], np.exp(evaluation["nll"] / evaluation["words"]))

    result = run_tfam(["generate", trained_run, "--prompt", "the game", "--max-new-tokens", "5", "--sampler", "greedy"])
    assert result.stdout.startswith("the game ")
    # Temperature 0 is greedy, as in the exported signature (before: an error in the CLI only).
    cold = run_tfam(
        [
            "generate",
            trained_run,
            "--prompt",
            "the game",
            "--max-new-tokens",
            "5",
            "--sampler",
            "top_p",
            "--temperature",
            "0",
        ]
    )
    assert cold.stdout == result.stdout
    hot = run_tfam(["generate", trained_run, "--prompt", "a", "--temperature", "nan"], check=False)
    assert hot.returncode == 2 and hot.stderr.strip().splitlines()[-1].startswith("tfam: error: `--temperature`")

    # Without XLA, and with speculative decoding inside (the run drafts for itself): the first export's tokens.
    target = str(tmp_path / "exports" / "7")
    drafted = ["--draft-run", trained_run, "--num-draft-tokens", "2"]
    assert "-> " + target in run_tfam(["export", trained_run, "--export-dir", target, "--no-xla", *drafted]).stdout
    # `--out`, the flag's old name, still works, with a notice.
    again = run_tfam(["export", trained_run, "--out", target], check=False)
    assert again.returncode == 2 and "exists already" in again.stderr
    assert again.stderr.splitlines()[0] == "tfam: --out is now --export-dir; the old name still works"
    request = {name: tf.constant(value) for name, value in generate_request([[3, 1, 4], [5]], [6, 9]).items()}
    first_export = os.path.join(trained_run, "export", "1")
    first, replaced = (tf.saved_model.load(path).signatures["generate"] for path in (first_export, target))
    np.testing.assert_array_equal(replaced(**request)["token_ids"], first(**request)["token_ids"])
    lone = _one_error_line(["export", trained_run, "--export-dir", str(tmp_path / "x"), "--num-draft-tokens", "2"])
    assert lone.startswith("tfam: error: `--num-draft-tokens` sets speculative decoding, which `--draft-run` turns on")
    # The warmup requests are at the batch sizes the loop was compiled for (none without XLA: batch 1).
    assert warmup_batch_sizes(target) == {1}
    run_tfam(["export", trained_run, "--export-dir", target, "--overwrite", "--batch-sizes", "3,1"])
    assert os.listdir(tmp_path / "exports") == ["7"] and warmup_batch_sizes(target) == {1, 3}


def warmup_batch_sizes(version):
    """The batch sizes of the `generate` warmup requests of the export `version`."""
    requests = read_warmup_requests(os.path.join(version, WARMUP_FILE))
    return {len(inputs["lengths"]) for name, inputs in requests if name == "generate"}


def test_export_to_huggingface_writes_a_checkpoint_that_imports_as_the_run_s_model(trained_run, tmp_path):
    from keras_tfam.models import from_huggingface
    from pipelines.commands import load_run

    out = str(tmp_path / "hf")
    mixed = run_tfam(
        ["export", trained_run, "--export-dir", out, "--format", "huggingface", "--batch-sizes", "1"], check=False
    )
    assert mixed.returncode == 2 and mixed.stderr.strip().splitlines() == [
        "tfam: error: --batch-sizes set the SavedModel's decoding: not with --format huggingface"
    ]
    result = run_tfam(["export", trained_run, "--export-dir", out, "--format", "huggingface"])
    assert result.stdout.strip().endswith("(Hugging Face)")
    assert "a word tokenizer has no Hugging Face form" in result.stderr  # the weights only, and said so
    assert {"config.json", "generation_config.json", "model.safetensors"} <= set(os.listdir(out))
    model, _ = load_run(trained_run, "best")
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], "int32")
    np.testing.assert_array_equal(from_huggingface(out)(ids).numpy(), model(ids).numpy())
    again = run_tfam(["export", trained_run, "--export-dir", out, "--format", "huggingface"], check=False)
    assert again.returncode == 2 and "not empty; pass --overwrite" in again.stderr


def test_failed_export_leaves_no_version_folder(trained_run, tmp_path, monkeypatch):
    from pipelines import export

    model, tokenizer = _load(trained_run)

    def broken_save(archive, path):
        os.makedirs(os.path.join(path, "variables"))
        raise OSError("disk full")

    monkeypatch.setattr(export, "save_archive", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export.export_model(model, str(tmp_path / "models"), tokenizer, batch_sizes=(1,))
    assert os.listdir(tmp_path / "models") == []


def test_exported_generate_slides_past_the_trained_context(trained_run):
    """The run trained at 32 tokens (a 32-row position table) asked for 200 new tokens: each step sees the
    last 32 tokens at positions 0..31, as the model's own generate and a plain re-encoding loop do."""
    model, _ = _load(trained_run)
    assert model.max_length == 32 and model.max_sequence_length == 32
    export = os.path.join(trained_run, "export", "1")
    signature = tf.saved_model.load(export).signatures["generate"]
    prompt = [5, 17, 30, 2, 9]
    request = generate_request([prompt], 200)
    out = signature(**{name: tf.constant(value) for name, value in request.items()})["token_ids"].numpy()
    tokens = list(prompt)
    for _ in range(200):
        window = np.array([tokens[-32:]], np.int32)
        tokens.append(int(np.argmax(np.asarray(model(window))[0, -1])))
    np.testing.assert_array_equal(out[0], tokens)
    np.testing.assert_array_equal(model.generate([prompt], 200), out)
    result = run_tfam(
        ["generate", trained_run, "--prompt", "the game", "--max-new-tokens", "60", "--sampler", "greedy"]
    )
    assert len(result.stdout.split()) >= 60  # word level: one word per new token


def test_export_cleans_up_after_killed_exports_and_is_readable_by_all(trained_run, tmp_path):
    # Item 9: killed exports left .incomplete-XXXX/ folders for good, and versions were mode 0700.
    # (test_kill_anywhere kills a real export; here, what killed ones leave, as they leave it.)
    exports = tmp_path / "exports"
    shutil.copytree(os.path.join(trained_run, "export", "1"), exports / ".incomplete-k3j2x9")
    # An export killed while replacing version 3 (--overwrite) had moved it aside.
    shutil.copytree(os.path.join(trained_run, "export", "1"), exports / ".replaced-3-x1y2" / "old")

    result = run_tfam(["export", trained_run, "--export-dir", str(exports), "--batch-sizes", "1"])
    assert sorted(os.listdir(exports)) == ["3", "4"]
    version = exports / "4"
    assert os.path.isfile(version / "saved_model.pb")
    for root, folders, files in os.walk(version):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o755, root
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode) == 0o644, name
    assert result.stderr.splitlines() == [
        f"tfam: deleted {exports / '.incomplete-k3j2x9'}, the unfinished folder of an export that was killed",
        f"tfam: put back {exports / '3'}, which an export killed while replacing it had moved aside",
    ]


def test_eval_beyond_the_model_positions_is_one_clear_line(trained_run, small_wikitext):
    # Item 10: a 27-line traceback with ANSI codes.
    result = run_tfam(["eval", trained_run, "--data-dir", small_wikitext, "--sequence-length", "1000"], check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "tfam: error: `sequence_length` must be at most the model's context of 32 positions (max_length: the "
        "context it was trained on, or its learned positions). Received: sequence_length=1000"
    ]


def test_the_cli_is_quiet_unless_verbose(trained_run, tmp_path):
    # TensorFlow's C++ log lines appeared on every command, even --help.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}

    def tfam(*args):
        return subprocess.run(
            [sys.executable, "-m", "pipelines.cli", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    result = tfam("--help")
    assert result.returncode == 0 and result.stderr == ""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the game was played\n")
    result = tfam("eval", trained_run, "--split", str(corpus), "--sequence-length", "8")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout)["words"] == 5
    result = tfam("eval", trained_run, "--split", str(tmp_path / "missing.txt"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"tfam: error: No such file or folder: {str(tmp_path / 'missing.txt')!r} (a split is train, valid, test, "
        "or the path of a text file or folder)"
    ]
    result = tfam("eval", trained_run, "--split", str(tmp_path / "missing.txt"), "--verbose")
    assert result.returncode == 2 and "Traceback (most recent call last)" in result.stderr


def test_an_export_traces_the_model_s_call_once(tmp_path):
    """The logits signature is the one trace of the model's `call`: writing the SavedModel does not trace it
    again (only the model's variables are tracked, not the model and its default save signature)."""
    import keras

    from keras_tfam.models import GPT2LM
    from pipelines.export import export_model

    keras.utils.set_random_seed(0)
    model = GPT2LM(vocabulary_size=29, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)
    tokens = np.array([[3, 7, 1]], np.int32)
    expected = np.asarray(model(tokens))[:, -1]
    traces, call = [], model.call
    model.call = lambda *args, **kwargs: (traces.append(tf.executing_eagerly()), call(*args, **kwargs))[1]
    version = export_model(model, str(tmp_path / "export"))
    assert traces == [False]
    logits = tf.saved_model.load(version).signatures["serving_default"](token_ids=tf.constant(tokens))["logits"]
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-5, atol=1e-6)


def _one_error_line(args):
    result = run_tfam(args, check=False)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    [line] = result.stderr.splitlines()
    return line


def test_export_of_a_keras_file_that_is_not_a_language_model_is_one_line(tmp_path):
    # Was `AttributeError ... vocabulary_size`, exit 1.
    import keras

    inputs = keras.Input((3,))
    path = str(tmp_path / "dense.keras")
    keras.Model(inputs, keras.layers.Dense(2)(inputs)).save(path)
    assert _one_error_line(["export", path, "--export-dir", str(tmp_path / "export")]) == (
        "tfam: error: `run` must hold a language model of keras_tfam (a decoding model of one vocabulary, as "
        f"GPT2LM or DecoderLM). Received: {path!r}, a Functional"
    )
    assert not os.path.exists(tmp_path / "export")


def test_a_checkpoint_of_another_vocabulary_in_a_run_is_refused_by_every_command(trained_run, small_wikitext, tmp_path):
    # Generate and export used it silently; eval failed with a raw InvalidArgumentError.
    import keras

    from keras_tfam.models import GPT2LM

    run = copy_run(trained_run, tmp_path)
    _, tokenizer = _load(trained_run)
    model = GPT2LM(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=32)
    model(np.zeros((1, 4), np.int32))
    final = os.path.join(run, "checkpoints", "final.keras")
    os.remove(os.path.join(run, "checkpoints", "final.json"))  # a file copied in: no sidecar describes it
    keras.saving.save_model(model, final)
    expected = (
        f"tfam: error: {final} is not a checkpoint of this run's vocabulary: its model has 50 ids and the tokenizer "
        f"in {os.path.join(run, 'tokenizer')} has {tokenizer.vocabulary_size}. Received: vocabulary_size=50 "
        f"(model), {tokenizer.vocabulary_size} (tokenizer)"
    )
    for command in (
        ["generate", run, "--prompt", "the game"],
        ["export", run, "--export-dir", str(tmp_path / "export")],
        ["eval", run, "--data-dir", small_wikitext],
        ["generate", final, "--prompt", "the game"],
    ):
        assert _one_error_line([*command, "--checkpoint", "final"]) == expected, command


def test_generate_and_export_of_a_run_still_training_say_which_step_they_use(trained_run, tmp_path):
    # Both used an early checkpoint without a word.
    from pipelines.run_lock import RunLock

    run = copy_run(trained_run, tmp_path)
    with open(os.path.join(run, "checkpoints", "best.json")) as f:
        step = json.load(f)["step"]
    with RunLock(run):  # as `tfam train` holds it
        generated = run_tfam(["generate", run, "--prompt", "the game", "--max-new-tokens", "3"])
        exported = run_tfam(["export", run, "--export-dir", str(tmp_path / "export"), "--batch-sizes", "1"])
    for result in (generated, exported):
        [line] = result.stderr.splitlines()
        assert line.startswith(f"tfam: {run} is still training (pid {os.getpid()} on ")
        assert line.endswith(f"): using best.keras, of step {step}")
    assert os.path.isfile(tmp_path / "export" / "1" / "saved_model.pb")
    # Killed before its end: no final checkpoint, and nobody holds the lock.
    os.remove(os.path.join(run, "checkpoints", "final.keras"))
    result = run_tfam(["generate", run, "--prompt", "the game", "--max-new-tokens", "3"])
    assert result.stderr.splitlines() == [
        f"tfam: {run} has no final checkpoint (its training stopped before the end; rerun its `tfam train` to "
        f"resume): using best.keras, of step {step}"
    ]
    assert result.stdout.startswith("the game ")


def test_commands_on_a_mixed_float16_run_print_no_optimizer_warning(small_wikitext, tmp_path):
    # Keras warned "Skipping variable loading for optimizer" on every generate, eval and export.
    import warnings

    run = str(tmp_path / "run")
    options = {**TRAINED_RUN_OPTIONS, "max-steps": 2, "precision": "mixed_float16", "export": "false"}
    run_tfam(tiny_args(small_wikitext, run, **options))
    for command in (
        ["generate", run, "--prompt", "the game", "--max-new-tokens", "3"],
        ["eval", run, "--data-dir", small_wikitext],
        ["export", run, "--export-dir", str(tmp_path / "export"), "--batch-sizes", "1"],
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run_tfam(command)
        assert result.stderr == "", command
        assert not [w for w in caught if "Skipping variable loading" in str(w.message)], command
