"""`tfam train --help`: every flag says what it sets and its default; booleans take --flag/--no-flag and yes/no."""

import contextlib
import io
import re

import pytest

from pipelines.cli import build_parser, main
from pipelines.config import FIELDS, MODEL_OPTIONS, NAMED_CONFIGS, TrainConfig

# Flags of the `train` parser that the config does not declare (`pipelines.commands`, `pipelines.cli`).
OTHERS = ("-h", "--config", "--verbose")


def _help(argv):
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout), pytest.raises(SystemExit) as exit_:
        patch.setenv("COLUMNS", "1000")  # argparse's width: no entry wrapped (it breaks lines at hyphens)
        main(argv)
    assert exit_.value.code == 0
    return stdout.getvalue()


def _entries(text):
    """`{flag: its help on one line}` of an argparse help text (an entry continues on deeper-indented lines)."""
    entries, flag = {}, None
    for line in text.splitlines():
        match = re.match(r"  (-\S+)", line)
        if match:
            flag = match.group(1).split(",")[0]
            invocation = re.match(r"  (\S+(?: \S+)?(?:, \S+(?: \S+)?)*)(?:  +|$)", line)
            entries[flag] = line[invocation.end() :].strip()
        elif flag is not None and line.startswith("    "):
            entries[flag] = f"{entries[flag]} {line.strip()}".strip()
        else:
            flag = None
    return entries


def _shown(value):
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):  # as the flag takes it
        return ",".join(str(item) for item in value)
    return "unset" if value is None else value


@pytest.fixture(scope="module")
def train_help():
    return _entries(_help(["train", "--help"]))


def test_every_config_flag_has_a_help_line_with_the_dataclass_default(train_help):
    train_help, defaults = dict(train_help), TrainConfig()
    for name in FIELDS:
        flag = "--" + name.replace("_", "-")
        if name == "cpu_devices":
            continue
        text = train_help.pop(flag)
        others = "".join(
            f"; {config}: {_shown(values[name])}"
            for config, values in NAMED_CONFIGS.items()
            if name in values and values[name] != getattr(defaults, name)
        )
        assert text.endswith(f"(default: {_shown(getattr(defaults, name))}{others})"), (flag, text)
        assert not text.startswith("(default:"), (flag, text)  # a description before the default
    for name, option in MODEL_OPTIONS.items():
        text = train_help.pop("--" + name.replace("_", "-"))
        assert re.search(r" \(default: [^()]+\)$", text) and not text.startswith("(default"), (name, text)
    booleans = [name for name, field in FIELDS.items() if field.type is bool]
    booleans += [name for name, option in MODEL_OPTIONS.items() if option.kind is bool]
    for name in booleans:
        flag = name.replace("_", "-")
        assert train_help.pop(f"--no-{flag}") == f"same as --{flag} no"
    assert sorted(train_help) == sorted(OTHERS), "flags of no config field: " + ", ".join(sorted(train_help))


def test_model_options_show_the_preset_values_a_run_gets(train_help):
    # The values of keras_tfam/models/gpt2_presets.py and transformer_xl_presets.py, and DecoderLM's defaults.
    assert train_help["--num-layers"].endswith("(default: the preset's; gpt2_tiny: 4)")
    assert train_help["--dropout"].endswith("(default: the preset's; gpt2_tiny: 0.1)")
    assert train_help["--position"].endswith("(default: the preset's; gpt2_tiny: learned)")
    assert train_help["--use-bias"].endswith("(default: the preset's; gpt2_tiny: on)")
    assert train_help["--memory-length"].startswith("TransformerXLLM: ")
    assert train_help["--memory-length"].endswith("(default: the preset's; transformer_xl_tiny: 128)")
    # What `tfam train` sets (pipelines.training.build_model), not the library's constructor default.
    for flag in ("--max-sequence-length", "--context-length"):
        assert train_help[flag].endswith("(default: --sequence-length)"), train_help[flag]


def test_the_test_option_cpu_devices_is_hidden_but_accepted():
    text = _help(["train", "--help"])
    assert "--cpu-devices" not in text
    assert build_parser().parse_args(["train", "--cpu-devices", "2"]).cpu_devices == 2


@pytest.mark.parametrize(
    "argv, export",
    [
        ([], None),  # unset: the config's value
        (["--export"], True),
        (["--no-export"], False),
        (["--export", "off"], False),  # the spelling of scripts and tests before --no-export
        (["--export", "yes"], True),
        (["--no-export", "--export"], True),  # the last one given
    ],
)
def test_a_boolean_is_a_flag_with_a_negative_and_takes_the_old_yes_no_spellings(argv, export):
    assert build_parser().parse_args(["train", *argv]).export is export


def test_a_bare_boolean_flag_leaves_the_next_flag_alone():
    args = build_parser().parse_args(["train", "--use-bias", "--max-steps", "3", "--no-tie-embeddings"])
    assert (args.use_bias, args.max_steps, args.tie_embeddings) == (True, 3, False)


def test_a_negative_boolean_takes_no_value():
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit_:
        main(["train", "--no-export", "yes"])
    assert exit_.value.code == 2
    assert stderr.getvalue().startswith("tfam: error: unrecognized arguments: yes"), stderr.getvalue()


def test_the_flags_reach_the_config_as_given():
    from pipelines.config import load_config
    from pipelines.config_flags import overrides_from_args

    args = build_parser().parse_args(["train", "--no-export", "--log-every", "5", "--no-use-bias"])
    config = load_config(args.config, overrides_from_args(args))
    assert (config.export, config.log_every, config.model_options) == (False, 5, {"use_bias": False})
    assert load_config().log_every == 10
