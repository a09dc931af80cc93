"""Running the ``git`` program for the git source: never a prompt, a limit on each
command, git's own words (no password) on failure, and no git left running when this
process is ended by a signal."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from urllib.parse import unquote, urlsplit, urlunsplit

from controller import failpoints
from controller.redact import printable

GIT_TIMEOUT = 300.0  # seconds a local git command (init, rev-parse, log) may take


class FetchGivenUp(Exception):
    """The fetch in flight was stopped, and is no failure: ``str()`` says why (the daemon
    is stopping, or a rollback's move goes first)."""


class GitFailed(Exception):
    """A git command failed: ``str()`` is git's own words (one line, no secret), or that
    it failed saying nothing (``silent``)."""

    def __init__(self, said: str, *, silent: bool = False, timed_out: bool = False) -> None:
        super().__init__(said)
        self.silent = silent
        self.timed_out = timed_out  # stopped at its limit


def git(
    repo: Path,
    *args: str,
    timeout: float = GIT_TIMEOUT,
    hold: int | None = None,
    started: Callable[[int], None] | None = None,
    stdin: str | None = None,
) -> str:
    """Run git in ``repo``; never a prompt (a cron or a daemon has no terminal).

    ``hold``: the git.lock descriptor, inherited by git: a git whose parent was killed
    still holds the checkout until it ends, so the next daemon never runs a second git
    (or removes a live git's ``index.lock``) beside it, and stops it rather than wait on
    it (git/orphan.py). ``started``: told git's pid (its process group's too), for a
    caller that may have to stop it (a signal handler; the next pass, should we die).
    ``stdin``: given to git (``update-ref --stdin``), else git reads nothing."""
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",  # a missing password is a failure, not a hang
        "LC_ALL": "C",  # git's words, as the user would search for them
        "GIT_CONFIG_NOSYSTEM": os.environ.get("GIT_CONFIG_NOSYSTEM", "0"),
        # Never the repository around ours: with the checkout's .git gone (a hand, a disk),
        # git looked upwards, and a state dir inside a clone (a dotfiles home, the
        # manifests' own repository) had its move (`checkout --force`, `clean`) run there.
        "GIT_CEILING_DIRECTORIES": os.path.realpath(Path(repo).parent),
    }
    verb = _verb(args)
    args, credentials = _credentials_apart(args, env)
    env.update(credentials)
    cmd = ["git", "-C", str(repo), "-c", "gc.auto=0", "-c", "advice.detachedHead=false", *args]
    with _dies_with_us() as keep:  # before git exists: a signal in between ends it too
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            env=env,
            start_new_session=True,  # a timeout kills git's helpers (ssh, remote-https) too
            text=True,
            errors="replace",
            pass_fds=() if hold is None else (hold,),
        )
        try:
            keep(proc)
            if started is not None:  # inside: a Ctrl-C while it is told ends git too
                started(proc.pid)
            if verb == "fetch":
                failpoints.hit("git.fetch.running")
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise GitFailed(
                f"git {verb} took more than {timeout:g}s (stopped)", timed_out=True
            ) from None
        except BaseException:
            # Ctrl-C (KeyboardInterrupt): git is in a session of its own, so the terminal's
            # SIGINT never reaches it, and once we are gone nothing would time it out: a
            # fetch from a remote that never answers would hold git.lock for good, and
            # every later pass would wait on it. A git cut short leaves what a SIGKILL does.
            _kill(proc)
            raise
    if proc.returncode != 0:
        said = _words(err)
        raise GitFailed(said or f"git {verb} exited {proc.returncode}", silent=not said)
    return out.strip()


