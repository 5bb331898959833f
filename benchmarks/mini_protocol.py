"""The mini protocol's data for the benchmarks: a `tfam train` run, its tokenizer, the splits as blocks.

Mini protocol (not WikiText-2 test perplexity): the model was trained on the
validation split (the "training split" here) and is evaluated on the test
split, both cut into the same 128-token blocks as `tfam eval`.
"""

import numpy as np

from pipelines.commands import load_run
from pipelines.data.lm_stream import make_blocks, tokenize_lines
from pipelines.data.wikitext import count_words, split_lines


def load_mini_protocol(run_dir, data_dir, sequence_length=128):
    """`(model, tokenizer, splits)`; `splits[name] = (inputs, targets, weights, words)` for valid and test."""
    model, tokenizer = load_run(run_dir)
    if tokenizer is None:
        raise SystemExit(f"{run_dir} has no tokenizer/ folder")
    splits = {}
    for name in ("valid", "test"):
        lines = split_lines(data_dir, name)
        tokens = tokenize_lines(tokenizer, lines)
        splits[name] = (*make_blocks(tokens, sequence_length, tokenizer.eos_id), count_words(lines))
    return model, tokenizer, splits


def perplexities(total_nll, tokens, words=None):
    """Token perplexity (and word perplexity when the split's word count is given)."""
    result = {"token_perplexity": float(np.exp(total_nll / tokens))}
    if words is not None:
        result["word_perplexity"] = float(np.exp(total_nll / words))
    return result
