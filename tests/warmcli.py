"""`python -m controller ARGS` started warm: forked from a process that has imported it.

Most of a short CLI call's CPU is the interpreter's start and the imports (~0.3 s for a
`--once`, of which its pass is ~0.01 s: benchmarks/RESULTS.md, "The suite's time"), and
the suite makes thousands of them. Each test worker keeps one *zygote*: a Python that
imported the CLI and waits on a unix socket. A call sends its argv, environment, working
folder and two open files (its stdout and stderr); the zygote forks a *keeper*, which
forks the call itself and reports its pid and then its exit status. The call runs
`controller/__main__.py` as `-m` would, with the call's environment, folder, argv and
`sys.path[0]`, in the test worker's process group (as a child of `subprocess.run` is:
the CLI never signals its own group), and ends as an interpreter does (its threads
joined, `atexit` run). The keeper kills it when the test gives up on it (a timeout) or
goes away.

A daemon is started the same way (``start``): in a process group of its own, as the
fixtures' ``process_group=0`` spawn gave it, and handed back as a :class:`Started` (a
``Popen``'s face) once forked. Its keeper holds it as a zombie once it has ended until
the test has its exit status, so its pid and group id name no other process meanwhile,
as a Popen child's do.

What a fork cannot give, the call refuses here and the caller starts it cold: an
environment differing from the zygote's where a difference is read at the interpreter's
start or at an import (``COLD``; the failpoints, read at an import, are armed again in
the fork). Tests that check the start itself (tests/test_imports.py,
the entry point, `--version`) run their own subprocess.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import pkgutil
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Read when the interpreter starts or a module is imported: a call that differs in one
# of these from the zygote's environment runs cold (libfaketime, /proc's use). The
# failpoints, read at an import too, are armed again in each call (``_as_started``).
COLD = (
    "LD_",
    "FAKETIME",
    "PYTHON",
    "TZ",
    "LANG",
    "LC_",
    "RECONCILE_PROCFS",
)
OFF = "RECONCILE_TEST_COLD_CLI"  # set (to anything): every call starts cold, as before
# Read at the interpreter's start, and done by the call itself as a start does.
AT_CALL = ("PYTHONFAULTHANDLER",)  # the gateway fixture's daemons: faulthandler on
# Not imported ahead: the Ray backend (ray's own start, seconds) and what runs apart.
NOT_AHEAD = ("controller.backends.ray", "controller.demo")


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(COLD) and k not in AT_CALL}


class Zygote:
    """One test worker's warm CLI (started at its first call, ended with the worker)."""

    def __init__(self, env: Mapping[str, str], prefix: Sequence[str] = ()) -> None:
        """``prefix``: what it runs under, e.g. ``unshare -U`` (its calls in that user
        namespace, as tests/reconciler/test_unreadable_engine.py's are)."""
        self.folder = Path(tempfile.mkdtemp(prefix="warmcli-"))
        self.socket = self.folder / "zygote.sock"
        self.startup = _startup_env(env)
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, __file__, str(self.socket)],
            stdin=subprocess.PIPE,  # its end is the zygote's: closed, it exits
            stdout=subprocess.DEVNULL,
            env=dict(env),
        )
        ready = self.proc.stdin and _wait_for(self.socket, self.proc)
        if not ready:
            raise RuntimeError(f"the warm CLI did not start (exit {self.proc.poll()})")

    def fits(self, env: Mapping[str, str]) -> bool:
        return _startup_env(env) == self.startup and self.proc.poll() is None

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """The call's ``CompletedProcess``, as ``subprocess.run(capture_output=True)``'s."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            code = self._call(argv, env, cwd, timeout, (out.fileno(), err.fileno()))
            return subprocess.CompletedProcess(list(argv), code, _read(out), _read(err))

    def start(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, fds: tuple[int, int]
    ) -> Started:
        """``argv`` in the background, in a process group of its own (the daemon)."""
        ask = {"argv": list(argv), "env": dict(env), "cwd": str(cwd), "background": True}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(self.socket))
            socket.send_fds(conn, [json.dumps(ask).encode() + b"\n"], list(fds))
            conn.settimeout(CLI_START)
            msg, pidfds, _, _ = socket.recv_fds(conn, 4096, 1)
            while b"\n" not in msg:
                more = conn.recv(4096)
                if not more:
                    raise RuntimeError(f"the warm CLI's keeper ended without a pid: {msg!r}")
                msg += more
        except BaseException:
            conn.close()
            raise
        line, rest = msg.split(b"\n", 1)
        return Started(argv, conn, int(json.loads(line)["pid"]), pidfds[0], rest)

    def _call(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        timeout: float,
        fds: tuple[int, int],
    ) -> int:
        ask = json.dumps({"argv": list(argv), "env": dict(env), "cwd": str(cwd)}).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(self.socket))
            socket.send_fds(conn, [ask + b"\n"], list(fds))
            conn.settimeout(timeout)
            try:
                return int(json.loads(_line(conn))["code"])
            except TimeoutError:
                conn.settimeout(10)
                conn.sendall(b"kill\n")  # the keeper kills it (its pidfd: never another)
                _line(conn)
                raise subprocess.TimeoutExpired(list(argv), timeout) from None

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            self.socket.unlink()
            self.folder.rmdir()


CLI_START = 60.0  # a keeper answers with the pid at once; generous under load


class Started:
    """A background call forked warm (``start``): what the tests use of a ``Popen``."""

    stdin = stdout = stderr = None

    def __init__(
        self, argv: Sequence[str], conn: socket.socket, pid: int, pidfd: int, rest: bytes
    ) -> None:
        self.args = list(argv)
        self.pid = pid
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._pidfd = pidfd
        self._rest = rest  # what came after the pid's line: the status's start, if any

    def poll(self) -> int | None:
        return self._ended(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._ended(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        """As ``Popen.send_signal``: nothing once it is known to have ended; by its pidfd,
        so never another process."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _ended(self, timeout: float | None) -> int | None:
        """Its exit status once it has ended (within ``timeout``), the keeper let go."""
        conn = self._conn
        if conn is None or (not self._rest and not select.select([conn], [], [], timeout)[0]):
            return self.returncode
        conn.settimeout(10)  # the whole line follows its first byte at once
        data = self._rest
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                raise RuntimeError(f"the warm CLI's keeper ended without a status: {data!r}")
            data += chunk
        self.returncode = int(json.loads(data)["code"])
        self._conn = None
        # Let go, and back once the keeper has reaped it (its end closes the socket): as
        # after a Popen's wait, the pid names nothing any more.
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(64):
            pass
        conn.close()
        os.close(self._pidfd)
        return self.returncode