@contextlib.contextmanager
def _dies_with_us() -> Iterator[Callable[[subprocess.Popen[str]], None]]:
    """A SIGTERM or SIGHUP that ends this process as it stands (no handler of its own:
    `--once` under cron's `timeout`, a closed ssh session; the daemon has its own) ends
    git first, in its session of its own, which would otherwise go on without us. Taken
    before git is started, and given git (``keep``) once it is: a signal between the two
    (git already forked) was the default's, and git went on fetching (CI: FLAKY). A Ctrl-C
    (KeyboardInterrupt) in that window is held back to ``keep`` too: raised inside
    Popen, after its fork, it left git fetching with no one to stop it (CI: FLAKY)."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda proc: None
        return
    running: list[subprocess.Popen[str]] = []
    caught: list[int] = []

    def end_both(signum: int, frame: FrameType | None) -> None:
        if running:
            _die(running[0], signum)
        caught.append(signum)  # git is being started: ended as soon as it is

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if running:  # the caller's `except BaseException` stops git
            raise KeyboardInterrupt
        caught.append(signum)  # git is being started: raised once it is kept

    def keep(proc: subprocess.Popen[str]) -> None:
        running.append(proc)
        if caught:
            _end(proc, caught[0])

    fatal = (signal.SIGTERM, signal.SIGHUP)
    handlers: dict[int, Callable[[int, FrameType | None], None]] = {
        s: end_both for s in fatal if signal.getsignal(s) is signal.SIG_DFL
    }
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        handlers[signal.SIGINT] = interrupt
    before = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield keep
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if caught and not running:  # git never started (Popen failed): ended by it all the same
            _end(None, caught[0])


def _end(proc: subprocess.Popen[str] | None, signum: int) -> None:
    """Act on a signal held back while git was being started: a Ctrl-C is raised (the
    caller's handler stops git), a SIGTERM or SIGHUP ends git and this process."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if proc is None:
        os.kill(os.getpid(), signum)
    else:
        _die(proc, signum)


def _die(proc: subprocess.Popen[str], signum: int) -> None:
    """End git's process group, then this process by ``signum``, as it would have been."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _kill(proc: subprocess.Popen[str]) -> None:
    """Stop git and its helpers (ssh, remote-https: its process group), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


# The password of a git source's URL that names its user alone (`https://USER@HOST/REPO`),
# from reconcile's environment (a systemd EnvironmentFile of mode 0600): on no command
# line. Its helper (below) reads it there.
PASSWORD_VARIABLE = "RECONCILE_GIT_PASSWORD"

# git's credential helper protocol, answered from git's environment: the only helper asked
# (the empty one first clears the user's), as a URL's own user and password were.
_HELPER = (
    '!f() { test "$1" = get && printf "username=%s\\npassword=%s\\n"'
    ' "$RECONCILE_GIT_USERNAME" "$RECONCILE_GIT_PASSWORD"; }; f'
)


def _credentials_apart(
    args: tuple[str, ...], environ: Mapping[str, str]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """``args`` with an http(s) URL's ``user:password@`` (or ``user@``, the password then
    ``RECONCILE_GIT_PASSWORD``'s where ``environ`` has it) taken out, and the
    environment that gives them to git through its credential helper. In the URL they were
    on the command line of git and of its git-remote-https for the whole fetch, which every
    local user reads (`ps`, /proc/PID/cmdline); a process's environment only its own user
    and root may read. ``environ``: the one git runs with (its own config there kept)."""
    out, env, user_only = [], {}, False
    for arg in args:
        try:
            parts = urlsplit(arg)
        except ValueError:
            parts = None
        if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.username:
            out.append(arg)
            continue
        env["RECONCILE_GIT_USERNAME"] = unquote(parts.username)
        # A URL with its user alone takes the password from our environment when it has
        # one: the secret is then on no command line, not even the daemon's `--git`.
        given = environ.get(PASSWORD_VARIABLE, "") if parts.password is None else ""
        env[PASSWORD_VARIABLE] = unquote(parts.password or "") or given
        user_only = parts.password is None and not given
        out.append(urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])))
    if not env:
        return args, env
    if user_only:
        return ("-c", f"credential.helper={_HELPER}", *out), env | _user_known(env, environ)
    return ("-c", "credential.helper=", "-c", f"credential.helper={_HELPER}", *out), env


def _user_known(env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """A URL's user with no password (a token as the user, `https://TOKEN@host/...`, or a
    user whose password the user's own credential helper keeps, as Bitbucket's URLs name
    one): git's ``credential.username``, set in its environment (never its command line),
    so the user's helpers are asked for that user as before, and ours, asked last, answers
    an empty password where none of theirs knows one."""
    try:
        count = int(environ.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        count = 0
    return {
        "GIT_CONFIG_COUNT": str(count + 1),
        f"GIT_CONFIG_KEY_{count}": "credential.username",
        f"GIT_CONFIG_VALUE_{count}": env["RECONCILE_GIT_USERNAME"],
    }


def _verb(args: tuple[str, ...]) -> str:
    """The git command ``args`` run (``verify-commit``), past their ``-c`` settings."""
    rest = args
    while rest[:1] == ("-c",):
        rest = rest[2:]
    return rest[0] if rest else ""


def _words(stderr: str) -> str:
    """git's first error lines, joined, with any URL's password taken out and each control
    character escaped: part of them are the remote's (``remote: ...``, an ssh helper's),
    shown by every view and stored in the state dir, never acted on by a terminal."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    text = "; ".join(lines[:4])  # the first is the specific one; then git's advice
    return printable(re.sub(r"(\w+://)[^/@\s]+@", r"\1", text), keep="\t")
