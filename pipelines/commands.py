"""The `tfam` training, evaluation, generation and export commands (see pipelines.cli)."""

import contextlib
import json
import math
import os

from pipelines.drafting import DRAFTING_FLAGS, add_drafting_arguments, drafting_options, options_named_as_flags
from pipelines.run_loading import load_run, run_directory


def _train(args):
    from pipelines.config import load_config
    from pipelines.config_flags import overrides_from_args
    from pipelines.errors import TrainingDiverged
    from pipelines.training import format_summary, train

    config = load_config(args.config, overrides_from_args(args))
    with _checkpoint_options_named(config):
        summary = train(config)
    print(format_summary(summary))
    if summary["stopped_on_nan"]:
        raise TrainingDiverged(
            f"training stopped at step {summary['steps']} of {config.max_steps}: the loss became NaN. "
            f"The backups before it are kept in {os.path.join(config.out, 'backup')}, and no final checkpoint "
            "or export was written; a lower --learning-rate (in a new --out) usually helps."
        )


@contextlib.contextmanager
def _checkpoint_options_named(config):
    """Re-raises a `ValueError` that blames a model option of an `--init-from` checkpoint the user did not give
    (its config.json's, which the user's options no longer fit) with the flags the user gave."""
    given = config.model_options if config.init_from is not None else {}
    try:
        yield
    except ValueError as error:
        from pipelines.config import MODEL_OPTIONS

        message = str(error)
        blamed = [name for name in MODEL_OPTIONS if f"`{name}`" in message and name not in given]
        if not given or not blamed:
            raise
        flags = " ".join(
            f"--{name.replace('_', '-')} {value if isinstance(value, str) else json.dumps(value)}"
            for name, value in given.items()
        )
        raise ValueError(
            f"`{flags}` does not fit the checkpoint of `--init-from` {config.init_from}, whose config.json sets "
            f"{', '.join(f'`{name}`' for name in blamed)}: {message}"
        ) from error


def check_eval_args(args):
    """Raises a `ValueError` naming the first `tfam eval` number out of range, before any work."""
    for name in ("sequence_length", "batch_size", "knn_k"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"`--{name.replace('_', '-')}` must be positive. Received: {name}={value}")
    if args.knn_split is None:
        return
    # At 1 the LM's part is gone: a token no neighbour holds has probability 0 (infinite perplexity).
    if not 0.0 <= args.knn_interpolation < 1.0:
        raise ValueError(
            f"`--knn-interpolation` must be in [0, 1). Received: knn_interpolation={args.knn_interpolation}"
        )
    if not 0.0 < args.knn_temperature < math.inf:
        raise ValueError(
            f"`--knn-temperature` must be positive and finite. Received: knn_temperature={args.knn_temperature}"
        )


def run_sequence_length(run_dir, model):
    """The windows a run was trained on: its `config.json`'s `sequence_length`, else the model's context.

    A `.keras` file outside a run, or a damaged config, gives
    `model.max_length`, and a model without a context limit 128.
    """
    run_dir = run_directory(run_dir)
    path = os.path.join(run_dir, "config.json") if run_dir is not None else None
    if path is not None and os.path.isfile(path):
        try:
            with open(path) as f:
                length = json.load(f).get("sequence_length")
        except (OSError, ValueError, AttributeError):
            length = None
        if isinstance(length, int) and not isinstance(length, bool) and length >= 1:
            return length if model.max_length is None else min(length, model.max_length)
    return model.max_length or 128


def _eval(args):
    from pipelines.data.lm_stream import lm_dataset, stateful_lm_dataset, tokenize_lines
    from pipelines.data.wikitext import is_named_split, split_lines
    from pipelines.errors import Failure
    from pipelines.evaluation import Progress, evaluate_perplexity, show_progress, text_units
    from pipelines.training import check_sequence_length

    check_eval_args(args)
    if args.data_dir is None and is_named_split(args.split):
        raise ValueError(
            f"--split {args.split} is a WikiText split: pass --data-dir (the folder holding it), or give a text "
            "file as --split"
        )
    if args.data_dir is None and args.knn_split is not None and is_named_split(args.knn_split):
        raise ValueError(f"--knn-split {args.knn_split} is a WikiText split: pass --data-dir (the folder holding it)")
    lines = split_lines(args.data_dir, args.split)
    model, tokenizer = load_run(args.run, args.checkpoint, needs_tokenizer=True)
    if args.sequence_length is None:
        args.sequence_length = run_sequence_length(args.run, model)
    check_sequence_length(model, args.sequence_length)
    tokens = tokenize_lines(tokenizer, lines)
    stream = stateful_lm_dataset if getattr(model, "stateful_stream", False) else lm_dataset  # XL: with memory
    dataset = stream(tokens, args.sequence_length, args.batch_size, tokenizer.eos_id)
    knn = {}
    if args.knn_split is not None:
        if getattr(model, "stateful_stream", False):
            raise ValueError(f"--knn-split needs a model without a stateful memory. Received: run={args.run!r}")
        model, knn = _knn_lm(model, tokenizer, args)
    progress = Progress(int(tokens.size)) if show_progress(args.quiet) else None
    result = evaluate_perplexity(model, dataset, progress=progress, **text_units(tokenizer.kind, lines))
    if not math.isfinite(result["loss"]):
        raise Failure(
            f"the loss on {args.split} is {result['loss']} ({result['tokens']} tokens): the run's weights or the "
            "kNN settings give no finite log-probability"
        )
    print(json.dumps({"split": args.split, "sequence_length": args.sequence_length, **result, **knn}))


