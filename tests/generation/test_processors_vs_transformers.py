"""Greedy `generate` with logits processors against transformers' `generate` with the same options.

The references (tests/fixtures/generation-references.json) were written by transformers from the tiny
GPT-2 and Llama 3 checkpoints by scripts/make_generation_references.py: for each case its tokens, the
log-softmax of its raw logits at each chosen token (0 after a row stopped) and the new tokens per row.
"""

import json
import os

import numpy as np
import pytest

from keras_tfam.models import from_huggingface

HERE = os.path.dirname(__file__)
DIRECTORIES = {
    "hf-gpt2-tiny": os.path.join(HERE, "..", "..", "..", "shared", "fixtures", "hf-gpt2-tiny"),
    "hf-llama-tiny": os.path.join(HERE, "..", "fixtures", "hf-llama-tiny"),
}
with open(os.path.join(HERE, "..", "fixtures", "generation-references.json"), encoding="utf-8") as f:
    CASES = json.load(f)["cases"]


def case_id(case):
    return f"{case['fixture']}-{case['name']}"


@pytest.fixture(scope="module")
def load():
    """The model of a fixture, loaded once for the module."""
    models = {}

    def load(fixture):
        if not os.path.isdir(DIRECTORIES[fixture]):
            pytest.skip(f"{fixture} not present")
        if fixture not in models:
            models[fixture] = from_huggingface(DIRECTORIES[fixture])
        return models[fixture]

    return load


def options(case):
    """keras_tfam's `generate` options of a case: the JSON's, with `logit_bias` keyed by int ids."""
    out = dict(case["options"])
    if "logit_bias" in out:
        out["logit_bias"] = {int(i): float(bias) for i, bias in out["logit_bias"].items()}
    return out


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_greedy_tokens_and_logprobs_match_transformers(load, case):
    result = load(case["fixture"]).generate(
        np.array(case["prompt_ids"]),
        max_new_tokens=case["max_new_tokens"],
        pad_token_id=case["pad_token_id"],
        return_logprobs=True,
        **options(case),
    )
    np.testing.assert_array_equal(result["token_ids"], case["token_ids"])
    np.testing.assert_array_equal(result["num_generated"], case["num_generated"])
    np.testing.assert_allclose(result["logprobs"], case["logprobs"], atol=1e-4)


# One compiled loop per case and form: the array form is checked where its steering differs most.
ARRAY_CASES = [case for case in CASES if case["name"] in ("plain", "min_new_tokens", "logit_bias+suppress_token_ids")]


@pytest.mark.parametrize("case", ARRAY_CASES, ids=case_id)
def test_without_logprobs_generate_returns_the_tokens(load, case):
    generated = load(case["fixture"]).generate(
        np.array(case["prompt_ids"]),
        max_new_tokens=case["max_new_tokens"],
        pad_token_id=case["pad_token_id"],
        **options(case),
    )
    assert isinstance(generated, np.ndarray)
    np.testing.assert_array_equal(generated, case["token_ids"])
