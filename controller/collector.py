"""When Python's cyclic garbage collector runs: not during start-up, not at exit.

A command builds ~100k objects while it imports and reads its state, nearly all of
them kept until the process ends. The collector walks them all, again and again
while they are made, and once more at exit: ~40 ms of a 250 ms ``reconcile --once``.
So a command starts with it off (:func:`starting`); whatever runs long (the daemon,
``--wait``, ``logs -f``) turns it back on once set up (:func:`settled`), with what
start-up made frozen out of every later walk; and :func:`exiting` freezes all before
the interpreter's last walk. Reference counting frees everything else as usual.
"""

from __future__ import annotations

import gc


def starting() -> None:
    gc.disable()


def settled() -> None:
    """From here the process runs long: collect again, but never the start-up objects."""
    gc.freeze()
    gc.enable()


def exiting() -> None:
    """Nothing left to free that the OS will not: skip the interpreter's last walk."""
    gc.freeze()