def _line(conn: socket.socket) -> bytes:
    """One answer, whole (its newline), or what came before the keeper closed."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise RuntimeError(f"the warm CLI's keeper ended without an answer: {data!r}")
        data += chunk
    return data


def _read(file: Any) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> bool:
    """The zygote's socket there (it imports for a second or two), or its exit."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


_zygote: Zygote | None = None
_lock = threading.Lock()


def run(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str] | None:
    """``argv`` (``[python, "-m", "controller", ...]``) run warm, or None: run it cold."""
    zygote = _zygote_for(argv)
    if zygote is None or not zygote.fits(env):
        return None
    return zygote.run(argv, env=env, cwd=cwd, timeout=timeout)


def _zygote_for(argv: Sequence[str]) -> Zygote | None:
    """The worker's zygote (started at its first call), None for another command or off."""
    global _zygote
    if list(argv[:3]) != [sys.executable, "-m", "controller"] or os.environ.get(OFF):
        return None
    with _lock:
        if _zygote is None:
            _zygote = Zygote(
                {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
            )
            atexit.register(_zygote.close)
        return _zygote


def start(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, stdout: Any, stderr: Any
) -> Started | None:
    """``argv`` (``[python, "-m", "controller", ...]``) started warm in the background, in a
    process group of its own, or None: start it cold. ``stdout``/``stderr``: a file or
    ``subprocess.DEVNULL``."""
    zygote = _zygote_for(argv)
    if zygote is None or not zygote.fits(env):
        return None
    with contextlib.ExitStack() as files:
        fds = tuple(_fd(stream, files) for stream in (stdout, stderr))
        return zygote.start(argv, env=env, cwd=cwd, fds=(fds[0], fds[1]))


def _fd(stream: Any, files: contextlib.ExitStack) -> int:
    if stream == subprocess.DEVNULL:
        return files.enter_context(open(os.devnull, "wb")).fileno()
    return int(stream.fileno())


def run_or_cold(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout: float,
    cold: bool = False,
    new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``argv`` run warm where it can be (``run``), else (or ``cold``) as a process of its
    own; ``new_session``: a killpg() gone wrong can only hit the CLI itself."""
    proc = None if cold else run(argv, env=env, cwd=cwd, timeout=timeout)
    if proc is not None:
        return proc
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        start_new_session=new_session,
    )


def close() -> None:
    """The worker's zygote ended (at the session's end: before the check for children
    left running, tests/popens.py)."""
    global _zygote
    with _lock:
        if _zygote is not None:
            _zygote.close()
            _zygote = None


# -- the zygote's side ---------------------------------------------------------------


def _serve(path: str) -> None:
    _import_ahead()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers reaped as they end
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path + ".new")
        listener.listen(64)
        os.rename(path + ".new", path)  # there only once it answers
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [])
            if sys.stdin in ready:
                return  # the worker is gone (or done)
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _keep(conn)  # never returns
            conn.close()


def _import_ahead() -> None:
    """What a CLI call imports, imported once; structlog as the CLI imports it (without
    rich: controller/logsetup.py), before any module imports it plainly."""
    import controller
    from controller.logsetup import structlog_module

    structlog_module()
    for mod in pkgutil.walk_packages(controller.__path__, "controller."):
        if not mod.name.startswith(NOT_AHEAD) and not mod.name.endswith("__main__"):
            with contextlib.suppress(Exception):
                __import__(mod.name)
    gc.freeze()  # the imports' objects left alone by the forks' collections (no copies)


def _keep(conn: socket.socket) -> None:
    """The keeper: fork the call, say its pid, wait for it (or kill it), say its status."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
        while not msg.endswith(b"\n"):
            msg += conn.recv(1 << 20)
        ask = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _call(ask, fds)  # never returns
        for fd in fds:
            os.close(fd)
        if ask.get("background"):
            with contextlib.suppress(OSError):  # both sides: a group before either goes on
                os.setpgid(pid, pid)
            _hold(pid, conn)
            return
        code = _wait(pid, conn)
        conn.sendall(json.dumps({"code": code}).encode() + b"\n")
    finally:
        os._exit(0)


def _hold(pid: int, conn: socket.socket) -> None:
    """A background call: its pid and a pidfd sent at once, its status as it ends; its
    zombie reaped only once the test has read that and let go (or is gone), so that its
    pid and group id name it until then."""
    pidfd = os.pidfd_open(pid)
    socket.send_fds(conn, [json.dumps({"pid": pid}).encode() + b"\n"], [pidfd])
    ready, _, _ = select.select([pidfd, conn], [], [])
    if pidfd in ready:
        ended = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
        code = ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status
        conn.sendall(json.dumps({"code": code}).encode() + b"\n")
        select.select([conn], [], [])  # its end shut: the test has it
    else:  # the test is gone: as `_wait`, it goes too
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    os.waitpid(pid, 0)


def _wait(pid: int, conn: socket.socket) -> int:
    pidfd = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([pidfd, conn], [], [])
        if conn in ready:  # asked to kill it, or the test is gone
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            conn.recv(64)
        if pidfd in ready or conn in ready:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)


