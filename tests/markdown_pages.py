"""Helpers of the documentation tests: the Python blocks of a Markdown page, run as a reader pastes them."""

import os
import re

import keras

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), re.M | re.S)


def run_python_blocks(path, monkeypatch):
    """Runs a page's Python blocks in order in one namespace, from the repository's root."""
    monkeypatch.chdir(REPO)
    keras.utils.set_random_seed(0)
    namespace = {"__name__": "__docs__"}
    for number, block in enumerate(python_blocks(path), 1):
        try:
            exec(compile(block, f"{path} block {number}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"{path}: Python block {number} fails: {error!r}") from error