def _knn_lm(model, tokenizer, args):
    """`(KNNLM, its settings)`: `model` with a datastore of `--knn-split`'s blocks (Khandelwal et al. 2020)."""
    from keras_tfam.models import KNNLM
    from keras_tfam.retrieval import Datastore
    from pipelines.data.lm_stream import make_blocks, tokenize_lines
    from pipelines.data.wikitext import split_lines

    tokens = tokenize_lines(tokenizer, split_lines(args.data_dir, args.knn_split))
    inputs, targets, weights = make_blocks(tokens, args.sequence_length, tokenizer.eos_id)
    datastore = Datastore.from_model(
        model, inputs, targets, weights, args.batch_size, k=args.knn_k, temperature=args.knn_temperature
    )
    settings = {
        "knn_split": args.knn_split,
        "knn_entries": datastore.size,
        "knn_k": datastore.k,
        "knn_interpolation": args.knn_interpolation,
        "knn_temperature": args.knn_temperature,
    }
    return KNNLM(model, datastore, interpolation=args.knn_interpolation), settings


# `generate`'s steering options that `tfam generate` takes as flags (`--repetition-penalty`, ...): name, type, help.
_STEERING_FLAGS = (
    (
        "repetition_penalty",
        float,
        "divide the positive logits (multiply the negative ones) of the ids in the prompt or generated so far by "
        "it (> 0; 1 is off)",
    ),
    ("no_repeat_ngram_size", int, "never repeat an n-gram of this many tokens (prompt included)"),
    ("min_new_tokens", int, "do not stop at the end token before this many new tokens"),
    ("presence_penalty", float, "subtracted from the logit of every id generated so far (OpenAI's)"),
    ("frequency_penalty", float, "times its count, subtracted from the logit of every id generated so far (OpenAI's)"),
    (
        "min_p",
        float,
        "with the top_k, top_p or random sampler: drop the tokens less likely than min_p times the most likely one "
        "(in [0, 1])",
    ),
)
DEFAULT_TOP_K, DEFAULT_TOP_P = 50, 0.9
# The options that errors of `generate` and the samplers name (`` `min_p` ``), and their flags (`` `--min-p` ``).
_OPTION_FLAGS = {
    **{name: f"--{name.replace('_', '-')}" for name, _, _ in _STEERING_FLAGS},
    **{
        name: f"--{name.replace('_', '-')}"
        for name in ("max_new_tokens", "temperature", "seed", "window", "chunk_size")
    },
    **DRAFTING_FLAGS,
    "k": "--top-k",  # TopKSampler(k)
    "p": "--top-p",  # TopPSampler(p)
}


