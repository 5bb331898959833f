"""Every relative link of the Markdown a user reads (README, BENCHMARKS, CHANGELOG, the benchmarks' READMEs, the
documentation pages) names a file of the repository, and a `#fragment` names a heading of the page it points to;
README.md and BENCHMARKS.md keep within the sizes a reader can take in; none of them narrates its development."""

import os
import re

import pytest

from tests.markdown_pages import REPO

TOP_LEVEL = ["README.md", "BENCHMARKS.md", "CHANGELOG.md", "benchmarks/README.md", "benchmarks/experiments/README.md"]
DOCS = sorted(
    os.path.relpath(os.path.join(folder, name), REPO)
    for folder, _, names in os.walk(os.path.join(REPO, "docs"))
    for name in names
    if name.endswith(".md")
)
PAGES = TOP_LEVEL + DOCS
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"^```.*?^```$|`[^`\n]*`", re.M | re.S)


def _text(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def _anchors(path):
    """The fragments of a page's headings, as GitHub and MkDocs spell them (lower case, punctuation dropped,
    spaces as hyphens)."""
    headings = re.findall(r"^#+\s+(.*?)\s*$", CODE.sub("", _text(path)), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def _relative_links(path):
    for target in LINK.findall(CODE.sub("", _text(path))):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
            yield target


@pytest.mark.parametrize("path", PAGES)
def test_every_relative_link_resolves(path):
    broken = []
    for target in _relative_links(path):
        file, _, fragment = target.partition("#")
        linked = os.path.normpath(os.path.join(REPO, os.path.dirname(path), file)) if file else os.path.join(REPO, path)
        if not os.path.exists(linked):
            broken.append(f"{target} (no such file)")
        elif fragment and linked.endswith(".md") and fragment not in _anchors(os.path.relpath(linked, REPO)):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{path}: " + "; ".join(broken)


def test_every_page_has_relative_links_the_test_reads():
    assert any(_relative_links("README.md")), "README.md links to no guide"
    assert len(DOCS) > 10


@pytest.mark.parametrize("path, most_lines", [("README.md", 200), ("BENCHMARKS.md", 250)])
def test_the_front_pages_keep_their_size(path, most_lines):
    lines = len(_text(path).splitlines())
    assert lines <= most_lines, f"{path} has {lines} lines; keep it within {most_lines} (the rest belongs in docs/)"


@pytest.mark.parametrize("path", PAGES)
def test_no_page_cites_issue_numbers(path):
    cited = re.findall(r"(?:\bissue\s+#?|(?<![\w&/])#)\d+\b", CODE.sub("", _text(path)), re.I)
    assert not cited, f"{path} cites {cited}: say what the change is, git history says when"
