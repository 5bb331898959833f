"""Helpers of the pipeline tests: a small WikiText folder and running `tfam` in a subprocess."""

import os
import subprocess
import sys

import pytest
from shared_data import WIKITEXT2

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_small_wikitext(folder):
    """The first lines of the real validation and test splits, for quick runs."""
    if not os.path.isfile(os.path.join(WIKITEXT2, "wiki.valid.tokens")):
        pytest.skip("../shared/data/wikitext-2 not present")
    for split, count in (("valid", 300), ("test", 120)):
        with open(os.path.join(WIKITEXT2, f"wiki.{split}.tokens"), encoding="utf-8") as f:
            lines = f.read().split("\n")[:count]
        with open(folder / f"wiki.{split}.tokens", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return str(folder)


# The options of the `trained_run` fixture: a rerun of a copy of it repeats them.
TRAINED_RUN_OPTIONS = {
    "max-steps": 4,
    "backup-every": 2,
    "eval-every": 2,
    "log-every": 2,
    "samples": 1,
    "sample-tokens": 4,
    "jit": "off",
    "export-batch-sizes": "1,2",
}


def tiny_args(data_dir, out, **overrides):
    values = {
        "data-dir": data_dir,
        "train-split": "valid",
        "eval-split": "test",
        "num-layers": 1,
        "hidden-dim": 32,
        "num-heads": 2,
        "sequence-length": 32,
        "batch-size": 4,
        "samples": 0,
        "warmup-steps": 2,
        "dropout": 0.0,
        "learning-rate": 3e-3,
        "export-batch-sizes": 1,  # a loop compiled for one batch size, not four
        "out": out,
    }
    values.update(overrides)
    args = ["train"]
    for key, value in values.items():
        args += [f"--{key}", str(value)]
    return args


# Options that configure TensorFlow itself (devices, distribution), which a process can do only once.
PROCESS_OPTIONS = ("--cpu-devices", "--strategy")


def run_tfam(args, env=None, timeout=300, check=True, in_process=None, **kwargs):
    """Runs `tfam args`: a `subprocess.CompletedProcess`-like result (`returncode`, `stdout`, `stderr`).

    In this process by default, as `pipelines.cli.main(args)` with its output captured: the command's
    code, arguments, exit codes and messages are the same, without a TensorFlow start-up per run.
    In a fresh process (`python -m pipelines.cli`) when asked, when `env` is set (fault points, ...)
    or when the options configure TensorFlow's devices.
    """
    _take_the_path_of_a_cpu_without_bfloat16_units()
    if in_process is None:
        in_process = env is None and not kwargs and not any(arg in PROCESS_OPTIONS for arg in args)
    if in_process:
        result = _run_in_process(args)
    else:
        environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1", **(env or {})}
        result = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", *args],
            cwd=REPO,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )
    if check and result.returncode != 0:
        raise AssertionError(f"tfam {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def _take_the_path_of_a_cpu_without_bfloat16_units():
    """Runs in the tests take the kernel path of this CPU without its bfloat16 units: XLA (or what the test
    sets) in float32, on every machine. A measured choice could differ between two runs that a test
    compares, and would time every tiny run; the measured choice has its own tests (test_kernel_path.py)."""
    from pipelines.kernel_path import BFLOAT16_FLAGS, cpu_flags

    os.environ.setdefault("TFAM_CPU_FLAGS", " ".join(sorted(cpu_flags() - set(BFLOAT16_FLAGS))))


def _run_in_process(args):
    import contextlib
    import io

    import keras

    from pipelines.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    policy = keras.mixed_precision.global_policy()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main([str(arg) for arg in args])
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        keras.mixed_precision.set_global_policy(policy)  # `tfam train` sets the run's precision
    return subprocess.CompletedProcess(["tfam", *args], code, stdout.getvalue(), stderr.getvalue())


def copy_run(run, folder):
    """A copy of the run directory `run` in `folder` (to damage it without touching the original)."""
    import shutil

    copy = os.path.join(str(folder), os.path.basename(run))
    shutil.copytree(run, copy, symlinks=True)
    return copy


def leftovers(run):
    """What a finished run must not keep: temporaries, staging folders, locks (paths relative to `run`)."""
    found = []
    for root, folders, files in os.walk(run):
        for name in folders + files:
            if name.startswith((".tmp-", ".incomplete-", ".replaced-")) or name in (".lock", ".export.lock"):
                found.append(os.path.relpath(os.path.join(root, name), run))
    return found
