"""A run killed (SIGKILL) at any point of its life finishes when the same command is run again.

Each case kills a short run at one named point (`TFAM_FAULT`, see
`pipelines.faults`: no timing luck), then reruns the same command and checks
what a user relies on: all steps done, a best checkpoint that loads, exactly
one complete export, and nothing left behind (temporaries, staging folders,
the lock). `final-write` is not among the cases: final.keras is written
like best.keras (`write_with_sidecar`), which `best-write` covers; nor is a kill mid-epoch, which
`test_training.test_killed_run_resumes_and_matches_an_uninterrupted_one` makes (and checks the same way,
and against an uninterrupted run).
"""

import json
import os
import signal

import pytest
from pipeline_runs import leftovers, run_tfam, tiny_args

from pipelines.checkpoints import load_checkpoint

# 2 epochs of 2 steps, a validation and a backup after each.
OPTIONS = {"max-steps": 4, "backup-every": 2, "eval-every": 2, "jit": "off"}

POINTS = {
    "train-begin": "compiled and restored, before the first step",
    "backup-write:2": "inside the second backup's write, before its rename",
    "best-write:2": "inside the second best checkpoint's write (best.json already new)",
    "export-write": "inside the export, staged but not renamed to its version",
}


@pytest.mark.parametrize("point", list(POINTS), ids=list(POINTS))
def test_a_run_killed_anywhere_finishes_when_rerun(point, tmp_path, small_wikitext):
    run = str(tmp_path / "run")
    args = tiny_args(small_wikitext, run, **OPTIONS)
    killed = run_tfam(args, env={"TFAM_FAULT": point}, check=False)
    assert killed.returncode == -signal.SIGKILL, f"not killed {POINTS[point]}: {killed.stderr[-2000:]}"
    assert os.path.isfile(os.path.join(run, ".lock"))  # as a killed process leaves it

    result = run_tfam(args)
    assert "which is no longer running: taking it over" in result.stderr
    with open(os.path.join(run, "summary.json")) as f:
        summary = json.load(f)
    assert summary["steps"] == 4 and not summary["stopped_on_nan"]
    load_checkpoint(summary["best_checkpoint"])
    export = os.path.join(run, "export")
    assert os.listdir(export) == ["1"] and summary["export"] == os.path.join(export, "1")
    assert os.path.isfile(os.path.join(export, "1", "saved_model.pb"))
    assert leftovers(run) == []
