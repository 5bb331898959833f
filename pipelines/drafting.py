"""The drafting options of `tfam generate` and `tfam export`: prompt lookup, or a draft run's model."""

import contextlib

from pipelines.run_loading import load_run

# The keyword arguments of `generate` (and `export_model`) that drafting sets, and their flags.
DRAFTING_FLAGS = {
    "prompt_lookup_num_tokens": "--prompt-lookup",
    "max_matching_ngram_size": "--max-matching-ngram-size",
    "num_draft_tokens": "--num-draft-tokens",
    "draft_model": "--draft-run",
}


def add_drafting_arguments(parser, verb="decode"):
    """Adds `--prompt-lookup`, `--max-matching-ngram-size`, `--draft-run` and `--num-draft-tokens`; `verb` says
    what they change (`"decode"`, or `"serve"` for an export)."""
    lookup = parser.add_argument_group("prompt lookup", f"{verb} the same text in fewer passes where it repeats")
    lookup.add_argument(
        "--prompt-lookup", type=int, default=None, metavar="K",
        help="draft K tokens per step from the text so far (after the last n-gram's earliest occurrence) and verify "
        "them in one pass of the model",
    )  # fmt: skip
    lookup.add_argument(
        "--max-matching-ngram-size", type=int, default=None, metavar="M",
        help="with --prompt-lookup: the longest n-gram looked up (default 2)",
    )  # fmt: skip
    speculative = parser.add_argument_group("speculative decoding", f"{verb} the same text, drafted by a smaller run")
    speculative.add_argument("--draft-run", metavar="RUN", help="a run with the same tokenizer whose model drafts")
    speculative.add_argument(
        "--num-draft-tokens", type=int, default=None, metavar="K",
        help="with --draft-run: tokens drafted and verified per pass of the model (default 4)",
    )  # fmt: skip


def drafting_options(args, tokenizer):
    """The drafting keyword arguments of `generate` and `export_model` from the flags: the model of
    `--draft-run` (its best checkpoint) refused unless it tokenizes as the run (`tokenizer`)."""
    draft = None
    if args.draft_run is not None:
        draft, draft_tokenizer = load_run(args.draft_run, needs_tokenizer=True)
        if tokenizer is None or draft_tokenizer.fingerprint() != tokenizer.fingerprint():
            mine = "no tokenizer" if tokenizer is None else f"{tokenizer.kind} of {tokenizer.vocabulary_size}"
            raise ValueError(
                f"`--draft-run` must tokenize as the run (the same tokenizer files). Received: draft_run="
                f"{args.draft_run} with a {draft_tokenizer.kind} tokenizer of {draft_tokenizer.vocabulary_size} "
                f"ids, the run's {mine}"
            )
    return dict(
        prompt_lookup_num_tokens=args.prompt_lookup,
        max_matching_ngram_size=args.max_matching_ngram_size,
        draft_model=draft,
        num_draft_tokens=args.num_draft_tokens,
    )


@contextlib.contextmanager
def options_named_as_flags(flags):
    """Re-raises a `ValueError` naming an option of `flags` (`{name: flag}`, `DRAFTING_FLAGS`, ...) with its
    flag instead."""
    try:
        yield
    except ValueError as error:
        message = str(error)
        for name, flag in flags.items():
            message = message.replace(f"`{name}`", f"`{flag}`")
        raise ValueError(message) from error
