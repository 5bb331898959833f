"""A run's logs in a real TensorBoard server on localhost: its HTTP API serves the runs and series the training
guide's table documents, and the values the run wrote."""

import glob
import json
import os
import re
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import tensorflow as tf
from markdown_pages import REPO

GUIDE = os.path.join(REPO, "docs", "guides", "training.md")
# What the `trained_run` fixture is, in the words of the guide's `in` column: a word-level GPT-2 run with samples.
TRAINED_RUN_KINDS = ("every run", "word and BPE runs", "runs with `--samples`")


def documented_series():
    """The rows of the guide's TensorBoard table: `[(run, tag, dashboard, in), ...]`, `dashboard` scalars or text."""
    with open(GUIDE, encoding="utf-8") as f:
        section = f.read().split("\n## TensorBoard\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        series, kind, what = (cell.strip() for cell in line.strip().strip("|").split("|"))
        match = re.fullmatch(r"`(\w+)/([\w/*]+)`(, \.\.\.)?", series)
        assert match, f"the guide's TensorBoard table has a series that is not `run/tag`: {series}"
        rows.append((match[1], match[2], "text" if "Text dashboard" in what else "scalars", kind))
    return rows


@pytest.fixture(scope="module")
def tensorboard_url(trained_run):
    """A TensorBoard server of the run's logs on a free localhost port, through TensorBoard's Python API."""
    from tensorboard import program

    servers = []

    def make_server(app, flags):
        servers.append(program.WerkzeugServer(app, flags))
        return servers[-1]

    board = program.TensorBoard(server_class=make_server)
    # Read the logs once, before serving (no reload thread), in Python (no data server binary).
    board.configure(
        argv=[None, "--logdir", os.path.join(trained_run, "logs"), "--host", "localhost", "--port", "0"]
        + ["--load_fast", "false", "--reload_interval", "0", "--reload_task", "blocking"]
    )
    url = board.launch().rstrip("/")
    try:
        yield url
    finally:
        servers[0].shutdown()
        servers[0].server_close()


def get(url, path, **query):
    address = f"{url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    assert urllib.parse.urlparse(address).hostname == "localhost"
    with urllib.request.urlopen(address, timeout=30) as response:
        return json.load(response)


def served_tags(url, plugin):
    """`{(run, tag)}` of a plugin's tags, once the server lists some (bounded wait)."""
    deadline = time.monotonic() + 60
    while True:
        tags = {(run, tag) for run, names in get(url, f"/data/plugin/{plugin}/tags").items() for tag in names}
        if tags or time.monotonic() > deadline:
            return tags
        time.sleep(0.2)


def written(run_dir, tag):
    """`{step: value}` of a scalar the run wrote, read from the event files with TensorFlow (not TensorBoard)."""
    values = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = float(tf.make_ndarray(value.tensor))
    return values


def test_the_guide_table_names_each_series_once_with_its_kind_of_run():
    rows = documented_series()
    names = [(run, tag) for run, tag, _, _ in rows]
    assert len(names) == len(set(names))
    assert {run for run, _ in names} == {"train", "validation"}
    assert set(TRAINED_RUN_KINDS) <= {kind for _, _, _, kind in rows}


def test_tensorboard_serves_the_documented_runs_and_series(tensorboard_url):
    expected = [row for row in documented_series() if row[3] in TRAINED_RUN_KINDS]
    scalars = {(run, tag) for run, tag, dashboard, _ in expected if dashboard == "scalars"}
    texts = {(run, tag) for run, tag, dashboard, _ in expected if dashboard == "text"}
    assert served_tags(tensorboard_url, "scalars") == scalars
    # `--samples 1`: the one sample the guide's `sample_0, ...` starts with.
    assert served_tags(tensorboard_url, "text") == texts == {("validation", "sample_0")}
    assert sorted(get(tensorboard_url, "/data/runs")) == sorted({run for run, _, _, _ in expected})


@pytest.mark.parametrize(("run", "tag"), [("train", "loss"), ("train", "learning_rate"), ("validation", "loss")])
def test_tensorboard_serves_the_values_the_run_wrote(trained_run, tensorboard_url, run, tag):
    served_tags(tensorboard_url, "scalars")
    served = get(tensorboard_url, "/data/plugin/scalars/scalars", run=run, tag=tag)
    steps = [step for _, step, _ in served]
    # --max-steps 4, --log-every 2, --eval-every 2: a point at steps 2 and 4.
    assert steps == [2, 4]
    values = written(os.path.join(trained_run, "logs", run), tag)
    assert sorted(values) == steps
    np.testing.assert_array_equal([value for _, _, value in served], [values[step] for step in steps])
    if (run, tag) == ("validation", "loss"):
        with open(os.path.join(trained_run, "summary.json"), encoding="utf-8") as f:
            final = json.load(f)["validation"]["loss"]
        # The summary's float64 loss, as the float32 scalar the event file holds.
        np.testing.assert_array_equal(served[-1][2], np.float32(final))
