"""Every Python block of the documentation pages (docs/**/*.md) and of the README runs, in order, as a reader
pastes them: so the guides and the README's examples cannot drift from the library."""

import os
import re

import keras
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKDOWN = sorted(
    os.path.relpath(os.path.join(root, name), REPO)
    for root, _, names in os.walk(os.path.join(REPO, "docs"))
    for name in names
    if name.endswith(".md")
) + ["README.md"]


def python_blocks(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), re.M | re.S)


@pytest.mark.parametrize("path", [path for path in MARKDOWN if python_blocks(path)])
def test_markdown_examples_run(path, monkeypatch):
    """A page's Python blocks run in order in one namespace, as a reader pastes them, from the repository's root."""
    monkeypatch.chdir(REPO)
    keras.utils.set_random_seed(0)
    namespace = {"__name__": "__docs__"}
    for number, block in enumerate(python_blocks(path), 1):
        try:
            exec(compile(block, f"{path} block {number}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"{path}: Python block {number} fails: {error!r}") from error
