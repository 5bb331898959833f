"""The `tfam` command line: data statistics, training, evaluation, generation, export.

    tfam data stats --data-dir DIR --split valid
    tfam train --config gpt2_tiny --data-dir DIR --train-split valid --eval-split test --max-steps 20 --out RUN
    tfam eval RUN --data-dir DIR --split test
    tfam generate RUN --prompt "The meaning of life" --max-new-tokens 40 --sampler top_p
    tfam export RUN --export-dir saved_models/gpt2_tiny/1

Quiet by default: TensorFlow's C++ log lines are off and an error is one
`tfam: error: ...` line; `--verbose` (anywhere on the line) shows both the
logs and the traceback. Exit codes: 0 success, 2 usage errors (a bad option
or value, a missing input, an existing export, a run directory in use),
1 failures (NaN loss, unrecoverable damaged files, any other error).
"""

import argparse
import json
import os
import re
import sys


def _import_tensorflow(verbose):
    """Imports TensorFlow, keeping its C++ start-up log lines off stderr unless `verbose`.

    TensorFlow 2.18+ logs through absl before `TF_CPP_MIN_LOG_LEVEL` takes
    effect ("All log messages before absl::InitializeLog() ..."), so the
    variable alone does not silence the import: stderr's file descriptor is
    pointed at /dev/null while the libraries load.
    """
    if verbose:
        import tensorflow  # noqa: F401

        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


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


class _Parser(argparse.ArgumentParser):
    """A usage error is one `tfam: error: ...` line (exit code 2), like every other error of the command line.

    Sub-command parsers are of this class too (`add_subparsers` makes them of their parent's class).
    """

    def error(self, message):
        self.exit(2, f"tfam: error: {' '.join(message.split())} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        boolean_flags = getattr(self, "boolean_flags", ())  # set by `add_config_arguments`
        if boolean_flags:
            from pipelines.config_flags import join_boolean_values

            args = join_boolean_values(sys.argv[1:] if args is None else list(args), boolean_flags)
        return super().parse_known_args(args, namespace)


class _DefaultsShown(argparse.HelpFormatter):
    """Each flag's help ends with its default, unless it has none or its help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        none = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if none or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _add_verbose(parser, top_level=False):
    # On the sub-commands too, so that `tfam train ... --verbose` works; there
    # the default must not overwrite a `tfam --verbose train ...`.
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=False if top_level else argparse.SUPPRESS,
        help="show TensorFlow's log lines, and the traceback of an error",
    )


def build_parser():
    parser = _Parser(prog="tfam", description="keras_tfam pipelines")
    _add_verbose(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="dataset utilities").add_subparsers(dest="data_command", required=True)
    stats = data.add_parser("stats", help="print a split's line and token counts as JSON")
    stats.add_argument("--data-dir", required=True, help="folder with wiki.{train,valid,test}.tokens, or a text file")
    stats.add_argument("--split", default="valid")
    stats.add_argument("--tokenizer", help="also count the tokens of a saved tokenizer (a folder)")
    stats.set_defaults(handler=_data_stats)
    _add_verbose(stats)

    from pipelines import commands as pipeline_commands

    pipeline_commands.add_commands(commands)
    for name in ("train", "eval", "generate", "export"):
        _add_verbose(commands.choices[name])
        commands.choices[name].formatter_class = _DefaultsShown
    # Its flags are listed under the usage with their help, in groups: a usage line naming each would be 30 lines.
    commands.choices["train"].usage = "%(prog)s [--config CONFIG] [--FLAG VALUE ...] [--MODEL-OPTION VALUE ...]"
    return parser


def main(argv=None):
    from pipelines.errors import RunInUse

    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "--verbose" in argv
    backend = os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if backend != "tensorflow":
        print(f"tfam: error: tfam runs on TensorFlow. Received: KERAS_BACKEND={backend!r}", file=sys.stderr)
        return 2
    _import_tensorflow(verbose)
    from keras_tfam import cpu

    cpu.configure()  # before the first tensor: pooled CPU tensor memory
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except (ValueError, FileNotFoundError, FileExistsError, RunInUse) as error:
        return _fail(error, 2, verbose)
    except KeyboardInterrupt:
        print("tfam: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - one clear line instead of a traceback
        return _fail(error, 1, verbose)
    return 0


def _fail(error, code, verbose):
    from pipelines.errors import Failure, RunInUse

    if verbose:
        import traceback

        traceback.print_exception(error)
    message = str(error) or type(error).__name__
    if not isinstance(error, (Failure, RunInUse, ValueError, FileNotFoundError, FileExistsError)):
        # An unexpected error: its type says more than its message alone.
        message = f"{type(error).__name__}: {message}"
    # One line, whatever the message held (TensorFlow's hold graph traces, Keras' colour codes).
    message = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", message).split())
    if len(message) > 600:
        message = message[:600] + " ..."
    hint = "" if verbose or isinstance(error, Failure) or code == 2 else " (rerun with --verbose for the traceback)"
    print(f"tfam: error: {message}{hint}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
