"""Training configurations: named presets, JSON files, command-line overrides.

Every field can be set from the command line (`--learning-rate 3e-4`,
`pipelines.config_flags`); a
config file is JSON holding a subset of the fields. The model is a preset of
`keras_tfam.models.presets` (`--model`), and every option its class declares
(`GPT2LM.OPTIONS`: `--position`, `--attention`, `--intermediate-dim`, ...) is
a flag too, stored in `model_options` and checked by the declaration the
model's constructor reads: the pipeline does not re-list them or their bounds.
Unknown keys and invalid values are errors raised before any work starts.
"""

import dataclasses
import json
import math
import os
from typing import Optional

import numpy as np

from keras_tfam.models.local_layers import local_layer_indices
from keras_tfam.models.presets import check_model_option, get_preset, model_options
from keras_tfam.utils import is_integer
from pipelines.data.tokenizers import TOKENIZERS as TOKENIZER_CLASSES
from pipelines.data.wikitext import WIKITEXT_VARIANTS
from pipelines.served_decoding import DEFAULT_BATCH_SIZES

TOKENIZERS = tuple(TOKENIZER_CLASSES)
# The smallest vocabulary each tokenizer can have: word and char need their
# end-of-line and unknown tokens, byte-level BPE its 256 bytes and <|endoftext|>.
MIN_VOCABULARY_SIZE = {"word": 2, "char": 2, "bpe": 257}
PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
STRATEGIES = ("auto", "default", "mirrored", "multi_worker")
JIT = ("auto", "on", "off")
# The closed sets of the config's string fields (`model`: the presets; a model option's: its `Option`'s).
FIELD_CHOICES = dict(
    tokenizer=TOKENIZERS, dataset=WIKITEXT_VARIANTS, precision=PRECISIONS, jit=JIT, strategy=STRATEGIES
)