def _call(ask: dict[str, Any], fds: list[int]) -> None:
    """The call: `python -m controller` as a cold start runs it, then an interpreter's end."""
    code: Any = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if ask.get("background"):
            os.setpgid(0, 0)  # as spawn's process_group=0
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (fds[0], 1), (fds[1], 2)):
            os.dup2(fd, target)
        for fd in {devnull, *fds} - {0, 1, 2}:
            os.close(fd)  # only 0, 1 and 2, as a started interpreter has
        os.chdir(ask["cwd"])
        os.environ.clear()
        os.environ.update(ask["env"])
        _as_started()
        sys.argv = ["-m", *ask["argv"][3:]]
        sys.path.insert(0, ask["cwd"])  # `-m`'s first entry: the folder it started in
        runpy.run_module("controller", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    except BaseException:  # as an interpreter does: the traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    os._exit(_ended(code))


def _as_started() -> None:
    """What an interpreter's start does for the AT_CALL variables of the call's env, and
    the import of controller/failpoints.py for its RECONCILE_FAILPOINTS (a bad value ends
    the call with its traceback, as it ends a cold one)."""
    import faulthandler

    from controller import failpoints

    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(all_threads=True)  # on the call's stderr
    else:
        faulthandler.disable()
    failpoints.rearm()


def _ended(code: Any) -> int:
    """An interpreter's end: its threads joined, ``atexit`` run, the streams flushed."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    return int(code) & 0xFF


if __name__ == "__main__":
    sys.path.pop(0)  # tests/ is no import root of the CLI's
    _serve(sys.argv[1])
