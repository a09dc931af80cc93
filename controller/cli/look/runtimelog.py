"""The output of a container engine whose runtime's `run` ended while the container runs
on (killed by hand, an OOM kill of that client alone), for `reconcile logs`. The `run`
streamed the engine's output into its log file, which has had none since; the runtime
keeps all of it (`podman logs`, `docker logs`): the file is shown up to this run's
marker, then the runtime's log of the container (``replicalogs.ContainerLog``).
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
from collections.abc import Callable
from pathlib import Path

from controller.store.instances import logfiles

CALL_TIMEOUT = 30.0  # seconds for the runtime's `logs` of the output so far


def before_run(path: Path, nonce: str) -> list[bytes] | None:
    """The log file's lines up to and with the marker of instance ``nonce``'s run, its
    last (none where that marker rotated away); None: the last run is another's."""
    found = logfiles.runs(path)
    if not found:
        return None
    *before, current = found
    if not logfiles.is_marker(current[0]):
        return []  # its marker rotated away: the runtime's log is the whole run
    if f" instance {nonce}:".encode() not in current[0]:
        return None
    return [line for run in before for line in run] + [current[0]]


def so_far(argv: list[str]) -> bytes | str:
    """The container's output so far, as the runtime keeps it; else why it has none (the
    runtime's words: gone, or the runtime does not answer)."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # the engine's stderr: one stream, as in the file
            timeout=CALL_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return f"no answer in {CALL_TIMEOUT:.0f} s"
    except OSError as exc:
        return exc.strerror or str(exc)
    if done.returncode == 0:
        return done.stdout
    said = done.stdout.decode(errors="replace").strip().splitlines()  # its error, last
    return said[-1] if said else f"exit {done.returncode}"


def unread(name: str, argv: list[str], why: str) -> str:
    """What `logs` says where the runtime's log of a container engine whose `run` ended
    cannot be read: the file alone is shown, which stops where that `run` ended (its
    shell's `Killed` last), though the engine may write on. It said nothing of it."""
    return (
        f"reconcile: {name}: `{' '.join(argv)}`: {why}: what the engine wrote since its "
        "container's `run` ended is not shown (the log file stops there)"
    )


def follow(
    argv: list[str],
    shown: int,
    write: Callable[[bytes], None],
    keep_going: Callable[[], bool],
    period: float,
) -> None:
    """What the container writes past the ``shown`` bytes of ``so_far``, until it ends
    (its `logs --follow` ends) or ``keep_going()`` says no: the runtime prints its log
    from its start again, and it reads the same each time, so those bytes are skipped."""
    with subprocess.Popen(
        [*argv[:2], "--follow", *argv[2:]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ) as proc:
        assert proc.stdout is not None
        try:
            while keep_going():
                if not select.select([proc.stdout], [], [], period)[0]:
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    return  # the container ended
                skipped = min(shown, len(chunk))
                shown -= skipped
                if chunk[skipped:]:
                    write(chunk[skipped:])
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # our own child, reaped as the `with` ends
