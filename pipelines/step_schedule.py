"""Where a `tfam train` run backs up, evaluates and logs, counted in optimizer steps, and the `fit` that does it.

A step is one optimizer update everywhere: `--max-steps`, `--backup-every`,
`--eval-every`, the log interval, `summary.json`, the backups' records, the
TensorBoard axis and the data stream's position. With gradient accumulation
a step is `accumulation` batches.

Keras calls callbacks at its epochs' ends, so a `fit` here runs epochs of
`epoch_steps` steps: the greatest common divisor of every interval, of
`max_steps` and of the step it starts at, so that each event falls on an
epoch's end whatever the values. Each callback then acts only at its own
steps (`backs_up`, `evaluates`, `logs`); the end of the run is all three.
"""

import math

from keras_tfam.utils import is_integer


class StepSchedule:
    """The steps of a run from `start` to `max_steps` at which it backs up, evaluates and logs.

    Args:
        max_steps: optimizer updates the run ends at.
        backup_every: a backup after every this many steps (and at the end).
        eval_every: a validation after every this many steps (and at the end).
        log_every: training scalars after every this many steps (and at the end); `None`: `backup_every`.
        accumulation: batches per step (gradient accumulation).
        start: the step the run is at (a restored backup's), at most `max_steps`.

    Example:

    >>> schedule = StepSchedule(max_steps=21, backup_every=10, eval_every=7)
    >>> [step for step in range(1, 22) if schedule.backs_up(step)]
    [10, 20, 21]
    >>> schedule.epoch_steps, schedule.epochs
    (1, 21)
    """

    def __init__(self, max_steps, backup_every, eval_every, log_every=None, accumulation=1, start=0):
        log_every = backup_every if log_every is None else log_every
        for name, value in (
            ("max_steps", max_steps),
            ("backup_every", backup_every),
            ("eval_every", eval_every),
            ("log_every", log_every),
            ("accumulation", accumulation),
        ):
            if not is_integer(value) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        if not is_integer(start) or not 0 <= start <= max_steps:
            raise ValueError(f"`start` must be an integer in [0, max_steps={max_steps}]. Received: start={start!r}")
        self.max_steps = int(max_steps)
        self.backup_every = int(backup_every)
        self.eval_every = int(eval_every)
        self.log_every = int(log_every)
        self.accumulation = int(accumulation)
        self.start = int(start)
        # gcd(n, 0) is n: a run from step 0 is not constrained by its start.
        self.epoch_steps = math.gcd(self.backup_every, self.eval_every, self.log_every, self.max_steps, self.start)

    @property
    def batches_per_epoch(self):
        """`steps_per_epoch` of `fit`: the batches of one epoch."""
        return self.epoch_steps * self.accumulation

    @property
    def initial_epoch(self):
        """`initial_epoch` of `fit`."""
        return self.start // self.epoch_steps

    @property
    def epochs(self):
        """`epochs` of `fit`."""
        return self.max_steps // self.epoch_steps

    @property
    def skipped_batches(self):
        """Batches of the stream the steps before `start` read (a resumed stream skips them)."""
        return self.start * self.accumulation

    def step(self, epoch):
        """The step reached at the end of `fit`'s epoch `epoch` (0-based, as callbacks receive it)."""
        return (epoch + 1) * self.epoch_steps

    def epoch_of(self, step):
        """The epoch index `fit` starts at to resume at `step`."""
        return step // self.epoch_steps

    def backs_up(self, step):
        return step % self.backup_every == 0 or step == self.max_steps

    def evaluates(self, step):
        return step % self.eval_every == 0 or step == self.max_steps

    def logs(self, step):
        return step % self.log_every == 0 or step == self.max_steps

    def events(self):
        """`{step: ("backup", "eval", "log")}`, each step's events in order, for the steps after `start`."""
        found = {}
        for epoch in range(self.initial_epoch, self.epochs):
            step = self.step(epoch)
            kinds = tuple(
                kind
                for kind, due in (("backup", self.backs_up), ("eval", self.evaluates), ("log", self.logs))
                if due(step)
            )
            if kinds:
                found[step] = kinds
        return found
