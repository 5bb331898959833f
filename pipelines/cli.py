"""The `tfam` command line: data statistics, training, evaluation, generation, export.

    tfam data stats --data-dir DIR --split valid
    tfam train --config gpt2_tiny --data-dir DIR --train-split valid --eval-split test --max-steps 20 --out RUN
    tfam eval RUN --data-dir DIR --split test
    tfam generate RUN --prompt "The meaning of life" --max-new-tokens 40 --sampler top_p
    tfam export RUN --out saved_models/gpt2_tiny/1
"""

import argparse
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _data_stats(args):
    from pipelines.data.tokenizers import load_tokenizer
    from pipelines.data.wikitext import split_lines, split_stats

    lines = split_lines(args.data_dir, args.split)
    stats = {"split": args.split, **split_stats(lines)}
    if args.tokenizer:
        from pipelines.data.lm_stream import tokenize_lines

        tokenizer = load_tokenizer(args.tokenizer)
        stats["tokenizer"] = tokenizer.kind
        stats["tokenizer_tokens"] = int(tokenize_lines(tokenizer, lines).size)
    print(json.dumps(stats))


def build_parser():
    parser = argparse.ArgumentParser(prog="tfam", description="keras_tfam pipelines")
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="dataset utilities").add_subparsers(dest="data_command", required=True)
    stats = data.add_parser("stats", help="print a split's line and token counts as JSON")
    stats.add_argument("--data-dir", required=True, help="folder with wiki.{train,valid,test}.tokens, or a text file")
    stats.add_argument("--split", default="valid")
    stats.add_argument("--tokenizer", help="also count the tokens of a saved tokenizer (a folder)")
    stats.set_defaults(handler=_data_stats)

    from pipelines import commands as pipeline_commands

    pipeline_commands.add_commands(commands)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"tfam: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