def _field(default, help):
    """A config field with its default and the help of its `--flag` (declared once, next to the field)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class TrainConfig:
    # Model: a preset, and options of its class on top (`OPTIONS` of the class: the model option flags).
    model: str = _field("gpt2_tiny", "the model preset: an architecture and its size")
    model_options: dict = dataclasses.field(default_factory=dict)
    init_from: Optional[str] = _field(None, "a Hugging Face checkpoint folder to fine-tune (model and tokenizer)")
    lora_rank: Optional[int] = _field(None, "train LoRA factors of this rank only (attention query, value)")
    # Data.
    data_dir: Optional[str] = _field(None, "folder of wiki.{train,valid,test}.tokens; unset: downloaded (TFDS)")
    dataset: str = _field("wikitext-2-v1", "the WikiText the TFDS builder downloads without --data-dir")
    tokenizer: str = _field("word", "trained on the train split; huggingface: the --init-from checkpoint's")
    vocabulary_size: Optional[int] = _field(None, "unset: every word or character of the train split; bpe 8192")
    sequence_length: int = _field(
        128,
        "tokens per training example (nanoGPT's block_size): the windows the model trains and is evaluated on, "
        "and the default of the model options --max-sequence-length and --context-length",
    )
    train_split: str = _field("train", "train, valid or test (of --data-dir), or a text file or folder")
    eval_split: str = _field("valid", "the validations' split: train, valid, test, or a text file or folder")
    # Optimisation: AdamW, linear warmup then cosine decay, global-norm clipping.
    batch_size: int = _field(16, "sequences per batch on each replica: the global batch is this times the replicas")
    learning_rate: float = _field(1e-3, "the peak learning rate, after a linear warmup and before a cosine decay")
    min_learning_rate_ratio: float = _field(0.1, "the learning rate at --max-steps, as a fraction of the peak")
    warmup_steps: int = _field(100, "steps of the linear warmup from 0")
    weight_decay: float = _field(0.1, "AdamW's decoupled weight decay, of matrices only (no biases, norms)")
    beta_1: float = _field(0.9, "AdamW's beta_1: the decay of the gradients' moving average")
    beta_2: float = _field(0.95, "AdamW's beta_2: the decay of the squared gradients' moving average")
    clip_norm: float = _field(1.0, "the global norm the gradient (summed over replicas) is clipped to")
    gradient_accumulation_steps: int = _field(1, "batches per optimizer step (their gradients averaged)")
    # Steps: optimizer updates.
    max_steps: int = _field(600, "optimizer steps of the run; a larger value extends a finished run")
    eval_every: int = _field(200, "a validation (loss, perplexities, samples) after every this many steps")
    backup_every: int = _field(50, "a backup (what a rerun resumes from) and epoch_loss after every this many steps")
    # None (in an older config file): every `backup_every`.
    log_every: Optional[int] = _field(10, "the training loss, learning rate and tokens/s after every this many steps")
    # Runtime.
    precision: str = _field("auto", "the dtype policy; auto: float32 or bfloat16, chosen for the machine")
    jit: str = _field("auto", "XLA-compile the training step; auto: chosen for the machine")
    strategy: str = _field("auto", "auto: multi_worker with TF_CONFIG, mirrored over several GPUs, else default")
    cpu_devices: Optional[int] = _field(None, None)  # logical CPU devices, for the distribution tests: no help
    seed: int = _field(0, "the seed of the weights, the data order, dropout and the samples")
    out: str = _field("runs/gpt2_tiny", "the run directory (backups, checkpoints, logs, export); rerun to resume")
    export: bool = _field(True, "write the SavedModel at the end (else `tfam export RUN` writes it later)")
    export_dir: Optional[str] = _field(None, "the folder of the SavedModel's versions; unset: RUN/export")
    export_batch_sizes: tuple = _field(
        DEFAULT_BATCH_SIZES,
        "the batch sizes the export's decoding loop is compiled for: TF Serving's allowed_batch_sizes",
    )
    samples: int = _field(2, "text samples generated at each validation (TensorBoard)")
    sample_tokens: int = _field(32, "tokens of each sample")
    profile_steps: Optional[str] = _field(None, "'first,last': profile these steps (TensorBoard's Profile tab)")

    def validate(self):
        """Raises a `ValueError` naming the first invalid field and its value."""
        self._check_types()
        if not isinstance(self.model_options, dict):
            raise ValueError(f"Invalid config: `model_options` must be a mapping. Received: {self.model_options!r}")
        model_class, preset_arguments = get_preset(self.model)
        self.model_options = {
            name: check_model_option(model_class, name, value) for name, value in self.model_options.items()
        }
        settings = {**preset_arguments, **self.model_options}
        if "local_layers" in self.model_options and settings.get("local_window") is None:
            raise ValueError(
                "Invalid config: `local_layers` says which layers are local, and there are none without "
                f"`local_window`: set it too. Received: local_layers={self.model_options['local_layers']!r}, "
                "local_window=None"
            )
        if "local_layers" in self.model_options:  # the layer indices of a list, against the number of layers
            local_layer_indices(settings["local_window"], settings["local_layers"], settings["num_layers"])
        self._check_init_from()
        checks = [(name, getattr(self, name) in values, f"one of {values}") for name, values in FIELD_CHOICES.items()]
        for name in (
            "sequence_length",
            "batch_size",
            "max_steps",
            "eval_every",
            "backup_every",
            "gradient_accumulation_steps",
        ):
            value = getattr(self, name)
            checks.append((name, isinstance(value, int) and value >= 1, "a positive integer"))
        for name in ("learning_rate", "clip_norm"):
            checks.append((name, getattr(self, name) > 0, "positive"))
        for name in ("warmup_steps", "samples", "sample_tokens"):
            checks.append((name, getattr(self, name) >= 0, "non-negative"))
        checks.append(("min_learning_rate_ratio", 0 <= self.min_learning_rate_ratio <= 1, "in [0, 1]"))
        checks.append(("weight_decay", self.weight_decay >= 0, "non-negative"))
        for name in ("beta_1", "beta_2"):
            checks.append((name, 0 <= getattr(self, name) < 1, "in [0, 1)"))
        minimum = MIN_VOCABULARY_SIZE.get(self.tokenizer, 2)
        checks.append(
            (
                "vocabulary_size",
                self.vocabulary_size is None or self.vocabulary_size >= minimum,
                f"unset or at least {minimum} for the {self.tokenizer} tokenizer",
            )
        )
        checks.append(("lora_rank", self.lora_rank is None or self.lora_rank >= 1, "unset or a positive integer"))
        checks.append(("log_every", self.log_every is None or self.log_every >= 1, "unset or a positive integer"))
        checks.append(("cpu_devices", self.cpu_devices is None or self.cpu_devices >= 1, "unset or a positive integer"))
        checks.append(("seed", self.seed >= 0, "a non-negative integer"))
        checks.append(("out", bool(self.out.strip()), "a directory path"))
        # An export folder for a run that exports nothing would be dropped without a word.
        checks.append(("export_dir", self.export or self.export_dir is None, "unset with `export` off"))
        checks.append(
            (
                "profile_steps",
                self.profile_steps is None or _is_step_range(self.profile_steps),
                "two step numbers 'first,last' with 1 <= first <= last",
            )
        )
        for name, ok, expected in checks:
            if not ok:
                value = getattr(self, name)
                raise ValueError(f"Invalid config: `{name}` must be {expected}. Received: {name}={value!r}")
        for name in ("train_split", "eval_split"):
            split = getattr(self, name)
            if split not in ("train", "valid", "test", "validation") and not os.path.exists(split):
                raise ValueError(
                    f"Invalid config: `{name}` must be train, valid, test or the path of a text file or folder. "
                    f"Received: {name}={split!r}"
                )
        if self.data_dir is not None and not os.path.exists(self.data_dir):
            raise FileNotFoundError(f"Invalid config: data_dir {self.data_dir!r} does not exist")
        return self

    def _check_init_from(self):
        """`init_from` names a checkpoint directory; its tokenizer is the run's (`tokenizer` "huggingface")."""
        if self.init_from is None:
            if self.tokenizer == "huggingface":
                raise ValueError(
                    "Invalid config: the `huggingface` tokenizer is an imported checkpoint's: set `init_from` "
                    "to its directory. Received: tokenizer='huggingface', init_from=None"
                )
            return
        if not os.path.isfile(os.path.join(self.init_from, "config.json")):
            raise ValueError(
                "Invalid config: `init_from` must be a Hugging Face checkpoint directory (config.json and "
                f"safetensors weights). Received: init_from={self.init_from!r}"
            )
        if self.tokenizer not in ("word", "huggingface"):  # "word" is the default: unset
            raise ValueError(
                "Invalid config: a run with `init_from` uses the checkpoint's own tokenizer. Received: "
                f"tokenizer={self.tokenizer!r}"
            )
        if self.vocabulary_size is not None:
            raise ValueError(
                "Invalid config: a run with `init_from` has the checkpoint's vocabulary. Received: "
                f"vocabulary_size={self.vocabulary_size}"
            )
        self.tokenizer = "huggingface"
        self.init_from = os.path.abspath(self.init_from)

    def _check_types(self):
        # JSON config files can hold anything: a string learning rate, a float
        # batch size, a NaN. Caught here, before any comparison trips on them.
        for name, field in FIELDS.items():
            value = getattr(self, name)
            if value is None and field.type in (Optional[int], Optional[float], Optional[str]):
                continue
            if field.type in (int, Optional[int]):
                ok, expected = is_integer(value), "an integer"
                if ok:
                    setattr(self, name, int(value))  # a NumPy integer too, stored as a Python int
            elif field.type is bool:
                ok, expected = isinstance(value, (bool, np.bool_)), "a boolean (true or false)"
                if ok:
                    setattr(self, name, bool(value))
            elif field.type is tuple:  # of positive integers
                ok = isinstance(value, (list, tuple)) and bool(value) and all(is_integer(v) and v >= 1 for v in value)
                expected = "a non-empty list of positive integers"
                if ok:
                    setattr(self, name, tuple(sorted({int(v) for v in value})))
            elif field.type in (float, Optional[float]):
                ok = (is_integer(value) or isinstance(value, (float, np.floating))) and math.isfinite(value)
                expected = "a finite number"
                if ok:
                    setattr(self, name, int(value) if is_integer(value) else float(value))
            else:
                ok, expected = isinstance(value, str), "a string"
            if not ok:
                raise ValueError(f"Invalid config: `{name}` must be {expected}. Received: {name}={value!r}")

    def to_dict(self):
        return dataclasses.asdict(self)


