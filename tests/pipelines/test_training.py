import json
import os
import re
import signal
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
from pipeline_runs import REPO, leftovers, run_tfam, tiny_args

from pipelines.callbacks import BestCheckpoint, SafeBackupAndRestore
from pipelines.config import load_config


def _summary(run):
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f)


def _final_weights(run):
    import keras_tfam  # noqa: F401
    import pipelines.optimizer  # noqa: F401

    return keras.saving.load_model(os.path.join(run, "checkpoints", "final.keras")).get_weights()


def test_config_errors_come_before_any_work(tmp_path, small_wikitext):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"learning_rate": 1e-3, "lr_schedule": "cosine"}))
    with pytest.raises(ValueError, match=r"Unknown config key\(s\) \['lr_schedule'\]"):
        load_config(str(config))
    with pytest.raises(ValueError, match="Received: precision='fp8'"):
        load_config("gpt2_tiny", {"precision": "fp8"})
    with pytest.raises(ValueError, match="Received: config='gpt5'"):
        load_config("gpt5")
    result = run_tfam(tiny_args("/no/such/dir", str(tmp_path / "r")), check=False)
    assert result.returncode == 2 and "data_dir '/no/such/dir' does not exist" in result.stderr
    assert not (tmp_path / "r").exists()
    result = run_tfam(tiny_args(small_wikitext, str(tmp_path / "r"), **{"batch-size": 0}), check=False)
    assert result.returncode == 2 and "Received: batch_size=0" in result.stderr


