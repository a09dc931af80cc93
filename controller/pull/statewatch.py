"""Whether the folder at a pull's state dir path is still the state dir that started it.

A pass starts a pull carrying its state dir's id (``RECONCILE_STATE_ID``, launch.py). The
folder at that path can become another state dir's while the pull runs (its disk
unmounted and another mounted there, the folder replaced): a write by path would then
land in that other state dir (its cache entry, its records, its journal). So the pull
looks before it writes, and before the checked file takes its name, and once the id
differs it writes nothing more there, and says why once, in its own log (stderr: the
``pull.log`` it holds open is the first state dir's). A pull with no id to compare (one
started by hand, or a Ray node's thread) is never stopped by this.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from controller.pull.job import Job, PullError
from controller.pull.launch import STATE_ID
from controller.store.config import stateid


class Swapped(PullError):
    """The state dir at the pull's path is another's now: nothing more is written there."""

    def __init__(self, message: str) -> None:
        super().__init__("error", message)


class StateWatch:
    def __init__(self, state_dir: Path, ours: str | None) -> None:
        self.state_dir = state_dir
        self.ours = ours
        self.why: str | None = None  # said once, on the first look that found it swapped
        self.began = False  # a look found it ours before: the pull ran, then it was swapped

    @classmethod
    def of(cls, job: Job) -> StateWatch:
        """The watch for the pull process of ``job``, from the id its environment carries."""
        return cls(job.state_dir, os.environ.get(STATE_ID) or None)

    @classmethod
    def none(cls) -> StateWatch:
        """No id to compare: a pull started by hand, or a Ray node's thread."""
        return cls(Path(), None)

    def check(self) -> None:
        """Before a write by path into the state dir: :class:`Swapped` when it is another's."""
        if not self.holds():
            assert self.why is not None
            raise Swapped(self.why)

    def holds(self) -> bool:
        """True while the folder at the path has the id the pull started with."""
        if self.why is not None:
            return False
        if self.ours is None:
            return True
        now = stateid.peek(self.state_dir)
        if now == self.ours:
            self.began = True
            return True
        self.why = self._reason(now)
        print(self.why, file=sys.stderr, flush=True)
        return False

    def _reason(self, now: str | None) -> str:
        is_now = f"its id is {now or 'missing'}, not {self.ours}"
        if not self.began:
            return (
                f"pull not started: {self.state_dir} is no longer the state dir that started "
                f"it ({is_now}); nothing written. Put the state dir back (mount its disk) and "
                "run again: its next pass starts the pull anew"
            )
        return (
            f"pull stopped: {self.state_dir} is no longer the state dir that started it "
            f"({is_now}); nothing more written there (no progress, result, journal or "
            "model file). Put the state dir back (mount its disk) and run again: its next "
            "pass resumes the pull from what it had written"
        )