def _is_step_range(text):
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        return False
    first, last = (int(p) for p in parts)
    return 1 <= first <= last


NAMED_CONFIGS = {
    # The tiny GPT-2 preset, for training on a CPU and for tests.
    "gpt2_tiny": {},
    # GPT-2 small (124M parameters), for accelerators: GPT-2's BPE, 1024 tokens, bf16.
    "gpt2_small": {
        "model": "gpt2_small",
        "tokenizer": "bpe",
        "vocabulary_size": 50257,
        "sequence_length": 1024,
        "batch_size": 8,
        "learning_rate": 6e-4,
        "warmup_steps": 500,
        "max_steps": 20000,
        "eval_every": 1000,
        "backup_every": 500,
        "precision": "mixed_bfloat16",
        "out": "runs/gpt2_small",
    },
}

FIELDS = {field.name: field for field in dataclasses.fields(TrainConfig) if field.name != "model_options"}
MODEL_OPTIONS = model_options()


def _split_model_options(values, source):
    """`values` with the model options (top-level keys of a flat config) moved into `model_options`."""
    values = dict(values)
    options = values.pop("model_options", None) or {}
    if not isinstance(options, dict):
        raise ValueError(f"Invalid config: `model_options` must be a mapping. Received: model_options={options!r}")
    options = dict(options)
    for name in list(values):
        if name in MODEL_OPTIONS and name not in FIELDS:
            if name in options:  # which of the two is meant is not for us to guess
                raise ValueError(
                    f"Invalid config: `{name}` is set both at the top level and under `model_options` in {source}: "
                    f"set it once. Received: {name}={values[name]!r} and model_options.{name}={options[name]!r}"
                )
            options[name] = values.pop(name)
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise ValueError(
            f"Unknown config key(s) {unknown} in {source}. Valid keys: {sorted(FIELDS)} and the model options "
            f"{sorted(MODEL_OPTIONS)}"
        )
    return values, options


