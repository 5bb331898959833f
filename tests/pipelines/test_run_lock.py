import os
import socket
import subprocess
import sys

import pytest
from pipeline_runs import run_tfam, tiny_args

from pipelines.errors import RunInUse
from pipelines.run_lock import RunLock


def test_one_holder_at_a_time_and_the_holder_is_named(tmp_path):
    with RunLock(str(tmp_path / "run")):
        with pytest.raises(RunInUse, match=f"in use by pid {os.getpid()} on {socket.gethostname()} since "):
            RunLock(str(tmp_path / "run")).acquire()
    # Released: the lock file is gone, and the folder with it (the lock had created it).
    assert not (tmp_path / "run").exists()
    with RunLock(str(tmp_path / "run")):
        pass


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(
        f'{{"pid": {dead.pid}, "host": "{socket.gethostname()}", "started": "2026-01-01T00:00:00", '
        '"command": "tfam train --out run"}'
    )
    with RunLock(str(run)):
        pass
    assert capsys.readouterr().err == (
        f"tfam: {run / '.lock'} was left by pid {dead.pid} on {socket.gethostname()} since 2026-01-01T00:00:00 "
        "(tfam train --out run), which is no longer running: taking it over\n"
    )
    assert os.listdir(run) == []


def test_a_second_train_on_the_same_run_refuses_at_once(tmp_path, small_wikitext):
    # Item 6: two `tfam train` on one --out ran at once; one died on a rename race.
    run = tmp_path / "run"
    with RunLock(str(run)):
        result = run_tfam(tiny_args(small_wikitext, str(run)), check=False)
        assert os.listdir(run) == [".lock"]  # nothing written by the second process
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"tfam: error: {run} is in use by pid {os.getpid()} on {socket.gethostname()} since ")


def test_lock_holder_names_a_live_holder_only(tmp_path):
    from pipelines.run_lock import lock_holder

    run = tmp_path / "run"
    assert lock_holder(str(run)) is None  # no run
    with RunLock(str(run)):
        holder = lock_holder(str(run))
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(RunInUse):  # the probe left the lock as it was
            RunLock(str(run)).acquire()
    run.mkdir()
    (run / ".lock").write_text('{"pid": 1, "host": "elsewhere"}')  # left by a killed process
    assert lock_holder(str(run)) is None
    with RunLock(str(run)):  # and the probe does not keep it
        pass
