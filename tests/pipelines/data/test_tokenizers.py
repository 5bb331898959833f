import numpy as np
import pytest
import tensorflow as tf
from shared_data import WIKITEXT2, requires_wikitext

from pipelines.data.lm_stream import tokenize_lines
from pipelines.data.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    load_tokenizer,
    train_tokenizer,
)
from pipelines.data.wikitext import find_split, read_lines

TEXT = ["Hello world , this is <unk> text .", "", " = Heading = ", "Ünïcödé and emoji 🙂  double  spaces\tand tabs"]


@pytest.fixture(scope="module")
def valid_lines():
    if not tf.io.gfile.exists(WIKITEXT2):
        pytest.skip("shared data missing")
    return read_lines(find_split(WIKITEXT2, "valid"))


def test_word_tokenizer_counts_and_unk():
    tokenizer = WordTokenizer.train(["a b a", "c"])
    assert tokenizer.vocabulary[:2] == ["a", "<eos>"]
    ids = tokenizer.tokenize(tf.constant(["a zzz", ""]))
    assert ids.to_list() == [[0, tokenizer.unk_id, tokenizer.eos_id], [tokenizer.eos_id]]
    assert tokenizer.detokenize(ids).numpy().tolist() == [b"a <unk>\n", b"\n"]


@requires_wikitext
def test_word_stream_has_the_official_token_count(valid_lines):
    tokenizer = WordTokenizer.train(valid_lines)
    assert tokenize_lines(tokenizer, valid_lines).size == 217646


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_round_trip_of_raw_text(kind, tmp_path):
    tokenizer = train_tokenizer(kind, TEXT * 20, vocabulary_size=300 if kind == "bpe" else None)
    ids = tokenizer.tokenize(tf.constant(TEXT))
    assert tf.strings.reduce_join(tokenizer.detokenize(ids)).numpy().decode() == "".join(t + "\n" for t in TEXT)
    tokenizer.save(str(tmp_path))
    loaded = load_tokenizer(str(tmp_path))
    np.testing.assert_array_equal(loaded.tokenize(tf.constant(TEXT)).flat_values, ids.flat_values)


@requires_wikitext
def test_bpe_in_graph_equals_eager_and_round_trips(valid_lines, tmp_path):
    tokenizer = BPETokenizer.train(valid_lines, vocabulary_size=2000)
    assert tokenizer.vocabulary_size == 2000
    sample = tf.constant(valid_lines[:300])
    eager = tokenizer.tokenize(sample)
    graph = tf.function(tokenizer.tokenize)(sample)
    np.testing.assert_array_equal(eager.flat_values, graph.flat_values)
    text = tf.strings.reduce_join(tf.function(tokenizer.detokenize)(graph)).numpy().decode("utf-8")
    assert text == "".join(line + "\n" for line in valid_lines[:300])
    # GPT-2's file format: vocab.json + merges.txt load as the real GPT-2 files would.
    tokenizer.save(str(tmp_path))
    gpt2_style = BPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    np.testing.assert_array_equal(gpt2_style.tokenize(sample).flat_values, eager.flat_values)


def test_char_tokenizer_unknown_characters():
    tokenizer = CharTokenizer.train(["ab"])
    ids = tokenizer.tokenize(tf.constant(["abz"]))
    assert ids.to_list()[0][-2:] == [tokenizer.unk_id, tokenizer.eos_id]


def test_bad_tokenizer_arguments(tmp_path):
    with pytest.raises(ValueError, match="Received: tokenizer='sentencepiece'"):
        train_tokenizer("sentencepiece", ["a"])
    with pytest.raises(FileNotFoundError, match="No tokenizer in"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="must contain"):
        WordTokenizer(["a"])