def load_config(name_or_path="gpt2_tiny", overrides=None):
    """A validated `TrainConfig` from a named config or a JSON file, then `overrides`."""
    if name_or_path in NAMED_CONFIGS:
        values = dict(NAMED_CONFIGS[name_or_path])
    elif os.path.isfile(name_or_path):
        with open(name_or_path) as f:
            try:
                values = json.load(f)
            except json.JSONDecodeError as error:
                raise ValueError(f"Invalid config: {name_or_path!r} is not valid JSON ({error})") from None
        if not isinstance(values, dict):
            raise ValueError(
                f"Invalid config: {name_or_path!r} must hold a JSON object of config keys and values. "
                f"Received: a JSON {json_kind(values)}"
            )
    else:
        raise ValueError(
            f"`--config` must be one of {tuple(NAMED_CONFIGS)} or a JSON file. Received: config={name_or_path!r}"
        )
    values, options = _split_model_options(values, name_or_path)
    overrides, option_overrides = _split_model_options(
        {k: v for k, v in (overrides or {}).items() if v is not None}, "the overrides"
    )
    return TrainConfig(**{**values, **overrides}, model_options={**options, **option_overrides}).validate()


def json_kind(value):
    """What a parsed JSON value is, in JSON's words."""
    for kind, name in ((dict, "object"), (list, "list"), (str, "string"), (bool, "boolean"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return "number"
