"""The README's Python blocks run, in order, as a reader pastes them (see `test_markdown_examples.py`)."""

from markdown_pages import python_blocks, run_python_blocks


def test_readme_examples_run(monkeypatch):
    assert python_blocks("README.md")
    run_python_blocks("README.md", monkeypatch)
