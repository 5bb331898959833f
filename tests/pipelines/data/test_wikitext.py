import hashlib
import os

import pytest
from shared_data import WIKITEXT2, requires_wikitext

from pipelines.data.wikitext import count_words, find_split, read_corpus, read_lines, split_lines, split_stats


@requires_wikitext
@pytest.mark.parametrize("split, lines, tokens", [("valid", 3760, 217646), ("test", 4358, 245569)])
def test_official_counts(split, lines, tokens):
    stats = split_stats(read_lines(find_split(WIKITEXT2, split)))
    assert stats["lines"] == lines and stats["tokens"] == tokens


@requires_wikitext
def test_files_are_the_real_ones():
    with open(find_split(WIKITEXT2, "valid"), "rb") as f:
        assert (
            hashlib.sha256(f.read()).hexdigest() == "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"
        )


def test_subfolder_and_alias(tmp_path):
    folder = tmp_path / "wikitext-2"
    folder.mkdir()
    (folder / "wiki.valid.tokens").write_text(" a b \n\n c\n")
    path = find_split(str(tmp_path), "validation")
    assert read_lines(path) == [" a b ", "", " c"]
    assert count_words(read_lines(path)) == 3 + 3


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="No train split in .*wiki.train.tokens"):
        find_split(str(tmp_path), "train")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_split(str(tmp_path / "missing"), "train")
    with pytest.raises(ValueError, match="Received: split='dev'"):
        find_split(str(tmp_path), "dev")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match="is empty"):
        read_lines(str(empty))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"hello \xe9 world\n")
    with pytest.raises(ValueError, match=r"not valid UTF-8: byte 0xe9 at byte offset 6"):
        read_lines(str(bad))


def test_any_text_file_or_directory(tmp_path):
    (tmp_path / "b.txt").write_text("second\n")
    (tmp_path / "a.txt").write_text("first line\nmore")
    assert read_corpus(str(tmp_path)) == ["first line", "more", "second"]
    assert read_corpus(os.path.join(tmp_path, "b.txt")) == ["second"]
    assert split_lines(None, str(tmp_path)) == ["first line", "more", "second"]
    assert split_lines(str(tmp_path / "b.txt"), "train") == ["second"]
