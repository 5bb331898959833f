"""Where the shared WikiText-2 files and fixtures are (../shared beside the checkout)."""

import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
WIKITEXT2 = os.path.join(ROOT, "data", "wikitext-2")

requires_wikitext = pytest.mark.skipif(
    not os.path.isfile(os.path.join(WIKITEXT2, "wiki.valid.tokens")), reason="../shared/data/wikitext-2 not present"
)
