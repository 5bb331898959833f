import pytest
import tensorflow_datasets as tfds
from shared_data import WIKITEXT2, requires_wikitext

from pipelines.data import wikitext_tfds


@requires_wikitext
def test_builder_reads_the_manual_directory_in_order(tmp_path):
    builder = wikitext_tfds.Wikitext(config="wikitext-2-v1", data_dir=str(tmp_path))
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=WIKITEXT2))
    lines = [ex["text"].numpy().decode() for ex in builder.as_dataset(split="validation")]
    with open(f"{WIKITEXT2}/wiki.valid.tokens", encoding="utf-8") as f:
        assert lines == f.read().split("\n")[:-1]
    assert len(lines) == 3760
    assert sum(len(line.split()) for line in lines) + len(lines) == 217646
    assert set(builder.info.splits) == {"validation", "test"}  # train is not in the shared folder


def test_no_data_and_no_download_names_what_was_searched(tmp_path, monkeypatch):
    monkeypatch.setattr(wikitext_tfds.Wikitext, "hosts", ())
    builder = wikitext_tfds.Wikitext(config="wikitext-2-raw-v1", data_dir=str(tmp_path / "data"))
    manual = tmp_path / "manual"
    manual.mkdir()
    with pytest.raises(
        FileNotFoundError, match=r"Searched the manual directory .*manual.* for wiki\.\{train,valid,test\}\.tokens"
    ):
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
