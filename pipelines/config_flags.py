"""The `tfam train` flags: one per config field and per model option, each with its help and default.

Every field of `pipelines.config.TrainConfig` is a flag (`--learning-rate 3e-4`), and so is every option a
preset's class declares (`GPT2LM.OPTIONS`); a flag left unset keeps the config's value.
"""

import argparse
import inspect
import json
from typing import Optional

from keras_tfam.models.presets import PRESETS
from pipelines.config import FIELD_CHOICES, FIELDS, MODEL_OPTIONS, NAMED_CONFIGS, json_kind

BOOLEANS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def parse_bool(text):
    """`True` or `False` from the usual spellings (true/false, yes/no, on/off, 1/0; any case)."""
    value = BOOLEANS.get(str(text).strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(
            f"must be a boolean: true/false, yes/no, on/off or 1/0 (any case). Received: {text!r}"
        )
    return value


class RenamedFlag(argparse.Action):
    """A flag's old name: stores its value where the new name does, with a one-line notice on stderr.

    Args:
        new_flag: the flag's name now (`--export-dir`).
    """

    def __init__(self, option_strings, dest, new_flag, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from pipelines.errors import notice

        notice(f"{option_string} is now {self.new_flag}; the old name still works")
        setattr(namespace, self.dest, values)


def parse_positive_integers(text):
    """A tuple of positive integers from comma-separated text (`1,2,4,8`)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be positive integers separated by commas. Received: {text!r}")
    return values


def parse_json_object(text):
    """A JSON object (a dict) from a flag's text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"must be a JSON object ({error}). Received: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object. Received: a JSON {json_kind(value)}, {text!r}")
    return value


# Whose default `tfam train` sets (`pipelines.training.build_model`): their help, in its terms.
_TRAINING_OPTIONS = {
    "max_sequence_length": "GPT2LM: rows of the learned position table, the longest input the model takes",
    "context_length": "the longest context generation attends over (past it, a window slides); Transformer-XL: "
    "the segment length, informative",
}
_METAVARS = {int: "N", float: "X", dict: "JSON", tuple: "N,N,...", "model": "PRESET", "profile_steps": "FIRST,LAST"}
_METAVARS.update(dict.fromkeys(("init_from", "data_dir", "out", "export_dir"), "DIR"))
_METAVARS.update(dict.fromkeys(("train_split", "eval_split"), "SPLIT"))


def _shown(value):
    """A default as `--help` shows it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _field_help(name, field):
    """A field's help with its default, and each named config's value where it differs."""
    others = "".join(
        f"; {config}: {_shown(values[name])}"
        for config, values in NAMED_CONFIGS.items()
        if name in values and values[name] != field.default
    )
    choices = f" (one of {', '.join(PRESETS)})" if name == "model" else ""
    return f"{field.metadata['help']}{choices} (default: {_shown(field.default)}{others})"


def _argument_docs(model_class):
    """`{argument: description}` of the `Args:` sections of `model_class`'s docstrings, its own over its bases'."""
    docs = {}
    for klass in reversed(model_class.__mro__):
        names, indent, inside = [], None, False
        for line in inspect.cleandoc(klass.__dict__.get("__doc__") or "").splitlines():
            width = len(line) - len(line.lstrip())
            if line.strip() == "Args:":
                inside = True
            elif not inside or not line.strip():
                continue
            elif width == 0:  # the next section
                break
            elif indent in (None, width):  # `name: text` or `a, b: text`
                indent = width
                head, _, text = line.strip().partition(":")
                names = [name.strip() for name in head.split(",")]
                docs.update(dict.fromkeys(names, text.strip()))
            else:  # a continuation line
                docs.update({name: f"{docs[name]} {line.strip()}" for name in names})
    return docs


def _option_help(name):
    """A model option's help: its class's docstring, and its value in the default preset (or its class's first)."""
    classes = [model_class for model_class, _ in PRESETS.values() if name in model_class.OPTIONS]
    owner = "" if set(classes) == {c for c, _ in PRESETS.values()} else f"{classes[0].__name__}: "
    if name in _TRAINING_OPTIONS:
        return f"{_TRAINING_OPTIONS[name]} (default: --sequence-length)"
    described = _argument_docs(classes[0]).get(name, name.replace("_", " ")).rstrip(".")
    preset = next(p for p in (FIELDS["model"].default, *PRESETS) if name in PRESETS[p][0].OPTIONS)
    model_class, arguments = PRESETS[preset]
    value = arguments.get(name, inspect.signature(model_class).parameters[name].default)
    return f"{owner}{described} (default: the preset's; {preset}: {_shown(value)})"


def _add_flag(group, name, kind, help, choices=None):
    """`--name` (unset: `None`, keeping the config's value); a boolean also as `--no-name`, and `--name yes|no`.
    Returns the flag of a boolean, else `None`."""
    flag = "--" + name.replace("_", "-")
    help = help.replace("%", "%%") if help is not None else argparse.SUPPRESS
    if kind is bool:
        group.add_argument(
            flag, dest=name, nargs="?", const=True, type=parse_bool, default=None, metavar="yes|no", help=help
        )
        group.add_argument(
            "--no-" + flag[2:], dest=name, action="store_const", const=False, default=None, help=f"same as {flag} no"
        )
        return flag
    metavar = "{" + ",".join(choices) + "}" if choices and len(choices) < 9 else None
    metavar = metavar or _METAVARS.get(name) or _METAVARS.get(kind)
    parser_type = {bool: parse_bool, dict: parse_json_object, tuple: parse_positive_integers}.get(kind, kind)
    group.add_argument(flag, dest=name, type=parser_type, default=None, choices=choices, metavar=metavar, help=help)
    return None


def add_config_arguments(parser):
    """One `--flag` per config field and per model option, each with its help and default (unset: `None`); the
    boolean flags go to `parser.boolean_flags` (see `join_boolean_values`)."""
    fields = parser.add_argument_group(
        "training configuration",
        "A run starts from the values of --config: gpt2_tiny (the default; its values are shown), gpt2_small "
        "(shown where they differ) or a JSON file of these fields; each flag overrides one. A step is one "
        "optimizer update. Booleans: --flag or --no-flag (--flag yes|no works too).",
    )
    flags = set()
    for name, field in FIELDS.items():
        kind = {Optional[int]: int, Optional[float]: float, Optional[str]: str}.get(field.type, field.type)
        help = _field_help(name, field) if field.metadata["help"] is not None else None
        flags.add(_add_flag(fields, name, kind, help, tuple(PRESETS) if name == "model" else FIELD_CHOICES.get(name)))
    # The closed sets are read now, from their registries: a kind registered before the parser is built is
    # a choice.
    options = parser.add_argument_group(
        "model options",
        "The architecture on top of the preset that --model names (--config names a training configuration, "
        "not a model). Unset, an option keeps the preset's value (with --init-from, the checkpoint's).",
    )
    for name, option in MODEL_OPTIONS.items():
        flags.add(_add_flag(options, name, option.kind, _option_help(name), option.values()))
    parser.boolean_flags = frozenset(flags - {None})


def join_boolean_values(argv, boolean_flags):
    """`argv` with each token after one of `boolean_flags` that starts with one dash (`-1e+16`, `-x`; not `-h`)
    joined to it as `--flag=TOKEN`: argparse reads such a token as an option, so the flag would take no value and
    the token be left over, unrecognized; joined, the flag's check refuses it naming the flag."""
    joined = []
    for token in argv:
        follows_flag = bool(joined) and joined[-1] in boolean_flags
        if follows_flag and token.startswith("-") and not token.startswith("--") and token != "-h":
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    return joined


def overrides_from_args(args):
    names = list(FIELDS) + list(MODEL_OPTIONS)
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
