"""The `tfam` training, evaluation, generation and export commands (see pipelines.cli)."""


def add_commands(commands):
    """Adds `train`, `eval`, `generate`, `export` to the `tfam` sub-command parser."""
