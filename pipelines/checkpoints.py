"""`.keras` checkpoints that are written atomically and verified before they are loaded.

`save_checkpoint` writes `name.keras` through a temporary and records its
size and SHA-256 in the sidecar `name.json` (with whatever else the caller
records, e.g. the validation loss). `load_checkpoint` checks the file
against the sidecar, or, for a checkpoint without one, checks the zip
archive's CRCs, before Keras reads it: a truncated checkpoint is reported as
such, with its path, instead of Keras' "File not found".
"""

import os
import zipfile

from pipelines.errors import CorruptFileError, notice
from pipelines.files import verify_with_sidecar, write_with_sidecar


def save_checkpoint(model, path, record, fault=None):
    """Saves `model` to `path` (`.keras`) atomically; the sidecar gets `record` + size + SHA-256."""
    return write_with_sidecar(path, model.save, record, fault=fault)


def _archive_problem(path):
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"is not a complete .keras archive ({error}; {os.path.getsize(path):,} bytes)"
    if damaged is not None:
        return f"is damaged (member {damaged!r} fails its CRC check)"
    return None


def verify_checkpoint(path):
    """The sidecar record of the checkpoint at `path` (`{}` if it has none); raises if it is damaged.

    Raises:
        CorruptFileError: missing, truncated or altered file, or damaged sidecar.
    """
    if not os.path.isfile(path):
        raise CorruptFileError(path, "is missing")
    try:
        record = verify_with_sidecar(path)
    except CorruptFileError as error:
        if error.path == path:
            raise
        notice(f"{error}: checking {os.path.basename(path)} by its zip CRCs instead")
        record = None
    if record is None or "sha256" not in record:
        problem = _archive_problem(path)
        if problem is not None:
            raise CorruptFileError(path, problem)
    return record or {}


def load_checkpoint(path, compile=True):
    """The model saved at `path`, verified first; every failure names the file.

    `compile=False` leaves the optimizer's state unread: a checkpoint trained
    under mixed precision (whose loss-scaling optimizer has more variables
    than an unbuilt one) then loads without Keras' "Skipping variable
    loading for optimizer" warning.
    """
    verify_checkpoint(path)
    return load_verified_checkpoint(path, compile)


def load_verified_checkpoint(path, compile=True):
    """The model saved at `path`, a file `verify_checkpoint` passed; a failure names the file."""
    import keras

    import keras_tfam  # noqa: F401 - registers the layers for loading
    import pipelines.optimizer  # noqa: F401 - and the optimizer of compiled checkpoints

    try:
        return keras.saving.load_model(path, compile=compile)
    except Exception as error:  # noqa: BLE001 - whatever Keras raises, say which file
        raise CorruptFileError(path, f"cannot be loaded ({type(error).__name__}: {error})") from error