def _utf8_problem(text):
    """None if `text` is UTF-8 text, else the bytes it came as (a command line decodes others as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace")
    return None


def check_generate_args(args):
    """Raises a `ValueError` naming the first `tfam generate` value out of range, before any work.

    `--top-p` is in (0, 1] whatever the sampler, as in the exported
    `generate` signature.
    """
    if not math.isfinite(args.temperature):
        raise ValueError(
            f"`--temperature` must be a finite number (<= 0 for greedy). Received: temperature={args.temperature}"
        )
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise ValueError(f"`--top-p` must be in (0, 1] (1 keeps every token). Received: top_p={args.top_p}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"`--top-k` must be a positive integer. Received: top_k={args.top_k}")
    for flag, value, sampler in (("top-k", args.top_k, "top_k"), ("top-p", args.top_p, "top_p")):
        if value is not None and args.sampler != sampler:
            raise ValueError(
                f"`--{flag}` sets the {sampler} sampler: pass --sampler {sampler} with it. "
                f"Received: {flag.replace('-', '_')}={value}, sampler={args.sampler}"
            )
    for name, texts in (("prompt", args.prompt), ("stop", args.stop)):
        for text in texts or ():
            raw = _utf8_problem(text)
            if raw is not None:
                raise ValueError(f"`--{name}` must be UTF-8 text. Received: {name}={raw!r}")
    if "" in (args.stop or ()):
        raise ValueError("`--stop` must be a non-empty string. Received: stop=''")


def _generate(args):
    import numpy as np
    import tensorflow as tf

    from keras_tfam.utils import check_positive_int

    check_generate_args(args)
    stops = tuple(args.stop or ())
    model, tokenizer = load_run(args.run, args.checkpoint, needs_tokenizer=True)
    drafting = drafting_options(args, tokenizer)
    with options_named_as_flags(_OPTION_FLAGS):
        check_positive_int("chunk_size", args.chunk_size)
        options = dict(_generate_options(args, tokenizer), **drafting)
        for prompt in args.prompt or [""]:
            ids = [tokenizer.eos_id] + list(np.asarray(tokenizer.tokenize_prompt(tf.constant([prompt])).flat_values))
            head = f"{prompt}{' ' if prompt and tokenizer.kind == 'word' else ''}"
            if args.stream:
                _print_streamed(model, tokenizer, ids, head, stops, args, options)
            else:
                out = model.generate([ids], args.max_new_tokens, **options)
                text, _ = _completion_text(tokenizer, out[0, len(ids) :], options["stop_token_ids"])
                print(head + _settled_text(text, stops, final=True)[0])


def _generate_options(args, tokenizer):
    """The keyword arguments of `model.generate` and `model.stream` that the flags of `tfam generate` give."""
    from keras_tfam.generation import TopKSampler, TopPSampler, get_sampler

    if args.temperature <= 0 or args.sampler == "greedy":  # <= 0 as the exported `generate` signature: greedy
        sampler = get_sampler("greedy")
    elif args.sampler == "top_k":
        sampler = TopKSampler(DEFAULT_TOP_K if args.top_k is None else args.top_k, args.temperature)
    elif args.sampler == "top_p":
        sampler = TopPSampler(DEFAULT_TOP_P if args.top_p is None else args.top_p, args.temperature)
    else:
        sampler = get_sampler(args.sampler, temperature=args.temperature)
    options = {name: getattr(args, name) for name, _, _ in _STEERING_FLAGS}
    stop_token_ids = [] if args.no_stop_at_eos else [tokenizer.eos_id]
    return dict(options, sampler=sampler, seed=args.seed, window=args.window, overflow=args.overflow,
                stop_token_ids=stop_token_ids)  # fmt: skip


def _completion_text(tokenizer, new_ids, stop_token_ids):
    """`(text, ended)`: the text of a prompt's new ids before the first stop token, and whether there is one."""
    import numpy as np

    new_ids = np.asarray(new_ids, np.int32)
    ends = np.flatnonzero(np.isin(new_ids, stop_token_ids))
    if len(ends):
        new_ids = new_ids[: ends[0]]
    return tokenizer.detokenize(new_ids[None, :]).numpy()[0].decode("utf-8", "replace"), bool(len(ends))


def _settled_text(text, stops, final):
    """`(text, stopped)`: `text` cut before the first of the `stops` strings in it, and whether one is.

    Unless `final` (more tokens may follow), less the tail they could still
    change: an unfinished UTF-8 character, or the start of a stop string (so
    that what is printed never runs past one).
    """
    if not final:
        text = text.rstrip("\ufffd")
    cut = min((start for start in map(text.find, stops) if start >= 0), default=None)
    end = len(text) if cut is None else cut
    if not final:
        longest = max(map(len, stops), default=0)
        for start in range(max(len(text) - longest + 1, 0), end):
            if any(stop.startswith(text[start:]) for stop in stops):
                return text[:start], False
    return text[:end], cut is not None


def _print_streamed(model, tokenizer, ids, head, stops, args, options):
    """Prints `head`, then the completion of `ids` chunk by chunk as `model.stream` generates it, then a newline.

    The printed line is the one `tfam generate` prints without `--stream`.
    """
    new_ids, text, printed = [], "", 0
    for chunk in model.stream([ids], args.max_new_tokens, args.chunk_size, **options):
        new_ids.extend(chunk[0].tolist())
        text, ended = _completion_text(tokenizer, new_ids, options["stop_token_ids"])
        settled, stopped = _settled_text(text, stops, final=ended)
        print(head + settled[printed:], end="", flush=True)
        head, printed = "", len(settled)
        if ended or stopped:
            break
    print(head + _settled_text(text, stops, final=True)[0][printed:], flush=True)


