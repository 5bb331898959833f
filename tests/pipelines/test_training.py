import json
import os
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from pipeline_runs import REPO, run_tfam, tiny_args

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
    args = dict(**{"max-steps": 12, "backup-every": 3, "eval-every": 6})
    reference = str(tmp_path / "reference")
    run_tfam(tiny_args(small_wikitext, reference, **args))

    killed = str(tmp_path / "killed")
    metadata = os.path.join(killed, "backup", "training_metadata.json")
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *tiny_args(small_wikitext, killed, **args)],
        cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if os.path.isfile(metadata):
            with open(metadata) as f:
                if json.load(f)["epoch"] >= 2:
                    break
        time.sleep(0.05)
    assert process.poll() is None, "training ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    with open(metadata) as f:
        resumed_epoch = json.load(f)["epoch"]
    assert 2 <= resumed_epoch < 4

    result = run_tfam(tiny_args(small_wikitext, killed, **args))
    summary = _summary(killed)
    assert summary["steps"] == 12
    assert summary["resumed_from_step"] == 3 * resumed_epoch
    assert "resumed at step" in result.stdout
    for a, b in zip(_final_weights(killed), _final_weights(reference)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    assert abs(summary["validation"]["loss"] - _summary(reference)["validation"]["loss"]) < 1e-3
    # Rerunning a finished run changes nothing.
    run_tfam(tiny_args(small_wikitext, killed, **args))
    assert _summary(killed)["steps"] == 12


def test_two_mirrored_replicas_match_one_device(tmp_path, small_wikitext):
    args = {"max-steps": 6, "backup-every": 3, "eval-every": 6}
    single = str(tmp_path / "single")
    run_tfam(tiny_args(small_wikitext, single, **args, **{"batch-size": 4, "jit": "off"}))
    mirrored = str(tmp_path / "mirrored")
    run_tfam(
        tiny_args(small_wikitext, mirrored, **args, **{"batch-size": 2, "cpu-devices": 2, "strategy": "mirrored"})
    )
    assert _summary(mirrored)["replicas"] == 2 and _summary(mirrored)["jit_compile"] is False
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
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        processes.append(
            subprocess.Popen([sys.executable, "-m", "pipelines.cli", *args], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    run_tfam(tiny_args(small_wikitext, run, **{"max-steps": 4, "backup-every": 2, "eval-every": 2,
                                               "precision": precision, "samples": 1, "sample-tokens": 4}))
    summary = _summary(run)
    assert summary["steps"] == 4 and not summary["stopped_on_nan"]
    assert np.isfinite(summary["validation"]["loss"]) and summary["validation"]["loss"] < 9.0
    assert os.path.isfile(os.path.join(summary["export"], "saved_model.pb"))
