"""The gate an engine's process passes before it execs the engine: its spawn note first.

``spawn`` (``LocalBackend.spawn``'s fork and exec) forks this script (``python -I -S``,
stdlib only: it runs by its path, with no package on ``sys.path``), has the caller write
the spawn note of its pid, and only then sends it the engine's argv and environment; the
gate execs them in place (same pid, same start time: the note names the engine). A pass
SIGKILLed before the send leaves a gate that reads end-of-file and exits: no engine ever
runs that no note names (a note is how a pass that may not read a non-dumpable engine's
environment finds it, ``store/instances/spawnnotes.py``). Writing the note in the child
itself would be a preexec_fn, unsafe in the threaded daemon. The gate's own environment
carries no marker, so no scan takes a waiting gate for an engine. It costs each spawn
one interpreter start: with nothing imported but ``os`` and ``sys`` (json, subprocess and
contextlib were half the gate's CPU, ~8 ms of each engine's start on an idle box).

Run as ``execgate.py GO STATUS``: GO, the fd the spawn writes the argv's length, the argv
and the environment (``KEY=VALUE``) to, NUL-separated, and closes; STATUS, the fd that
reads end-of-file once the exec succeeded, else the exec's ``errno strerror``.
"""

from __future__ import annotations

import errno
import os
import sys

TYPE_CHECKING = False  # as typing's, without its import (typing brings re, collections)
if TYPE_CHECKING:  # the spawn's side only: the gate imports nothing it does not run
    import subprocess
    from collections.abc import Callable, Mapping, Sequence

NOT_TOLD = 125  # the spawn sent nothing: its pass is gone, and so is the engine
NO_EXEC = 127  # as a shell says of a command it cannot run


class ExecRefused(OSError):
    """The gate's exec of the engine's program failed (its errno and words): the
    program's own failure, told apart from a spawn refused before any gate ran."""


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    before_exec: Callable[[int], None],
    gate_env: Mapping[str, str],
    log_fd: int,
    preexec: Callable[[], None] | None,
) -> subprocess.Popen[bytes]:
    """``argv`` exec'd with ``env`` in a new session, its output to ``log_fd``, once
    ``before_exec`` (given the pid the engine will have) has returned. OSError, as
    Popen raises it, when the spawn fails; ExecRefused when the exec itself does."""
    import subprocess

    told = _wire(argv, env)  # refused here, before anything runs
    go_read, go = os.pipe()
    status, status_write = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, str(go_read), str(status_write)],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            env=dict(gate_env),
            start_new_session=True,
            close_fds=True,
            pass_fds=(go_read, status_write),
            preexec_fn=preexec,
        )
    except BaseException:
        os.close(go)
        os.close(status)
        raise
    finally:
        os.close(go_read)
        os.close(status_write)
    return _exec(child, told, before_exec=before_exec, go=go, status=status)


def unrunnable(program: str, env: Mapping[str, str]) -> str | None:
    """Why the gate's exec of ``program`` with ``env`` would fail, as its ``strerror``
    says it ("No such file or directory", "Permission denied"), found as ``os.execvpe``
    finds it: a name with a slash as is, a bare name on ``env``'s PATH (else the default).
    None where it would run, or where this process cannot know (a relative path, or a
    relative PATH entry: another working directory's; a file exec refuses for its format)."""
    if "/" in program:
        return None if not os.path.isabs(program) else _refusal([program])
    folders = os.get_exec_path(dict(env))
    if not all(os.path.isabs(folder) for folder in folders):
        return None
    return _refusal([os.path.join(folder, program) for folder in folders])


def _refusal(candidates: list[str]) -> str | None:
    """None if one of ``candidates`` is a file this user may exec; else exec's words for
    the first that exists (execvpe's EACCES), else "No such file or directory"."""
    if any(os.path.isfile(c) and os.access(c, os.X_OK) for c in candidates):
        return None
    if any(os.path.exists(c) for c in candidates):
        return os.strerror(errno.EACCES)
    return os.strerror(errno.ENOENT)


def _wire(argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """What the gate is told: the argv's length, the argv, then ``KEY=VALUE``s, joined by
    NULs, which none of them can hold (exec refuses one; so does a name with ``=``)."""
    named = [os.fsencode(k) for k in env]
    fields = [*map(os.fsencode, argv), *(os.fsencode(f"{k}={v}") for k, v in env.items())]
    if any(b"\0" in f for f in fields) or any(not k or b"=" in k for k in named):
        raise OSError(errno.EINVAL, "a NUL byte in an argument or variable, or '=' in a name")
    return b"\0".join([str(len(argv)).encode(), *fields])


def _exec(
    child: subprocess.Popen[bytes],
    told: bytes,
    *,
    before_exec: Callable[[int], None],
    go: int,
    status: int,
) -> subprocess.Popen[bytes]:
    """Tell the waiting gate what to exec, once ``before_exec`` is done; its answer."""
    sent = False
    with os.fdopen(status, "rb") as answer:
        with os.fdopen(go, "wb") as pipe:  # closed unsent if before_exec raises: no exec
            before_exec(child.pid)
            try:
                pipe.write(told)
                sent = True
            except BrokenPipeError:  # the gate ended before it read
                pass
        said = answer.read().decode(errors="replace")
    if sent and not said:
        return child  # exec'd: the engine runs (or ran, and its exit is a crash) as ``child``
    child.wait()
    number, _, words = said.partition(" ")
    if number.isdigit():
        raise ExecRefused(int(number), words)
    raise OSError(f"the engine's process ended before its exec (exit {child.returncode})")


def _told(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as go:
        return go.read()


def main() -> int:
    go, status = int(sys.argv[1]), int(sys.argv[2])
    told = _told(go)
    if not told:
        return NOT_TOLD
    count, *fields = told.split(b"\0")
    argv = fields[: int(count)]
    env = dict(field.split(b"=", 1) for field in fields[int(count) :])
    os.set_inheritable(status, False)  # closed by a successful exec: the spawn's success
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(status, f"{exc.errno or 0} {exc.strerror or exc}".encode())
    return NO_EXEC


if __name__ == "__main__":
    sys.exit(main())