def test_killed_run_resumes_and_matches_an_uninterrupted_one(tmp_path, small_wikitext):
    # One kernel path for both runs (a measured choice may differ between two processes; the resumed run
    # keeps the path it started with: test_kernel_path): TensorFlow's graph without XLA, whose compilation
    # would cost each of the four runs seconds and is not what resuming checks.
    args = dict(**{"max-steps": 12, "backup-every": 3, "eval-every": 6, "jit": "off", "precision": "float32"})
    reference = str(tmp_path / "reference")
    run_tfam(tiny_args(small_wikitext, reference, **args, export="off"))  # compared by its weights and loss
    assert _summary(reference)["export"] is None and not os.path.exists(os.path.join(reference, "export"))

    killed = str(tmp_path / "killed")
    metadata = os.path.join(killed, "backup", "training_metadata.json")
    # SIGKILL after step 8 of 12, inside epoch 3 (no timing luck: see pipelines.faults).
    result = run_tfam(tiny_args(small_wikitext, killed, **args), env={"TFAM_FAULT": "step:8"}, check=False)
    assert result.returncode == -signal.SIGKILL
    with open(metadata) as f:
        resumed_step = json.load(f)["step"]
    assert resumed_step == 6  # the backups after steps 3 and 6

    result = run_tfam(tiny_args(small_wikitext, killed, **args))
    assert "which is no longer running: taking it over" in result.stderr  # the killed run's lock
    summary = _summary(killed)
    assert summary["steps"] == 12
    assert summary["resumed_from_step"] == resumed_step
    assert "resumed at step" in result.stdout
    assert os.listdir(os.path.join(killed, "export")) == ["1"] and leftovers(killed) == []
    for a, b in zip(_final_weights(killed), _final_weights(reference)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    assert abs(summary["validation"]["loss"] - _summary(reference)["validation"]["loss"]) < 1e-3
    # Rerunning a finished run changes nothing.
    run_tfam(tiny_args(small_wikitext, killed, **args))
    assert _summary(killed)["steps"] == 12


def test_a_larger_max_steps_extends_a_finished_run_exactly_and_a_smaller_one_is_refused(tmp_path, small_wikitext):
    # Item 1: --max-steps 20 then 25 trained 35 steps, its stream restarted at step 10. A constant learning rate
    # after the warmup (`--min-learning-rate-ratio 1`): the cosine decay stretches to the new --max-steps, so that
    # only then are the first 20 steps of both runs the same.
    args = {"backup-every": 10, "eval-every": 25, "jit": "off", "precision": "float32", "export": "off"}
    args["min-learning-rate-ratio"] = 1
    reference = str(tmp_path / "reference")
    run_tfam(tiny_args(small_wikitext, reference, **args, **{"max-steps": 25}))
    extended = str(tmp_path / "extended")
    run_tfam(tiny_args(small_wikitext, extended, **args, **{"max-steps": 20}))
    assert _summary(extended)["steps"] == 20
    result = run_tfam(tiny_args(small_wikitext, extended, **args, **{"max-steps": 25}))
    summary = _summary(extended)
    assert (summary["steps"], summary["max_steps"], summary["resumed_from_step"]) == (25, 25, 20)
    assert "(resumed at step 20)" in result.stdout
    for a, b in zip(_final_weights(extended), _final_weights(reference)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    backup = os.path.join(extended, "backup", "step-25.weights.h5")
    result = run_tfam(tiny_args(small_wikitext, extended, **args, **{"max-steps": 15}), check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"tfam: error: `--max-steps` must be at least 25, the step this run has reached ({backup}): a run is "
        "extended, never shortened (for fewer steps, use another --out). Received: max_steps=15"
    ]
    assert _summary(extended)["steps"] == 25


def test_two_mirrored_replicas_match_one_device(tmp_path, small_wikitext):
    args = {"max-steps": 6, "backup-every": 3, "eval-every": 6}
    single = str(tmp_path / "single")
    run_tfam(
        tiny_args(
            small_wikitext, single, **args, **{"batch-size": 4, "jit": "off", "precision": "float32", "export": "no"}
        )
    )
    mirrored = str(tmp_path / "mirrored")
    run_tfam(
        tiny_args(
            small_wikitext,
            mirrored,
            **args,
            **{"batch-size": 2, "cpu-devices": 2, "strategy": "mirrored", "export": "false"},
        )
    )
    assert _summary(mirrored)["replicas"] == 2 and _summary(mirrored)["jit_compile"] is False
    # A fresh `tfam` process pools its CPU tensor memory (pipelines/__init__.py), and its record says so.
    assert _summary(mirrored)["kernel_path"]["cpu_tensor_memory"] == "pooled"
    # Same batches, same initial weights, gradients all-reduced then clipped (as on
    # one device). What remains is float summation order: the two half-batch
    # gradients summed differ in the last bits from one full-batch gradient, and
    # Adam's first steps (g / sqrt(v)) turn near-zero components into +-lr moves.
    # SGD steps agree exactly (see test_mirrored_sgd_step_is_exact).
    single_loss, mirrored_loss = _summary(single)["validation"]["loss"], _summary(mirrored)["validation"]["loss"]
    assert abs(mirrored_loss - single_loss) / single_loss < 0.01


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_two_workers_with_tf_config_agree(tmp_path, small_wikitext):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    out = str(tmp_path / "multi")
    args = tiny_args(small_wikitext, out, **{"max-steps": 4, "backup-every": 2, "eval-every": 4, "batch-size": 2})
    processes = []
    for index in range(2):
        task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_CONFIG": json.dumps(task)}
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "pipelines.cli", *args],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outputs = [p.communicate(timeout=300) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(processes, outputs):
        assert p.returncode == 0, err[-3000:]
    chief, worker = _summary(out), _summary(os.path.join(out, "worker_1"))
    assert chief["replicas"] == worker["replicas"] == 2
    assert chief["steps"] == worker["steps"] == 4
    assert chief["validation"]["loss"] == pytest.approx(worker["validation"]["loss"], rel=1e-6)
    assert chief["export"] and not worker["export"]


def test_nan_never_overwrites_a_backup_or_the_best_checkpoint(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    backup = SafeBackupAndRestore(str(tmp_path / "backup"), delete_checkpoint=False)
    best = BestCheckpoint(str(tmp_path / "best.keras"))
    for callback in (backup, best):
        callback.set_model(model)
    backup.on_epoch_end(0, {"loss": float("nan")})
    best.on_epoch_end(0, {"loss": 1.0, "val_loss": float("nan")})
    assert not (tmp_path / "backup").exists() and not (tmp_path / "best.keras").exists()
    backup.on_epoch_end(0, {"loss": 1.0})
    best.on_epoch_end(0, {"loss": 1.0, "val_loss": 2.0})
    assert (tmp_path / "backup" / "epoch-1.weights.h5").exists() and best.best == 2.0
    best.on_epoch_end(1, {"loss": 1.0, "val_loss": 3.0})
    assert BestCheckpoint(str(tmp_path / "best.keras")).best == 2.0


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_runs_end_to_end(tmp_path, small_wikitext, precision):
    run = str(tmp_path / precision)
    run_tfam(
        tiny_args(
            small_wikitext,
            run,
            **{
                "max-steps": 4,
                "backup-every": 2,
                "eval-every": 2,
                "precision": precision,
                "samples": 1,
                "sample-tokens": 4,
            },
        )
    )
    summary = _summary(run)
    assert summary["steps"] == 4 and not summary["stopped_on_nan"]
    assert np.isfinite(summary["validation"]["loss"]) and summary["validation"]["loss"] < 9.0
    assert os.path.isfile(os.path.join(summary["export"], "saved_model.pb"))


def test_the_token_cache_is_in_the_run_and_keyed_by_tokenizer_and_text(tmp_path, capsys):
    # Item 0: with a corpus file as the split, the stream was cached beside the user's file
    # (`/data/corpus.txt.npy`), keyed by the file name alone: a later word-level run on the
    # same file trained and evaluated on the char ids.
    from pipelines.data.tokenizers import CharTokenizer, WordTokenizer
    from pipelines.run_data import cached_tokens

    data = tmp_path / "data"
    data.mkdir()
    corpus = str(data / "corpus.txt")
    lines = ["the game began", "the game ended"]
    run = str(tmp_path / "run")
    char, word = CharTokenizer.train(lines), WordTokenizer.train(lines)
    char_ids = cached_tokens(run, char, lines, corpus)
    word_ids = cached_tokens(run, word, lines, corpus)
    assert os.listdir(data) == []
    assert len(char_ids) == sum(len(line) + 1 for line in lines)
    ids = {w: i for i, w in enumerate(word.vocabulary)}
    np.testing.assert_array_equal(word_ids, [ids[w] for line in lines for w in line.split() + ["<eos>"]])
    # Edited text: another key, never the stale stream.
    assert len(cached_tokens(run, word, lines[:1], corpus)) == 4
    assert len(os.listdir(os.path.join(run, "cache"))) == 3
    # A damaged cache is derived data: rebuilt, with a notice naming it.
    [path] = [
        os.path.join(run, "cache", name)
        for name in os.listdir(os.path.join(run, "cache"))
        if np.load(os.path.join(run, "cache", name)).size == 8
    ]
    with open(path, "r+b") as f:
        f.truncate(100)
    np.testing.assert_array_equal(cached_tokens(run, word, lines, corpus), word_ids)
    assert capsys.readouterr().err.startswith(f"tfam: {path} cannot be read (")


def test_a_char_level_run_on_a_file_reports_bits_per_character(tmp_path, small_wikitext):
    # A character stream has no words: its measure is bits per character, and the summary,
    # summary.json and TensorBoard say so. The splits are a file, with no --data-dir (item 3).
    data = tmp_path / "data"
    data.mkdir()
    corpus = data / "corpus.txt"
    with open(os.path.join(small_wikitext, "wiki.valid.tokens"), encoding="utf-8") as f:
        corpus.write_text("".join(f.readlines()[:40]), encoding="utf-8")
    run = str(tmp_path / "char")
    args = tiny_args(
        None,
        run,
        tokenizer="char",
        **{
            "train-split": str(corpus),
            "eval-split": str(corpus),
            "max-steps": 1,
            "backup-every": 1,
            "eval-every": 1,
            "jit": "off",
            "export": "off",
        },
    )
    result = run_tfam([arg for arg in args if arg not in ("--data-dir", "None")])
    assert os.listdir(data) == ["corpus.txt"]
    validation = _summary(run)["validation"]
    assert "word_perplexity" not in validation
    assert validation["characters"] == validation["tokens"] == len(corpus.read_text(encoding="utf-8"))
    assert validation["bits_per_character"] == pytest.approx(validation["loss"] / np.log(2))
    assert "bits per character" in result.stdout and "word perplexity" not in result.stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(run, "logs", "validation"))
    events.Reload()
    assert "bits_per_character" in events.Tags()["tensors"] and "word_perplexity" not in events.Tags()["tensors"]


def test_file_splits_without_data_dir_never_reach_tfds(tmp_path, monkeypatch):
    # Item 3: without --data-dir, file splits went to the TFDS download (retrying offline).
    from pipelines.data import wikitext_tfds
    from pipelines.run_data import split_text

    def no_network(*args, **kwargs):
        raise AssertionError("TFDS (the network) was reached")

    monkeypatch.setattr(wikitext_tfds, "tfds_split_lines", no_network)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("first line\nsecond line\n")
    config = load_config("gpt2_tiny", {"train_split": str(corpus), "eval_split": str(tmp_path)})
    assert config.data_dir is None
    assert split_text(config, config.train_split) == ["first line", "second line"]
    assert split_text(config, config.eval_split) == ["first line", "second line"]
    with pytest.raises(AssertionError, match="TFDS"):  # named splits without data: TFDS, as documented
        split_text(config, "valid")


def test_offline_train_without_data_dir_fails_at_once_naming_data_dir(tmp_path, monkeypatch):
    # Item 8: offline, `tfam train` without --data-dir showed TFDS download progress and failed after 204-414 s
    # of retries. Here no host name resolves (this test's resolver), and TFDS must not be reached.
    import socket
    import time

    from pipelines.data import wikitext_tfds

    def no_such_host(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def downloads(*args, **kwargs):
        raise AssertionError("TFDS's download was reached")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    monkeypatch.setattr(wikitext_tfds.Wikitext, "download_and_prepare", downloads)
    run = str(tmp_path / "run")
    began = time.monotonic()
    result = run_tfam([arg for arg in tiny_args(None, run) if arg not in ("--data-dir", "None")], check=False)
    assert time.monotonic() - began < 30  # the lookups fail at once here; each is bounded by seconds anyway
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("tfam: error: WikiText (wikitext-2-v1) is not prepared in ") and "Pass --data-dir" in line
    assert "no answer from wikitext.smerity.com, s3.amazonaws.com (offline?)" in line
    assert not os.path.exists(run)


def test_every_config_value_is_checked_before_anything_is_written(tmp_path, small_wikitext):
    # Item 4: --vocabulary-size -5 trained with 5 words dropped and config.json recorded -5.
    result = run_tfam(tiny_args(small_wikitext, str(tmp_path / "r"), **{"vocabulary-size": -5}), check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "tfam: error: Invalid config: `vocabulary_size` must be unset or at least 2 for the word tokenizer. "
        "Received: vocabulary_size=-5"
    ]
    assert not (tmp_path / "r").exists()
    for overrides, received in [
        ({"tokenizer": "bpe", "vocabulary_size": 100}, "vocabulary_size=100"),
        ({"beta_2": 1.5}, "beta_2=1.5"),
        ({"learning_rate": float("nan")}, "learning_rate=nan"),
        ({"batch_size": 2.5}, "batch_size=2.5"),
        ({"learning_rate": "fast"}, "learning_rate='fast'"),
        ({"seed": -1}, "seed=-1"),
        ({"cpu_devices": 0}, "cpu_devices=0"),
        ({"dataset": "wikitext-3"}, "dataset='wikitext-3'"),
        ({"profile_steps": "5"}, "profile_steps='5'"),
        ({"weight_decay": float("inf")}, "weight_decay=inf"),
    ]:
        with pytest.raises(ValueError, match=f"Received: {re.escape(received)}$"):
            load_config("gpt2_tiny", overrides)
    # Values only the model can judge fail before anything is written too.
    for overrides, received in [
        ({"sequence-length": 600, "max-sequence-length": 100}, "Received: sequence_length=600"),
        ({"hidden-dim": 31}, "Received: hidden_dim=31, num_heads=2"),
        ({"position": "sinusoid"}, "invalid choice: 'sinusoid'"),
    ]:
        result = run_tfam(tiny_args(small_wikitext, str(tmp_path / "r"), **overrides), check=False)
        assert result.returncode == 2 and received in result.stderr, result.stderr
        assert not (tmp_path / "r").exists()


def test_a_nan_stop_exits_with_1(tmp_path, small_wikitext):
    # Item 7: "STOPPED: loss became NaN" exited 0.
    run = str(tmp_path / "nan")
    result = run_tfam(
        tiny_args(
            small_wikitext,
            run,
            **{
                "learning-rate": 1e30,
                "warmup-steps": 0,
                "max-steps": 4,
                "backup-every": 1,
                "eval-every": 1,
                "jit": "off",
            },
        ),
        check=False,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "STOPPED: loss became NaN" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("tfam: error: training stopped at step ")
    summary = _summary(run)
    assert summary["stopped_on_nan"] and summary["export"] is None and summary["final_checkpoint"] is None


def test_the_learning_rate_schedule_counts_optimizer_steps_under_gradient_accumulation():
    # Keras' schedules see batches: with 4 batches a step, the schedule at batch 4n is the schedule of step n.
    from pipelines.training import build_optimizer

    def schedule(optimizer):
        return keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])

    overrides = {"max_steps": 8, "warmup_steps": 2, "learning_rate": 1e-3, "min_learning_rate_ratio": 0.1}
    single = schedule(build_optimizer(load_config("gpt2_tiny", overrides)))
    optimizer = build_optimizer(load_config("gpt2_tiny", {**overrides, "gradient_accumulation_steps": 4}))
    accumulated = schedule(optimizer)
    assert optimizer.gradient_accumulation_steps == 4
    for step in range(9):
        np.testing.assert_allclose(float(accumulated(4 * step)), float(single(step)), rtol=1e-6)
    assert float(single(2)) == pytest.approx(1e-3) and float(single(8)) == pytest.approx(1e-4)
