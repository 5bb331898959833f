"""A SentencePiece-only checkpoint directory tokenizes as transformers' tokenizer does (`reference.json`,
written by `scripts/make_sentencepiece_fixtures.py` with transformers), and bad files are refused in one line."""

import json
import os
import shutil

import pytest

from keras_tfam.convert import HuggingFaceTokenizer

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
SENTENCEPIECE = ("spm-llama-tiny", "spm-llama-legacy-tiny", "spm-gemma-tiny")


def reference(name):
    with open(os.path.join(FIXTURES, name, "reference.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("name", SENTENCEPIECE)
def test_sentencepiece_ids_and_text_equal_transformers(name):
    expected = reference(name)
    texts = expected["texts"]
    # What the fixture holds: leading, doubled and trailing spaces, special tokens written in a text, unicode.
    assert {" Hello", "a  b   c", "trailing ", "<unk> and </s> inside"} <= set(texts)
    assert any(not text.isascii() for text in texts) and any(char.isdigit() for text in texts for char in text)
    tokenizer = HuggingFaceTokenizer(os.path.join(FIXTURES, name))
    assert tokenizer.encode(texts) == expected["ids"]
    assert [tokenizer.decode(ids) for ids in expected["ids"]] == expected["decoded"]


def test_special_tokens_written_in_a_text_are_special_and_user_pieces_whole():
    tokenizer = HuggingFaceTokenizer(os.path.join(FIXTURES, "spm-llama-tiny"))
    ids = tokenizer.encode("<unk> and </s> <start_of_turn>", add_special_tokens=False)
    assert ids[0] == 0 and tokenizer.eos_token_id == 2 and 2 in ids and 3 in ids  # <start_of_turn> is piece 3
    assert tokenizer.decode(ids, skip_special_tokens=False).startswith("<unk>")


def copy_with(tmp_path, config=None, model=None):
    directory = tmp_path / "tokenizer"
    shutil.copytree(os.path.join(FIXTURES, "spm-llama-tiny"), directory)
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if model is not None:
        (directory / "tokenizer.model").write_bytes(model)
    return str(directory)


def test_an_unknown_tokenizer_class_is_refused_in_one_line(tmp_path):
    directory = copy_with(tmp_path, config={"tokenizer_class": "T5Tokenizer"})
    with pytest.raises(
        ValueError, match=r"^A SentencePiece tokenizer.model .*Received: tokenizer_class='T5Tokenizer'$"
    ):
        HuggingFaceTokenizer(directory)


def test_a_file_that_is_no_sentencepiece_model_is_refused_in_one_line(tmp_path):
    directory = copy_with(tmp_path, model=b"\xff\xfe not a model")
    with pytest.raises(ValueError, match="tokenizer.model cannot be read as a SentencePiece model") as error:
        HuggingFaceTokenizer(directory)
    assert "\n" not in str(error.value)


def test_a_unigram_model_is_refused_in_one_line(tmp_path):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(os.path.join(FIXTURES, "spm-llama-tiny", "tokenizer.model"), "rb") as f:
        proto.ParseFromString(f.read())
    proto.trainer_spec.model_type = 1  # UNIGRAM
    directory = copy_with(tmp_path, model=proto.SerializeToString())
    with pytest.raises(
        ValueError, match=r"must be a SentencePiece BPE model .*Received: model_type=1 with 700 pieces$"
    ):
        HuggingFaceTokenizer(directory)
