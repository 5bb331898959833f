"""`GraphTokenizer`: a `tokenizer.json` pipeline as TensorFlow ops, against the `tokenizers` library (the Rust
tokenizers that transformers runs) on the fixtures' tokenizers, WikiText-2 test lines and generated text."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from keras_tfam.convert import HuggingFaceTokenizer
from pipelines.data import graph_tokenizer
from pipelines.data.graph_tokenizer import GraphTokenizer, UnsupportedTokenizer

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures")
with open(os.path.join(FIXTURES, "hf-llama-tiny", "texts.json"), encoding="utf-8") as _file:
    WIKITEXT_LINES = json.load(_file)  # 40 lines of WikiText-2's test split
# Where the split patterns' look-ahead, Unicode whitespace, added tokens and byte fallback decide the ids.
EDGES = [
    "",
    " ",
    "   ",
    "Hello  world",
    "a \n\nb",
    "\n\n  x",
    " \n x",
    "  123",
    "!\n  x",
    "x   ",
    "tab\t\tword",
    "\u00a0\u00a0nbsp",
    "it's IT'S He'll",
    "<s> in text </s>",
    "<|endoftext|>after",
    "émigré naïve 日本語 テキスト",
    "12345678 1,234.5",
    "mixed \r\n\r\n  end",
    "\u3000\u3000x",
    "a\u2009\u2009b",
    "e\u0301 combining",
    "<unk>",
    "x<0x41>y",
    "emoji 🙂🙂 ok",
    "ſ 'S 'ſ",
    "\x0b\x0bv",
    "\x85\x85z",
    "<|begin_of_text|><|begin_of_text|> x",
]
# Characters that exercise every alternative of the split patterns.
ALPHABET = [*"ab Z9'sS\n\r\t ,.!", "\u00a0", "\u3000", "\u2009", "é", "e\u0301", "日", "🙂", "\x0b", "\x85", "ſ", "’"]


def _assert_same_as_library(library, graph, texts, rows=()):
    """Ids of `texts` and text of those ids (and of `rows`) as the library gives them."""
    ids = graph.encode(tf.constant(texts)).to_list()
    expected = [library.encode(text, add_special_tokens=False) for text in texts]
    mismatches = [(text, got, want) for text, got, want in zip(texts, ids, expected) if got != want]
    assert not mismatches, mismatches[:3]
    rows = [*expected, *rows]
    text = graph.decode(tf.ragged.constant(rows, dtype=tf.int32, ragged_rank=1)).numpy()
    mismatches = [
        (row, got.decode(), library.decode(row)) for row, got in zip(rows, text) if got.decode() != library.decode(row)
    ]
    assert not mismatches, mismatches[:3]


@pytest.mark.parametrize(
    "fixture",
    [
        "hf-llama-tiny",
        "hf-qwen2-tiny",
        "hf-mistral-tiny",
        "hf-gemma-tiny",
        "spm-llama-tiny",
        "spm-llama-legacy-tiny",
        "spm-gemma-tiny",
    ],
)
def test_the_fixtures_tokenizers_give_transformers_ids_and_text(fixture):
    library = HuggingFaceTokenizer(os.path.join(FIXTURES, fixture))
    graph = GraphTokenizer(library.to_json())
    random_ids = np.random.default_rng(0).integers(0, library.vocabulary_size, (100, 12)).tolist()
    _assert_same_as_library(library, graph, WIKITEXT_LINES + EDGES, random_ids)


class _Library:
    """A `tokenizers.Tokenizer` with HuggingFaceTokenizer's encode/decode."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text, add_special_tokens=False):
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids):
        return self.tokenizer.decode(ids)


def _byte_level(pattern=None, ignore_merges=False, nfc=False, prefix_space=False):
    """A byte-level BPE trained on the WikiText lines, split by `pattern` (GPT-2's where None)."""
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if pattern is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=["<|begin_of_text|>", "<|eot|>"],
    )
    tokenizer.train_from_iterator(WIKITEXT_LINES, trainer)
    return _Library(tokenizer)


SPLITS = {
    "llama3": dict(pattern=graph_tokenizer.LLAMA3_PATTERN, ignore_merges=True),
    "qwen2": dict(pattern=graph_tokenizer.QWEN2_PATTERN, nfc=True),
    "gpt2": dict(),
    "gpt2-prefix-space": dict(prefix_space=True),
}


@pytest.fixture(scope="module", params=sorted(SPLITS))
def split_tokenizer(request):
    library = _byte_level(**SPLITS[request.param])
    return library, GraphTokenizer(library.tokenizer.to_str())


def test_the_split_patterns_look_ahead_is_read_exactly(split_tokenizer):
    library, graph = split_tokenizer
    _assert_same_as_library(library, graph, WIKITEXT_LINES + EDGES)


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(
        st.lists(st.sampled_from(ALPHABET + ["<|eot|>", "  ", "\n\n"]), max_size=24).map("".join),
        min_size=1,
        max_size=40,
    )
)
def test_generated_text_gives_the_librarys_ids(split_tokenizer, texts):
    library, graph = split_tokenizer
    _assert_same_as_library(library, graph, texts)


def test_it_runs_in_a_saved_model(tmp_path):
    library = HuggingFaceTokenizer(os.path.join(FIXTURES, "hf-qwen2-tiny"))
    module = tf.Module()
    module.graph = GraphTokenizer(library.to_json())
    module.round_trip = tf.function(
        lambda texts: module.graph.decode(module.graph.encode(texts)),
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    texts = WIKITEXT_LINES[:5] + ["  spaced\n\nout  "]
    assert [t.decode() for t in loaded.round_trip(tf.constant(texts)).numpy()] == texts


def _with(tokenizer_json, **changes):
    spec = json.loads(tokenizer_json)
    for path, value in changes.items():
        node = spec
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return json.dumps(spec)


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"model__type": "WordPiece"}, "model"),
        (
            {
                "pre_tokenizer": {
                    "type": "Split",
                    "pattern": {"Regex": r"\w+(?=x)"},
                    "behavior": "Isolated",
                    "invert": False,
                }
            },
            "pre-tokenizer",
        ),
        ({"pre_tokenizer": {"type": "Digits", "individual_digits": True}}, "pre-tokenizer"),
        ({"normalizer": {"type": "Lowercase"}}, "normalizer"),
        ({"decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True}}, "decoder"),
    ],
)
def test_a_pipeline_without_a_graph_version_is_refused_in_one_line_naming_the_part(changes, named):
    tokenizer_json = HuggingFaceTokenizer(os.path.join(FIXTURES, "hf-llama-tiny")).to_json()
    with pytest.raises(UnsupportedTokenizer, match=f"^The tokenizer's {named} .* has no TensorFlow version here$"):
        GraphTokenizer(_with(tokenizer_json, **changes))
