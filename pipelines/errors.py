"""What the `tfam` commands raise, the exit code each means, and one-line notices.

Exit codes (see `pipelines.cli.main`): 2 for usage errors (a bad option or
value, a missing input, an export that exists, a run directory in use),
1 for failures (a training that diverged, state on disk that is corrupt and
cannot be recovered, any other error).
"""

import sys


class Failure(Exception):
    """A command that could not do its work although it was used correctly (exit code 1)."""


class CorruptFileError(Failure):
    """A file the run wrote earlier is damaged (truncated, not parseable, not what was written).

    Args:
        path: the file (or folder).
        problem: what is wrong with it, e.g. `"is truncated (1,924 of 12,402,310 bytes)"`.
        action: what the user can do about it, appended after the problem.
    """

    def __init__(self, path, problem, action=None):
        self.path = path
        self.problem = problem
        self.action = action
        super().__init__(f"{path} {problem}" + (f"; {action}" if action else ""))


class TrainingDiverged(Failure):
    """Training stopped because the loss stopped being finite."""


class RunInUse(Exception):
    """Another process holds the lock of a run (or export) directory (exit code 2)."""


def notice(message):
    """Prints one line for the user on stderr: what was found and what is done about it."""
    print(f"tfam: {message}", file=sys.stderr, flush=True)
