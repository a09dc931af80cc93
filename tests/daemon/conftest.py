"""The daemon under test: the real ``reconcile`` (no verb) in a subprocess.

``daemon()`` starts one on the test's node (see the ``reconcile`` fixture) with its
stderr (JSON lines: not a terminal; ``-v``: quiet passes too) in a file the test
reads. Teardown SIGKILLs any daemon still running *before* the ``reconcile``
fixture sweeps the node's engines, so no daemon can respawn an engine behind the
sweep. Tests end with ``finish()``: a clean SIGTERM (exit 0) and ``reconcile down``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import warmcli

WAIT = 30.0  # generous caps: the machine is noisy; a healthy run takes a fraction


class Daemon:
    def __init__(self, rc: Any, proc: subprocess.Popen[bytes] | warmcli.Started, log: Path) -> None:
        self.rc = rc
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self, event: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and event in (None, item.get("event")):
                out.append(item)
        return out

    def passes(self, trigger: str | None = None) -> list[dict[str, Any]]:
        return [p for p in self.lines("pass") if trigger is None or trigger in p["trigger"]]

    def wait_pass(self, after: int = 0, trigger: str | None = None) -> dict[str, Any]:
        """The first pass numbered above ``after`` (with ``trigger``, if given)."""

        def found() -> dict[str, Any] | None:
            self.check_running()
            return next((p for p in self.passes(trigger) if p["n"] > after), None)

        return self.wait(found, f"a pass after #{after} (trigger {trigger})")

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        try:
            return self.rc.wait_for(predicate, timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- daemon log\n{self.tail()}") from None

    def check_running(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        """The log's last lines, a pass that did nothing left out: a wait that failed with
        a resync of 0.3 s showed 40 such passes and none of what came before them."""
        said = [line for line in self.log.read_text().splitlines() if not _idle_pass(line)]
        return "\n".join(said[-lines:])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.ended(repr(sig))

    def ended(self, after: str) -> int:
        """Its exit code, once it has ended (``after`` what: a signal sent)."""
        try:
            return self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            said = f"daemon not ended {WAIT:.0f} s after {after}; its threads (faulthandler)"
            raise AssertionError(f"{said}:\n{self.threads()}") from None

    def threads(self) -> str:
        """Abort the daemon: faulthandler (``PYTHONFAULTHANDLER``, set for every daemon
        these tests start) writes each thread's stack to its log, whose end this returns:
        a stop that hangs is found from its stacks, not guessed at (a CI run's
        test_a_deleted_file_goes_away, once, at load)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-120:])


class Daemons:
    def __init__(self, rc: Any) -> None:
        self.rc = rc
        self.started: list[Daemon] = []

    def __call__(self, *args: str, resync: str = "1h", env: dict[str, str] | None = None) -> Daemon:
        log = self.rc.tmp / f"daemon-{len(self.started)}.log"
        with open(log, "wb") as err:
            proc = self.rc.daemon(
                "-v", "--resync", resync, *args, stderr=err,
                env={**self.rc.env, "PYTHONFAULTHANDLER": "1", **(env or {})},
            )  # fmt: skip
        daemon = Daemon(self.rc, proc, log)
        self.started.append(daemon)
        return daemon

    def kill_all(self) -> None:
        for daemon in self.started:
            if daemon.proc.poll() is None:
                daemon.proc.kill()
                daemon.proc.wait(timeout=WAIT)


@pytest.fixture
def daemon(reconcile: Any) -> Iterator[Daemons]:
    daemons = Daemons(reconcile)
    yield daemons
    daemons.kill_all()


@pytest.fixture
def finish(reconcile: Any) -> Callable[[Daemon], None]:
    """End a test cleanly: SIGTERM the daemon (exit 0), then `reconcile down`."""

    def done(d: Daemon) -> None:
        code = d.stop()
        assert code == 0, f"daemon exited {code}:\n{d.tail()}"
        reconcile.down()

    return done


def _idle_pass(line: str) -> bool:
    """A ``pass`` line with no action (the daemon's debug line of a resync that did nothing)."""
    if '"event": "pass"' not in line:
        return False
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("event") == "pass" and not doc.get("actions")
