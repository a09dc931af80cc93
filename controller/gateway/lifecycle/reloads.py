"""A gateway's answers to SIGHUP: ``<state>/gateway/reloads-<nonce>``, "BEGUN ANSWERED".

A signal carries nothing back. `reconcile gateway reload` checked the key file and TLS
pair itself, then sent SIGHUP and exited 0: a file changed between that check and the
gateway's own re-read was refused in ``refused.json`` (`gateway status` said so) while
the verb had said it was taken. So the gateway counts the SIGHUPs it began to act on and
those it answered (its outcome noted in ``refused.json``, refused or cleared), and the
verb waits for an answer to a reload begun after it signalled, then reads that outcome.

Counting "begun" as well keeps a reload under way when the verb signalled from being
taken for its answer: the verb waits for the one after it. Written by the gateway's
main thread alone (atomically: a reader never sees half); removed with the gateway's
member file (``registry.unregister``, ``registry.forget``). A gateway that writes none
(one started before there were answers) is not waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from controller.logsetup import get_logger
from controller.store.documents import write_atomic
from controller.store.statedir import StateDir

log = get_logger("reconcile")

ANSWER_WAIT = 20.0  # seconds a gateway may take to answer a SIGHUP (a loaded host's too)
LOOK = 0.05  # seconds between looks at the count


@dataclass(frozen=True, slots=True)
class Count:
    begun: int = 0
    answered: int = 0


def read(state_dir: Path, nonce: str) -> Count | None:
    """The gateway's count; None when it keeps none (or the file is not ours)."""
    try:
        begun, answered = StateDir(state_dir).gateway_reloads(nonce).read_text().split()
        return Count(int(begun), int(answered))
    except (OSError, ValueError):
        return None


def wait_answer(state_dir: Path, nonce: str, before: Count, alive: Callable[[], bool]) -> bool:
    """Whether the gateway answered a reload begun after ``before`` was read, within
    ANSWER_WAIT; False as soon as it is not ``alive``."""
    deadline = time.monotonic() + ANSWER_WAIT
    while True:
        now = read(state_dir, nonce)
        if now is not None and now.answered > before.begun:
            return True
        if not alive() or time.monotonic() >= deadline:
            return False
        time.sleep(LOOK)


class Counter:
    """The gateway's side: one count, written at each step."""

    def __init__(self, state_dir: Path, nonce: str) -> None:
        self._path = StateDir(state_dir).gateway_reloads(nonce)
        self.count = Count()
        self._write()

    def begin(self) -> None:
        self.count = replace(self.count, begun=self.count.begun + 1)
        self._write()

    def answer(self) -> None:
        self.count = replace(self.count, answered=self.count.begun)
        self._write()

    def _write(self) -> None:
        """A count not written costs a verb its wait (it says no answer came), never the
        gateway its reload: logged, and the gateway serves on."""
        try:
            write_atomic(self._path, f"{self.count.begun} {self.count.answered}\n".encode())
        except OSError as exc:
            log.warning("gateway reload count not written", file=str(self._path), error=str(exc))
