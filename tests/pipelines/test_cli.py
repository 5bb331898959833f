"""`tfam`'s argument parsing: a usage error is one `tfam: error:` line and exit code 2."""

import contextlib
import io
import os

import pytest
from pipeline_runs import run_tfam

from pipelines.cli import build_parser, main


def _usage_error(argv):
    """`(exit code, stderr lines)` of `tfam argv` when parsing fails (in this process)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit_:
        main(argv)
    return exit_.value.code, stderr.getvalue().splitlines()


@pytest.mark.parametrize("spelling, value", [("yes", True), ("NO", False), ("on", True), ("0", False)])
def test_use_bias_takes_the_usual_boolean_spellings(spelling, value):
    assert build_parser().parse_args(["train", "--use-bias", spelling]).use_bias is value


def test_a_bad_boolean_is_a_one_line_usage_error():
    # `tfam train --use-bias yes` ended in a KeyError traceback with exit code 1.
    code, lines = _usage_error(["train", "--use-bias", "maybe"])
    assert code == 2
    assert lines == [
        "tfam: error: argument --use-bias: must be a boolean: true/false, yes/no, on/off or 1/0 (any case). "
        "Received: 'maybe' (see tfam train --help)"
    ]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["train", "--attention-options", "[1, 2]"],
            "argument --attention-options: must be a JSON object. Received: a JSON list, '[1, 2]'",
        ),
        (["train", "--num-layers", "2.5"], "argument --num-layers: invalid int value: '2.5'"),
        (["eval"], "the following arguments are required: run"),
        (["launch"], "argument command: invalid choice: 'launch'"),
        (
            ["export", "runs/demo", "--export-dir", "x", "--batch-sizes", "1,0"],
            "argument --batch-sizes: must be positive integers separated by commas. Received: '1,0'",
        ),
    ],
)
def test_every_usage_error_is_one_line(argv, expected):
    code, lines = _usage_error(argv)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"tfam: error: {expected}")


def test_another_keras_backend_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(["eval", "runs/demo"])
    assert code == 2
    assert stderr.getvalue().splitlines() == ["tfam: error: tfam runs on TensorFlow. Received: KERAS_BACKEND='jax'"]


def test_an_option_that_does_not_fit_an_init_from_checkpoint_names_its_flag(small_wikitext, tmp_path):
    # `--init-from DIR --position learned` blamed `position_options`, which the user never gave.
    fixture = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf-llama-tiny"))
    args = ["train", "--init-from", fixture, "--position", "learned", "--data-dir", small_wikitext]
    args += ["--train-split", "valid", "--eval-split", "test", "--out", str(tmp_path / "run")]
    result = run_tfam(args, check=False)  # in this process
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"tfam: error: `--position learned` does not fit the checkpoint of `--init-from` {fixture}, whose "
        "config.json sets `position_options`: "
    ), line
