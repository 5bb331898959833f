"""`tfam eval` end to end: its defaults, its refusals, its progress line and its exit codes."""

import contextlib
import io
import json
import os
import pty
import subprocess
import sys

import pytest
from pipeline_runs import REPO, run_tfam

import pipelines.evaluation
from pipelines.cli import main


def test_eval_defaults_to_the_windows_the_run_was_trained_on(trained_run, small_wikitext):
    # The run trained on 32-token windows; eval defaulted to 128 and refused it.
    result = run_tfam(["eval", trained_run, "--data-dir", small_wikitext, "--split", "test"], check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["sequence_length"] == 32


@pytest.mark.parametrize(
    "option, value, received",
    [
        ("--knn-interpolation", "1.0", "knn_interpolation=1.0"),  # evaluated to a NaN loss, exit 0
        ("--knn-interpolation", "nan", "knn_interpolation=nan"),
        ("--knn-temperature", "0", "knn_temperature=0.0"),
        ("--knn-k", "0", "knn_k=0"),
    ],
)
def test_knn_settings_out_of_range_are_one_line_usage_errors(trained_run, small_wikitext, option, value, received):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(["eval", trained_run, "--data-dir", small_wikitext, "--knn-split", "valid", option, value])
    assert code == 2
    [line] = stderr.getvalue().splitlines()
    assert line.startswith("tfam: error: `") and line.endswith(f"Received: {received}")


def test_a_nan_loss_never_exits_0(trained_run, small_wikitext, monkeypatch):
    evaluate = pipelines.evaluation.evaluate_perplexity

    def nan_loss(*args, **kwargs):
        return {**evaluate(*args, **kwargs), "loss": float("nan")}

    monkeypatch.setattr(pipelines.evaluation, "evaluate_perplexity", nan_loss)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["eval", trained_run, "--data-dir", small_wikitext, "--split", "test"])
    assert code == 1 and stdout.getvalue() == ""
    [line] = stderr.getvalue().splitlines()
    assert line.startswith("tfam: error: the loss on test is nan (")


def _eval_on_a_terminal(args):
    """`(stdout, what a terminal on stderr shows)` of `tfam eval args`."""
    terminal, stderr = pty.openpty()
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "eval", *args],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    os.close(stderr)
    shown = b""
    while True:
        try:
            data = os.read(terminal, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        shown += data
    os.close(terminal)
    stdout = process.stdout.read()
    assert process.wait(timeout=300) == 0, shown.decode()
    return stdout, shown.decode()


def test_eval_shows_its_progress_on_a_terminal_unless_quiet(trained_run, small_wikitext):
    # A full split printed nothing for minutes.
    args = [trained_run, "--data-dir", small_wikitext, "--split", "test"]
    stdout, shown = _eval_on_a_terminal(args)
    tokens = json.loads(stdout.splitlines()[-1])["tokens"]
    frames = [frame.strip() for frame in shown.replace("\n", "\r").split("\r") if frame.strip()]
    assert frames[0].startswith("eval: ") and "tokens/s" in frames[0]
    assert frames[-1].startswith(f"eval: {tokens:,} tokens in ") and frames[-1].endswith(" tokens/s")
    stdout, shown = _eval_on_a_terminal(args + ["--quiet"])
    assert shown == "" and json.loads(stdout.splitlines()[-1])["tokens"] == tokens


def test_eval_of_a_run_s_checkpoint_file_uses_the_run_s_tokenizer_and_windows(trained_run, small_wikitext):
    # `tfam eval RUN/checkpoints/final.keras` said "has no tokenizer/ folder".
    final = os.path.join(trained_run, "checkpoints", "final.keras")
    by_file = run_tfam(["eval", final, "--data-dir", small_wikitext])
    by_run = run_tfam(["eval", trained_run, "--checkpoint", "final", "--data-dir", small_wikitext])
    assert by_file.stderr == "" and json.loads(by_file.stdout) == json.loads(by_run.stdout)
    assert json.loads(by_file.stdout)["sequence_length"] == 32
