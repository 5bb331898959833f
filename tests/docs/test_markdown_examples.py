"""Every Python block of the documentation pages (docs/**/*.md) runs, in order, as a reader pastes them: so the
guides cannot drift from the library. The README's blocks are `test_readme_examples.py` (a file of their own,
so that the two pages' runs, the longest of the suite, go to two workers)."""

import os

import pytest
from markdown_pages import REPO, python_blocks, run_python_blocks

MARKDOWN = sorted(
    os.path.relpath(os.path.join(root, name), REPO)
    for root, _, names in os.walk(os.path.join(REPO, "docs"))
    for name in names
    if name.endswith(".md")
)


@pytest.mark.parametrize("path", [path for path in MARKDOWN if python_blocks(path)])
def test_markdown_examples_run(path, monkeypatch):
    """A page's Python blocks run in order in one namespace, as a reader pastes them, from the repository's root."""
    run_python_blocks(path, monkeypatch)
