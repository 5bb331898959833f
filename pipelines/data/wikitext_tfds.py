"""A TensorFlow Datasets builder for WikiText (Merity et al. 2016).

    import pipelines.data.wikitext_tfds  # registers "wikitext"
    ds = tfds.load("wikitext/wikitext-2-v1", split="validation",
                   download_and_prepare_kwargs={"download_config":
                       tfds.download.DownloadConfig(manual_dir="/data/wikitext-2")})

One example per line of the split (`{"text": line}`, in file order, empty
lines included). Online, it downloads the official archive from its current
address, falling back to the original one, and checks its SHA-256. Offline,
it reads a manual directory holding `wiki.{train,valid,test}.tokens` (or
`.raw`); a split whose file is missing there is left out with a warning.
`tfds_split_lines` fails at once (`Failure`, naming `--data-dir`) when the
data is not prepared and no download address can be reached, instead of
waiting on the download's retries.
"""

import hashlib
import logging
import os
import socket
import threading
import urllib.parse

import tensorflow_datasets as tfds

from pipelines.data.wikitext import EXPECTED, HOW_TO_GET, find_split, read_lines
from pipelines.errors import Failure

_HOSTS = ("https://wikitext.smerity.com/", "https://s3.amazonaws.com/research.metamind.io/wikitext/")
# SHA-256 of the official archives (None: not pinned, the download is only checked for its files).
_SHA256 = {
    "wikitext-2-v1": "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c",
    "wikitext-2-raw-v1": "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
    "wikitext-103-v1": None,
    "wikitext-103-raw-v1": None,
}
_TFDS_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
# How long finding one download address (name lookup and connection) may take.
_REACH_SECONDS = 5.0


class WikitextConfig(tfds.core.BuilderConfig):
    """One WikiText variant: its archive name."""


class Wikitext(tfds.core.GeneratorBasedBuilder):
    """WikiText language modelling datasets, line by line."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [
        WikitextConfig(name="wikitext-2-v1", description="WikiText-2, tokenized, rare words as <unk>."),
        WikitextConfig(name="wikitext-2-raw-v1", description="WikiText-2, raw characters."),
        WikitextConfig(name="wikitext-103-v1", description="WikiText-103, tokenized."),
        WikitextConfig(name="wikitext-103-raw-v1", description="WikiText-103, raw characters."),
    ]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        f"Put {EXPECTED.format(split='{train,valid,test}')} in the manual directory "
        "(e.g. unzip wikitext-2-v1.zip from https://wikitext.smerity.com/ there)."
    )
    #: Download addresses tried in order; tests set this to () to stay offline.
    hosts = _HOSTS

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            # Language modelling reads the lines in file order.
            disable_shuffling=True,
            homepage=(
                "https://blog.salesforceairesearch.com/the-wikitext-long-term-dependency-language-modeling-dataset/"
            ),
            citation="Merity, Xiong, Bradbury, Socher. Pointer Sentinel Mixture Models. 2016.",
        )

    def _manual_files(self, manual_dir):
        found = {}
        for split in _TFDS_SPLITS:
            try:
                found[split] = find_split(manual_dir, split)
            except FileNotFoundError:
                pass
        return found

    def _download(self, dl_manager):
        name = self.builder_config.name
        errors = []
        for host in self.hosts:
            url = f"{host}{name}.zip"
            try:
                archive = dl_manager.download(url)
            except Exception as error:  # noqa: BLE001 - try the next address
                errors.append(f"{url}: {error}")
                continue
            expected = _SHA256.get(name)
            with open(archive, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            if expected and digest != expected:
                errors.append(f"{url}: sha256 {digest} != expected {expected}")
                continue
            return self._manual_files(os.fspath(dl_manager.extract(archive)))
        return errors

    def _split_generators(self, dl_manager):
        manual = getattr(dl_manager, "_manual_dir", None)
        manual_dir = os.fspath(manual) if manual else None
        files = self._manual_files(manual_dir) if manual_dir and os.path.isdir(manual_dir) else {}
        errors = []
        if not files:
            result = self._download(dl_manager)
            files, errors = (result, []) if isinstance(result, dict) else ({}, result)
        if not files:
            raise FileNotFoundError(
                f"WikiText ({self.builder_config.name}): no data. Searched the manual directory "
                f"{manual_dir!r} for {EXPECTED.format(split='{train,valid,test}')}; downloads failed: "
                f"{errors or 'no address tried'}. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}"
            )
        missing = sorted(set(_TFDS_SPLITS) - set(files))
        if missing:
            logging.warning("WikiText: splits %s not found in %s; building only %s", missing, manual_dir, sorted(files))
        return {_TFDS_SPLITS[split]: self._generate_examples(path) for split, path in files.items()}

    def _generate_examples(self, path):
        for index, line in enumerate(read_lines(path)):
            yield index, {"text": line}


def _reachable(url, seconds=_REACH_SECONDS):
    """Whether `url`'s host resolves and accepts a connection within `seconds` (a lookup may hang: timed apart)."""
    parts = urllib.parse.urlsplit(url)
    reached = []

    def connect():
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            socket.create_connection((parts.hostname, port), timeout=seconds).close()
            reached.append(True)
        except (OSError, ValueError):
            pass

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(reached)


def tfds_split_lines(dataset, split, data_dir=None):
    """Lines of `split` of the WikiText variant `dataset`, downloaded and prepared by TFDS.

    Raises:
        Failure: the data is not prepared and no download address answers (offline): pass `--data-dir`.
    """
    from pipelines.data.wikitext import canonical_split

    split = canonical_split(split)
    builder = Wikitext(config=dataset, data_dir=data_dir)
    # What `builder.is_prepared()` checks, without its warning about a folder that is not.
    prepared = os.path.isfile(os.path.join(builder.data_dir, "dataset_info.json"))
    if not prepared and builder.hosts and not any(_reachable(host) for host in builder.hosts):
        hosts = ", ".join(urllib.parse.urlsplit(host).hostname for host in builder.hosts)
        raise Failure(
            f"WikiText ({dataset}) is not prepared in {builder.data_dir} and cannot be downloaded: no answer from "
            f"{hosts} (offline?). Pass --data-dir DIR, the folder holding {EXPECTED.format(split=split)}. "
            f"{HOW_TO_GET}"
        )
    builder.download_and_prepare()
    name = _TFDS_SPLITS[split]
    if name not in builder.info.splits:
        raise FileNotFoundError(f"WikiText ({dataset}) was prepared without its {split} split")
    return [example["text"].decode("utf-8") for example in tfds.as_numpy(builder.as_dataset(split=name))]
