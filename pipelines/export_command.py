"""`tfam export`: a run's checkpoint as a SavedModel for TF Serving (the default), or as a Hugging Face checkpoint
directory that transformers (and `from_huggingface`) load."""

import argparse
import os

from pipelines.config_flags import RenamedFlag, parse_positive_integers
from pipelines.drafting import DRAFTING_FLAGS, add_drafting_arguments, drafting_options, options_named_as_flags
from pipelines.errors import notice
from pipelines.run_loading import load_run

FORMATS = ("savedmodel", "huggingface")
# The options of the SavedModel's decoding, which a Hugging Face checkpoint does not hold.
SAVEDMODEL_OPTIONS = {
    "max_new_tokens_limit": None,
    "batch_sizes": None,
    "no_xla": False,
    **dict.fromkeys(("prompt_lookup", "max_matching_ngram_size", "draft_run", "num_draft_tokens")),
}


def _export(args):
    if args.format == "huggingface":
        given = [name for name, default in SAVEDMODEL_OPTIONS.items() if getattr(args, name) != default]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags} set the SavedModel's decoding: not with --format huggingface")
        return _export_huggingface(args)
    from pipelines.export import export_model

    model, tokenizer = load_run(args.run, args.checkpoint)
    with options_named_as_flags(DRAFTING_FLAGS):
        path = export_model(
            model,
            args.export_dir,
            tokenizer,
            overwrite=args.overwrite,
            max_new_tokens_limit=args.max_new_tokens_limit,
            jit_compile=not args.no_xla,
            **({} if args.batch_sizes is None else {"batch_sizes": args.batch_sizes}),
            **drafting_options(args, tokenizer),
        )
    print(f"exported {args.run} -> {path}")


def _export_huggingface(args):
    directory = args.export_dir
    if os.path.isdir(directory) and os.listdir(directory) and not args.overwrite:
        raise FileExistsError(f"{directory!r} exists and is not empty; pass --overwrite to write the export there")
    model, tokenizer = load_run(args.run, args.checkpoint)
    written = None
    if tokenizer is not None and tokenizer.kind == "huggingface":
        written = tokenizer.huggingface_tokenizer
    elif tokenizer is not None and tokenizer.kind == "bpe":
        written = tokenizer
    elif tokenizer is not None:
        notice(f"a {tokenizer.kind} tokenizer has no Hugging Face form: {directory} holds the model's weights only")
    model.save_to_huggingface(directory, tokenizer=written)
    print(f"exported {args.run} -> {directory} (Hugging Face)")


def add_export_command(commands, run_arguments):
    """Adds `export` to the `tfam` sub-command parser; `run_arguments` adds the run and `--checkpoint`."""
    export = commands.add_parser(
        "export", help="write the SavedModel (TF Serving layout), or a Hugging Face checkpoint directory"
    )
    run_arguments(export)
    # The name `tfam train` gives the same folder; `--out` (its run directory there) was this flag's old name.
    target = export.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--export-dir",
        help="savedmodel: the folder of the versions, or a version folder (ending in its number); huggingface: "
        "the checkpoint directory",
    )
    target.add_argument("--out", dest="export_dir", action=RenamedFlag, new_flag="--export-dir", help=argparse.SUPPRESS)
    export.add_argument(
        "--format",
        default="savedmodel",
        choices=FORMATS,
        help="savedmodel (default: TF Serving's signatures), or huggingface (config.json, model.safetensors, "
        "generation_config.json and the tokenizer's files, for transformers)",
    )
    export.add_argument("--overwrite", action="store_true", help="replace an existing version (or directory)")
    export.add_argument(
        "--max-new-tokens-limit",
        type=int,
        default=None,
        help="the most new tokens a generate request may ask for (default: 4096, or the model's context if longer)",
    )
    export.add_argument(
        "--batch-sizes",
        type=parse_positive_integers,
        default=None,
        metavar="N,N,...",
        help="batch sizes the decoding loop is compiled for, as TF Serving's allowed_batch_sizes (default: 1,2,4,8)",
    )
    export.add_argument(
        "--no-xla",
        action="store_true",
        help="decode without XLA, for a server that does not run it (TF Serving without --xla_cpu_compilation_enabled)",
    )
    add_drafting_arguments(export, verb="serve")
    export.set_defaults(handler=_export)
