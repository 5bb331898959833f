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


def smoke_run(folder, name="run", **flags):
    """A `tfam train` run of a tiny GPT-2 for two steps on the first lines of WikiText-2, made in `folder` for
    `--smoke` (`flags`, `{flag: value}`, on top of the tiny settings): `(run directory, data directory)`."""
    import contextlib
    import io
    import os

    from timing import small_wikitext

    from pipelines.cli import main

    data_dir = os.path.join(folder, "wikitext-2")
    if not os.path.isdir(data_dir):
        small_wikitext(data_dir)
    run = os.path.join(folder, name)
    settings = {
        "data-dir": data_dir,
        "train-split": "valid",
        "eval-split": "test",
        "num-layers": 1,
        "hidden-dim": 32,
        "num-heads": 2,
        "sequence-length": 32,
        "max-sequence-length": 128,  # the mini protocol's blocks
        "context-length": 128,
        "batch-size": 4,
        "max-steps": 2,
        "warmup-steps": 1,
        "eval-every": 2,
        "backup-every": 2,
        "samples": 0,
        "jit": "off",  # two steps: compiling them would take longer than running them
        "precision": "float32",
        "out": run,
        **flags,
    }
    argv = ["train", "--no-export", *(item for key, value in settings.items() for item in (f"--{key}", str(value)))]
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = main(argv)
    if code:
        raise SystemExit(f"tfam {' '.join(argv)} failed (exit code {code}):\n{output.getvalue()[-3000:]}")
    return run, data_dir
