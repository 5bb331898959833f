"""Damaged run state: every damaged file is named, with what is done about it, and the run goes on
wherever it can (a previous backup, `final.keras`, a tokenizer trained again)."""

import json
import os

import pytest
from pipeline_runs import TRAINED_RUN_OPTIONS, copy_run, run_tfam, tiny_args

from pipelines.checkpoints import load_checkpoint
from pipelines.commands import load_run
from pipelines.errors import CorruptFileError


def _truncate(path, size=None):
    size = os.path.getsize(path) // 2 if size is None else size
    with open(path, "r+b") as f:
        f.truncate(size)
    return size


def _summary(run):
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f)


def _rerun(small_wikitext, run, export="off", **kwargs):
    """Reruns a copy of `trained_run`, by default without a second export (`trained_run` has one)."""
    return run_tfam(tiny_args(small_wikitext, run, **TRAINED_RUN_OPTIONS, export=export), **kwargs)


def test_a_truncated_best_checkpoint_falls_back_to_final_and_the_rerun_replaces_it(
    tmp_path, trained_run, small_wikitext, capsys
):
    # Item 1: a kill inside `model.save` left a 1,924-byte best.keras; rerunning, generate,
    # eval and export then failed with "File not found" instead of using final.keras.
    run = copy_run(trained_run, tmp_path)
    best = os.path.join(run, "checkpoints", "best.keras")
    full = os.path.getsize(best)
    _truncate(best, 1924)
    with pytest.raises(CorruptFileError, match=f"is truncated \\(1,924 of {full:,} bytes\\)"):
        load_checkpoint(best)

    # What `tfam generate`, `eval` and `export` load.
    model, _ = load_run(run)
    assert capsys.readouterr().err.splitlines() == [
        f"tfam: {best} is truncated (1,924 of {full:,} bytes) (according to best.json): using final.keras instead"
    ]
    assert model.count_params() == load_checkpoint(os.path.join(run, "checkpoints", "final.keras")).count_params()

    result = _rerun(small_wikitext, run)
    assert (
        f"tfam: {best} is truncated (1,924 of {full:,} bytes) (according to best.json): moved it to best.keras.corrupt"
        in result.stderr
    )
    summary = _summary(run)
    assert summary["steps"] == 4 and summary["best_checkpoint"] == best
    load_checkpoint(best)  # the final evaluation wrote a new, complete one
    assert os.path.getsize(best + ".corrupt") == 1924  # kept for inspection, not deleted


def test_a_truncated_backup_falls_back_to_the_previous_one(tmp_path, trained_run, small_wikitext):
    # Item 2: a truncated backup crashed the rerun with an h5py traceback.
    run = copy_run(trained_run, tmp_path)
    latest = os.path.join(run, "backup", "step-4.weights.h5")
    full = os.path.getsize(latest)
    half = _truncate(latest)
    result = _rerun(small_wikitext, run)
    assert (
        f"tfam: {latest} is truncated ({half:,} of {full:,} bytes): resuming from the previous backup "
        "step-2.weights.h5 (step 2) instead"
    ) in result.stderr.splitlines()
    summary = _summary(run)
    assert summary["steps"] == 4 and summary["resumed_from_step"] == 2

    # No usable backup at all: one line, exit 1, and the backups are left as they are.
    backup_dir = os.path.join(run, "backup")
    damage = []
    for name in ("step-4.weights.h5", "step-2.weights.h5"):
        path = os.path.join(backup_dir, name)
        full = os.path.getsize(path)
        damage.append(f"{path} is truncated ({_truncate(path):,} of {full:,} bytes)")
    result = _rerun(small_wikitext, run, check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"tfam: error: {backup_dir} holds no usable backup ({'; '.join(damage)}); to start this run over from "
        f"step 0, move {backup_dir} away and rerun the command"
    ]
    assert sorted(os.listdir(backup_dir)) == ["step-2.weights.h5", "step-4.weights.h5", "training_metadata.json"]


def test_an_empty_backup_metadata_file_is_named_and_the_backups_are_found(tmp_path, trained_run, small_wikitext):
    # Item 8: an empty training_metadata.json gave "Expecting value: line 1 column 1 (char 0)".
    run = copy_run(trained_run, tmp_path)
    metadata = os.path.join(run, "backup", "training_metadata.json")
    open(metadata, "w").close()
    result = _rerun(small_wikitext, run)
    assert (
        f"tfam: {metadata} is empty (0 bytes): looking for the backups by their file names instead (2 found)"
    ) in result.stderr.splitlines()
    summary = _summary(run)
    assert summary["steps"] == 4 and summary["resumed_from_step"] == 4


def test_a_truncated_vocabulary_is_named_and_train_rebuilds_it(tmp_path, trained_run, small_wikitext):
    # Item 8: a truncated tokenizer/vocab.txt surfaced as "2 objects could not be loaded".
    run = copy_run(trained_run, tmp_path)
    vocab = os.path.join(run, "tokenizer", "vocab.txt")
    full = os.path.getsize(vocab)
    half = _truncate(vocab)
    damage = f"{vocab} is truncated ({half:,} of {full:,} bytes) (according to tokenizer.json)"
    result = run_tfam(["generate", run, "--prompt", "the game", "--max-new-tokens", "3"], check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"tfam: error: {damage}"]

    result = _rerun(small_wikitext, run, export="on")  # the rebuilt vocabulary is what the export serves
    assert (
        f"tfam: {damage}: trained the tokenizer again on the train split (identical to the recorded one) and rewrote it"
    ) in result.stderr.splitlines()
    assert os.path.getsize(vocab) == full
    load_run(run)


def test_a_damaged_config_json_is_named_and_nothing_is_overwritten(tmp_path, trained_run, small_wikitext):
    run = copy_run(trained_run, tmp_path)
    config = os.path.join(run, "config.json")
    with open(config, "w") as f:
        f.write('{"model": "gpt2_ti')
    result = _rerun(small_wikitext, run, check=False)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"tfam: error: {config} is not valid JSON (")
    assert "delete the file and rerun" in line
    with open(config) as f:
        assert f.read() == '{"model": "gpt2_ti'