def add_commands(commands):
    """Adds `train`, `eval`, `generate`, `export` to the `tfam` sub-command parser."""
    from keras_tfam.generation import SAMPLERS
    from keras_tfam.generation.requests import OVERFLOWS
    from pipelines.config_flags import add_config_arguments
    from pipelines.export_command import add_export_command

    train = commands.add_parser(
        "train", help="train a GPT-2-style LM (rerun the same command to resume; a larger --max-steps extends the run)"
    )
    train.add_argument("--config", default="gpt2_tiny", help="gpt2_tiny, gpt2_small or a JSON file")
    add_config_arguments(train)
    train.set_defaults(handler=_train)

    def run_arguments(parser):
        parser.add_argument(
            "run", help="run directory of `tfam train`, or a .keras file (in a run's checkpoints/: with its tokenizer)"
        )
        parser.add_argument("--checkpoint", default="best", help="best (default, falls back to final) or final")

    evaluate = commands.add_parser("eval", help="perplexity of a run's checkpoint on a split (JSON)")
    run_arguments(evaluate)
    evaluate.add_argument("--data-dir", help="folder of the WikiText splits (not needed when --split is a file)")
    evaluate.add_argument("--split", default="test", help="train, valid, test, or a text file or folder")
    evaluate.add_argument(
        "--sequence-length",
        type=int,
        default=None,
        help="tokens per window (default: the length the run was trained on)",
    )
    evaluate.add_argument("--batch-size", type=int, default=16)
    evaluate.add_argument("--quiet", action="store_true", help="no progress line on stderr (none off a terminal)")
    knn = evaluate.add_argument_group("kNN-LM", "evaluate the model with a datastore of another split (KNNLM)")
    knn.add_argument("--knn-split", help="the split (or text file) whose (context -> next token) pairs fill it")
    knn.add_argument("--knn-k", type=int, default=64, help="neighbours per token")
    knn.add_argument(
        "--knn-interpolation", type=float, default=0.25, help="lambda of lambda p_kNN + (1 - lambda) p_LM, in [0, 1)"
    )
    knn.add_argument("--knn-temperature", type=float, default=1.0, help="the distances are divided by it")
    evaluate.set_defaults(handler=_eval)

    generate = commands.add_parser("generate", help="text from a prompt")
    run_arguments(generate)
    generate.add_argument("--prompt", action="append", help="repeat for several prompts")
    generate.add_argument("--max-new-tokens", type=int, default=40, help="new tokens per prompt, at most")
    generate.add_argument("--sampler", default="top_p", choices=tuple(SAMPLERS), help="how each token is chosen")
    generate.add_argument("--temperature", type=float, default=1.0, help="<= 0: greedy (as the exported signature)")
    generate.add_argument(
        "--top-k", type=int, help=f"with --sampler top_k: the tokens kept, >= 1 (default {DEFAULT_TOP_K})"
    )
    generate.add_argument(
        "--top-p", type=float, help=f"with --sampler top_p: the mass kept, in (0, 1] (default {DEFAULT_TOP_P})"
    )
    generate.add_argument("--seed", type=int, default=0, help="of the sampler: the same seed, the same text")
    generate.add_argument(
        "--window",
        type=int,
        default=None,
        help="attend to at most this many recent tokens (default: the context the model was trained on)",
    )
    generate.add_argument(
        "--overflow",
        default="slide",
        choices=OVERFLOWS,
        help="past the model's context: slide a window over the last tokens (default), or stop with an error",
    )
    generate.add_argument(
        "--stop",
        action="append",
        metavar="STRING",
        help="end the completion before this text (repeat for several: the first found in the text ends it)",
    )
    generate.add_argument(
        "--no-stop-at-eos",
        action="store_true",
        help="generate past the tokenizer's end-of-line token (by default a completion ends before it)",
    )
    generate.add_argument(
        "--stream", action="store_true", help="print the completion as it is generated, chunk by chunk"
    )
    generate.add_argument(
        "--chunk-size", type=int, default=8, metavar="N", help="with --stream: new tokens per chunk (default 8)"
    )
    steering = generate.add_argument_group("steering", "logits processors, as transformers' and OpenAI's options")
    for name, type_, help_ in _STEERING_FLAGS:
        metavar = "N" if type_ is int else "X"
        steering.add_argument(f"--{name.replace('_', '-')}", type=type_, default=None, metavar=metavar, help=help_)
    add_drafting_arguments(generate)
    generate.set_defaults(handler=_generate)

    add_export_command(commands, run_arguments)
