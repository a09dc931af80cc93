"""The state dir's identity: ``<state>/id`` (made 0600; readable by others is accepted, it is
no secret: writable by others is refused), a random id made once with the dir.

An engine carries its state dir's path (``RECONCILE_STATE``) and this id
(``RECONCILE_STATE_ID``). The path alone cannot tell this state dir from another one at
the same path: a disk not mounted (its mount point's empty folder), a folder emptied or
replaced, a ``--state-dir`` that did not exist yet. Such a folder has no record, and a
pass took every engine of the path for one no record accounts for, and stopped it. An
engine of another id is another state dir's: a pass refuses to act while one runs
(``reconciler/replaced.py``). A pass makes the id when there is none (a new state dir,
or one an older reconcile made: its engines, which carry no id, are judged as before);
a reader (``status``, ``plan``) only reads it. Made as the other private files are, so
two passes at once agree on one (``privatefile.py``: tmp + fsync + link).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from controller.store.config.privatefile import PrivateFile
from controller.store.statedir import StateDir

# What removing it costs, as the private files' errors say it (privatefile.py).
REMEDY = (
    "a pass makes a new one, and the engines running then are another state dir's to it: "
    "rather write back, mode 0600, the id they carry (RECONCILE_STATE_ID in "
    "/proc/PID/environ)"
)


def _file(state_dir: Path) -> PrivateFile:
    # No secret (each engine's environment carries it): read by others is no harm, changed
    # by others is (a dir made to look replaced, refused), so only writing is refused.
    return PrivateFile(StateDir(state_dir).state_id, "state dir id", REMEDY, secret=False)


def ensure(state_dir: Path) -> str:
    """The id, made first when there is none (a pass)."""
    return _file(state_dir).ensure(lambda: secrets.token_hex(16))


def peek(state_dir: Path) -> str | None:
    """The id, or None when no pass made one yet (a reader: nothing written)."""
    return _file(state_dir).peek()
