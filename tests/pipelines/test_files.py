import json
import os

import pytest

from pipelines import files
from pipelines.errors import CorruptFileError
from pipelines.files import (
    atomic_path,
    atomic_write_json,
    read_json,
    remove_temporaries,
    verify_with_sidecar,
    write_with_sidecar,
)


class Killed(Exception):
    pass


def _writer(data):
    def write(path):
        with open(path, "wb") as f:
            f.write(data)

    return write


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(Killed):
        with atomic_path(path) as temp:
            with open(temp, "w") as f:
                f.write('{"v": 2')
            raise Killed
    assert read_json(path) == {"v": 1} and os.listdir(tmp_path) == ["a.json"]


def test_a_sidecar_tells_an_interrupted_write_from_a_damaged_file(tmp_path, monkeypatch):
    path = str(tmp_path / "model.bin")
    write_with_sidecar(path, _writer(b"one"), {"step": 1})
    assert verify_with_sidecar(path)["step"] == 1

    # Killed after the new sidecar, before the rename: the sidecar still describes
    # the file in place (as `previous`), and the next write starts from it.
    def fault_point(name):
        if name == "model-write":
            raise Killed

    monkeypatch.setattr(files, "fault_point", fault_point)
    with pytest.raises(Killed):
        write_with_sidecar(path, _writer(b"two!"), {"step": 2}, fault="model-write")
    with open(files.sidecar_path(path)) as f:
        assert json.load(f)["step"] == 2
    assert verify_with_sidecar(path)["step"] == 1
    write_with_sidecar(path, _writer(b"three"), {"step": 3})
    assert verify_with_sidecar(path)["step"] == 3

    with open(path, "r+b") as f:
        f.truncate(2)
    with pytest.raises(CorruptFileError, match=r"model.bin is truncated \(2 of 5 bytes\) \(according to model.json\)"):
        verify_with_sidecar(path)
    with open(path, "wb") as f:
        f.write(b"thr3e")
    with pytest.raises(CorruptFileError, match=r"does not have the content that was written \(SHA-256 differs\)"):
        verify_with_sidecar(path)


def test_damaged_json_names_the_file(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(CorruptFileError, match=f"^{empty} is empty \\(0 bytes\\)$"):
        read_json(empty)
    cut = tmp_path / "cut.json"
    cut.write_text('{"epoch": 3, "wei')
    with pytest.raises(CorruptFileError, match=f"^{cut} is not valid JSON \\(Unterminated string"):
        read_json(cut)


def test_only_temporaries_are_removed(tmp_path):
    for name in (
        ".tmp-1a2b3c4d-best.keras",
        "incomplete-epoch-3.weights.h5",
        "training_metadata.json.tmp",
        "best.keras",
        "epoch-3.weights.h5",
    ):
        (tmp_path / name).write_text("x")
    (tmp_path / ".tmp-5e6f7a8b-tokenizer").mkdir()
    (tmp_path / ".tmp-5e6f7a8b-tokenizer" / "vocab.txt").write_text("x")
    remove_temporaries(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "epoch-3.weights.h5"]
