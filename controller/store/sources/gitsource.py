"""The git source: a checkout of a branch (or tag) that reconcile owns under the state dir.

``reconcile --git URL [--branch B | --tag T] [--git-path P] [--interval 1m]
[--git-timeout 60s]`` (or the ``git:`` section of node.yaml). The checkout is fetched
when due (every ``interval``, at once on a webhook, each ``--once``; one fetch may take
``timeout``) under git.lock alone, beside the passes (the daemon's fetch thread) or
before one (``--once``); the pass moves it to the remote's commit (:meth:`GitSource.apply`,
under the pass lock and git.lock) and applies the manifests there.

Why the ``git`` program and not a library (dulwich, pygit2): credentials are git's own
(credential helpers, ``GIT_SSH_COMMAND``, ``~/.ssh`` keys and ``known_hosts``,
``insteadOf`` rewrites) and work exactly as they do for the user's own ``git fetch``;
shallow fetches (``--depth``) of large histories and ``verify-commit`` come with it; and
it is on every machine that has a repository to follow. A fetch runs every ``interval``,
not every pass, so the cost of a process is nothing.

Safety: the checkout is never merged into and never edited; a move is ``checkout --force
--detach SHA`` then ``clean -ffdx``, and a marker file written before it says a move was
under way: a SIGKILL mid-fetch or mid-move leaves the marker (and maybe git's
``*.lock`` files, which are ours to remove while we hold ``git.lock``), and the next sync
moves again from the start (a pass finding it fetches and moves before it reads); a
git the killed reconcile left running is stopped by the next holder of git.lock
(gitorphan.py). A failed fetch changes nothing on disk but the status: the
last applied commit keeps running and nothing is pruned.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from controller import failpoints
from controller.errors import ConfigError
from controller.logsetup import get_logger
from controller.store import sidefiles
from controller.store.documents import Document
from controller.store.lock import FileLock
from controller.store.sources import gitorphan
from controller.store.statedir import StateDir

if TYPE_CHECKING:
    from controller.core.state import Record
    from controller.store.sources.manifests import ManifestError

log = get_logger("reconcile")

DEFAULT_INTERVAL = 60.0  # seconds between fetches (Flux's GitRepository default is 1m)
DEPTH = 50  # commits fetched: enough history for `history` and rollbacks, not the whole past
# Seconds one fetch may take before it counts as failed (--git-timeout, git.timeout): Flux's
# GitRepository spec.timeout default. The fetch holds git.lock this long, not the pass
# lock: passes go on meanwhile on the commit applied (a --once waits for it, to fetch).
DEFAULT_TIMEOUT = 60.0
GIT_TIMEOUT = 300.0  # seconds a local git command (init, rev-parse, log) may take
MOVE_WAIT = 60.0  # seconds, past the holder's fetch limit, to wait for git.lock (its move)
RETRY_FIRST = 5.0  # seconds before the first retry of a failed fetch, doubling ...
RETRY_MAX = 300.0  # ... up to this (or the interval, when shorter)
INVALID_KEPT = 20  # manifest errors the source file keeps (`reconcile validate` lists all)
SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")

# States of `reconcile source` (DESIGN.md "Following git").
SYNCED, PROGRESSING, DEGRADED = "Synced", "Progressing", "Degraded"
PULL_FAILED, PINNED, UNVERIFIED = "PullFailed", "Pinned", "Unverified"
STATES = (SYNCED, PROGRESSING, DEGRADED, PULL_FAILED, PINNED, UNVERIFIED)
FAILING = frozenset({PULL_FAILED, DEGRADED, UNVERIFIED})  # `--once` exits 1


@dataclass(frozen=True, kw_only=True, slots=True)
class GitSettings:
    url: str
    branch: str | None = None  # None with a tag; "main" when neither was given
    tag: str | None = None
    path: str = "."
    interval: float = DEFAULT_INTERVAL
    timeout: float = DEFAULT_TIMEOUT  # one fetch's limit
    webhook_secret_file: str | None = None
    allowed_signers: str | None = None  # verify.allowedSigners: only commits signed so apply
    progress_deadline: float | None = None  # autoRollback.progressDeadline, in seconds
    owned_as: str | None = None  # --owner: the name its records carry instead of the URL's

    @property
    def ref(self) -> str:
        """The remote ref fetched, and where it is kept locally."""
        return f"refs/tags/{self.tag}" if self.tag else f"refs/heads/{self.branch or 'main'}"

    @property
    def tracking(self) -> str:
        return f"refs/tags/{self.tag}" if self.tag else f"refs/remotes/origin/{self.branch}"

    @property
    def owner(self) -> str:
        """``git:<url>#<path>``: the same whatever the checkout's place or the daemon's pid
        (``--owner`` where given: the source's state then judges that owner's records)."""
        return self.owned_as or f"git:{shown_url(self.url)}#{self.path}"


def settings(
    *,
    url: str,
    branch: str | None,
    tag: str | None,
    path: str | None,
    interval: float | None,
    timeout: float | None = None,
    webhook_secret_file: str | None = None,
    allowed_signers: str | None = None,
    progress_deadline: float | None = None,
) -> GitSettings:
    """Checked settings; the errors name the flag or key and the next move."""
    if branch and tag:
        raise ConfigError("git: give a branch or a tag, not both (--branch / --tag)")
    if not url.strip():
        raise ConfigError("git: the repository URL is empty (--git URL or git.url)")
    clean = normal_path(path or ".")
    if interval is not None and interval <= 0:
        raise ConfigError(f"git: interval must be more than 0 seconds, not {interval:g}")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"git: timeout must be more than 0 seconds, not {timeout:g}")
    return GitSettings(
        url=url.strip(),
        branch=None if tag else (branch or "main"),
        tag=tag,
        path=clean,
        interval=interval or DEFAULT_INTERVAL,
        timeout=timeout or DEFAULT_TIMEOUT,
        webhook_secret_file=webhook_secret_file,
        allowed_signers=str(Path(allowed_signers).expanduser()) if allowed_signers else None,
        progress_deadline=progress_deadline,
    )


def local_repo(url: str, base: Path) -> str:
    """A repository given as a path (git's local transport: no ``scheme://``, no ``host:``
    before the first ``/``), made absolute from ``base``: `git clone ../ops.git` takes it
    from where it is typed, but the node's git runs in its checkout (``git -C``), where a
    relative path named nothing ("does not appear to be a git repository")."""
    colon, slash = url.find(":"), url.find("/")
    if not url.strip() or "://" in url or (colon >= 0 and not 0 <= slash < colon):
        return url  # none (settings says so), a URL, or scp-like ssh (host:path)
    path = Path(url).expanduser()
    return str(path) if path.is_absolute() else os.path.normpath(base.absolute() / path)


def normal_path(path: str) -> str:
    """``manifests/`` and ``./manifests`` are one path; none may climb out of the checkout."""
    parts = [p for p in path.strip().split("/") if p not in ("", ".")]
    if ".." in parts or path.startswith("/"):
        raise ConfigError(
            f"git path {path!r} must be relative, inside the repository (e.g. manifests)"
        )
    return "/".join(parts) or "."


def shown_url(url: str) -> str:
    """The URL without a user:password (a token in an https URL is never shown or stored)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))


def same_repository(url: str) -> str:
    """One spelling per repository, for telling two spellings apart, never for fetching:
    a path and its ``file://`` URL, a trailing ``.git`` or ``/``, ``host:path`` and
    ``ssh://host/path``, the scheme's and host's case and the user are one repository, as
    Argo CD and Flux compare repository URLs. Without it a URL spelled anew made a new
    owner, and every deployment of the source a conflict with itself."""
    text = shown_url(url.strip())
    colon, slash = text.find(":"), text.find("/")
    if "://" not in text:
        if colon >= 0 and not 0 <= slash < colon:  # scp-like ssh: [user@]host:path
            host, _, path = text.partition(":")
            text = f"ssh://{host}/{path.lstrip('/')}"
        else:  # a path (made absolute by ``local_repo``)
            text = "file://" + os.path.normpath(text)
    parts = urlsplit(text)
    path = parts.path.rstrip("/").removesuffix(".git").rstrip("/")
    host = parts.netloc.rpartition("@")[2].lower()
    return urlunsplit((parts.scheme.lower(), host, path, parts.query, ""))


def _owner_key(owner: str) -> tuple[str, str] | None:
    """``git:<url>#<path>``'s repository and path (None: another owner, ``--owner``'s)."""
    if not owner.startswith("git:") or "#" not in owner:
        return None
    url, _, path = owner.removeprefix("git:").rpartition("#")
    return same_repository(url), path


def spelled_as_before(
    state_dir: Path, s: GitSettings, owners: Callable[[], Iterable[str]]
) -> GitSettings:
    """``s`` owned by the name the state dir already knows it by when it is the same
    repository and path spelled otherwise (``file://`` or a path, ``.git`` or not): the
    records made under the first spelling stay its own, nothing conflicts or is pruned.
    The name is ``source.json``'s, else one its records carry (``owners``, read only when
    ``source.json`` names another source: a source followed again after another, whose
    name the file no longer holds, is known by its records)."""
    if s.owned_as is not None:
        return s
    key = _owner_key(s.owner)
    old = _remembered_owner(state_dir)
    if old == s.owner:
        return s
    if old is not None and _owner_key(old) == key:
        return replace(s, owned_as=old)
    known = {owner for owner in owners() if _owner_key(owner) == key}
    if not known or s.owner in known:
        return s
    return replace(s, owned_as=min(known))  # one name for every call (several: a conflict)


def _remembered_owner(state_dir: Path) -> str | None:
    if not StateDir(state_dir).git_source.exists():
        return None
    try:
        old = peek_status(state_dir)
    except ConfigError:
        return None  # `reconcile source` says what is wrong with the file
    return None if old is None else old.owner


# -- the state dir's files ----------------------------------------------------------------


def checkout_dir(state_dir: Path) -> Path:
    return StateDir(state_dir).git_checkout


def manifests_dir(state_dir: Path, path: str) -> Path:
    top = checkout_dir(state_dir)
    return top if path == "." else top / path


def checkout_lock(state_dir: Path) -> FileLock:
    """Held while the checkout is fetched or moved, or its pin changed (``rollback``)."""
    return FileLock(StateDir(state_dir).git_lock, what="git checkout lock")


@dataclass(kw_only=True)
class SourceStatus:
    """``<state>/git/source.json``: the source followed and what became of it."""

    url: str
    branch: str | None
    tag: str | None
    path: str
    interval: float
    owner: str
    timeout: float = DEFAULT_TIMEOUT  # one fetch's limit: a --once with no flag takes it
    fetched: str | None = None  # the remote's commit at the last successful fetch
    applied: str | None = None  # the commit the checkout is at (what the node runs)
    last_fetch_at: str | None = None  # the last fetch that succeeded
    last_applied_at: str | None = None
    last_try_at: str | None = None
    fetch_error: str | None = None  # git's words, when the last fetch failed
    failures: int = 0  # fetches failed in a row
    next_fetch_at: float = 0.0  # wall clock (epoch seconds)
    pinned: str | None = None
    by: str = "poll"  # what started the last fetch: poll, webhook, start
    webhook_secret_file: str | None = None  # a path (never the secret): the gateway reads it
    unverified: str | None = None  # why the commit to apply was refused (verify.allowedSigners)
    auto_pinned: bool = False  # the pin is autoRollback's: a newer commit lifts it
    # What kept the manifests at ``invalid_at`` (the applied commit, at the pass that read
    # them) from being applied whole: each error in words, its file named as in the
    # repository (a file that did not load, a folder missing or empty).
    invalid: list[str] = field(default_factory=list)
    invalid_at: str | None = None
    # A move that failed (``move_target`` not in the checkout, or git could not check it
    # out): tried again after a back-off (``next_move_at``), not at every pass, and said
    # once; the pin it may be stands, and the fetches go on.
    move_error: str | None = None
    move_target: str | None = None
    move_failures: int = 0  # moves to ``move_target`` failed in a row
    next_move_at: float = 0.0  # wall clock (epoch seconds)

    def names(self) -> tuple[str, str | None, str | None, str]:
        """What makes it one source: another url, ref or path starts its state afresh."""
        return (same_repository(self.url), self.branch, self.tag, self.path)

    @property
    def target(self) -> str | None:
        """The commit to apply: the pin, else the last fetched."""
        return self.pinned or self.fetched

    @property
    def stuck_move(self) -> str | None:
        """Why the commit to apply is not checked out, when its move failed (None: it did
        not, or it was for another commit than the one to apply now)."""
        return self.move_error if self.move_target == self.target else None

    def move_waits(self, target: str) -> bool:
        """A move to ``target`` failed, and waits out its back-off."""
        return self.move_target == target and time.time() < self.next_move_at

    def said(self) -> str:
        ref = f"tag {self.tag}" if self.tag else f"branch {self.branch}"
        return f"{self.url} {ref} path {self.path}"

    @classmethod
    def fresh(cls, s: GitSettings) -> SourceStatus:
        return cls(
            url=shown_url(s.url),
            branch=s.branch,
            tag=s.tag,
            path=s.path,
            interval=s.interval,
            owner=s.owner,
            timeout=s.timeout,
            webhook_secret_file=s.webhook_secret_file,
        )


def _decode_status(data: Any) -> SourceStatus:
    if not isinstance(data, dict):
        raise ValueError(f"a {type(data).__name__}, not an object")
    known = set(SourceStatus.__dataclass_fields__)
    return SourceStatus(**{k: v for k, v in data.items() if k in known})  # TypeError: set aside


def _status(state_dir: Path) -> Document[SourceStatus]:
    state = StateDir(state_dir)
    return Document(state, state.git_source, _decode_status, asdict, indent=1)


def read_status(state_dir: Path) -> SourceStatus | None:
    """The remembered source, or None when this state dir follows no git source (a torn
    file is quarantined, named, and read as none: the next sync writes it again)."""
    return _status(state_dir).read()


def peek_status(state_dir: Path) -> SourceStatus | None:
    """The remembered source, read and never set aside (the page, `status`, `source`: a
    torn file is a pass's to quarantine, and reads as none here until it is written again)."""
    return _status(state_dir).peek()


def followed_instead(state_dir: Path, s: GitSettings) -> SourceStatus | None:
    """The source this state dir follows when it is not ``s`` (None: ``s``, or none)."""
    old = peek_status(state_dir)
    if old is None or old.names() == SourceStatus.fresh(s).names():
        return None
    return old


def write_status(state_dir: Path, status: SourceStatus) -> None:
    _status(state_dir).write(status)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- git itself ---------------------------------------------------------------------------


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
    it (gitorphan.py). ``started``: told git's pid (its process group's too), for a
    caller that may have to stop it (a signal handler; the next pass, should we die).
    ``stdin``: given to git (``update-ref --stdin``), else git reads nothing."""
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",  # a missing password is a failure, not a hang
        "LC_ALL": "C",  # git's words, as the user would search for them
        "GIT_CONFIG_NOSYSTEM": os.environ.get("GIT_CONFIG_NOSYSTEM", "0"),
    }
    cmd = ["git", "-C", str(repo), "-c", "gc.auto=0", "-c", "advice.detachedHead=false", *args]
    verb = _verb(args)
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
    (git already forked) was the default's, and git went on fetching (CI: FLAKY)."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda proc: None
        return
    running: list[subprocess.Popen[str]] = []
    caught: list[int] = []

    def end_both(signum: int, frame: FrameType | None) -> None:
        if running:
            _die(running[0], signum)
        caught.append(signum)  # git is being started: ended as soon as it is

    def keep(proc: subprocess.Popen[str]) -> None:
        running.append(proc)
        if caught:
            _die(proc, caught[0])

    fatal = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is signal.SIG_DFL]
    for sig in fatal:
        signal.signal(sig, end_both)
    try:
        yield keep
    finally:
        for sig in fatal:
            signal.signal(sig, signal.SIG_DFL)
        if caught:  # git never started (Popen failed): killed by it all the same
            os.kill(os.getpid(), caught[0])


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


def _next_move(exc: GitFailed, s: GitSettings) -> GitFailed:
    """A failed fetch in git's words, and what to do where they do not say it."""
    if exc.timed_out:  # a slow remote needs a longer limit
        return GitFailed(
            f"{exc}: the remote did not answer in time; if it is slow, not down,"
            " raise the limit (--git-timeout, or git.timeout in node.yaml)"
        )
    if "couldn't find remote ref" in str(exc):
        kind, name = ("tag", s.tag) if s.tag else ("branch", s.branch)
        return GitFailed(
            f"{exc}: the {kind} {name} is not on the remote (deleted, renamed, or a typo):"
            f" push it again, or follow another (--{kind}, git.{kind} in node.yaml)"
        )
    return exc


def _verb(args: tuple[str, ...]) -> str:
    """The git command ``args`` run (``verify-commit``), past their ``-c`` settings."""
    rest = args
    while rest[:1] == ("-c",):
        rest = rest[2:]
    return rest[0] if rest else ""


def _words(stderr: str) -> str:
    """git's first error lines, joined, with any URL's password taken out."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    text = "; ".join(lines[:4])  # the first is the specific one; then git's advice
    return re.sub(r"(\w+://)[^/@\s]+@", r"\1", text)


# -- the source ---------------------------------------------------------------------------


@dataclass
class SyncResult:
    revision: str | None  # the source's commit checked out now (None: none of its yet)
    fetched: bool = False
    moved: bool = False
    error: str | None = None
    events: list[str] = field(default_factory=list)
    move_failed: str | None = None  # a move's first failure for its commit: said once

    def add(self, later: SyncResult) -> None:
        """A later fetch's news after this one's: its error says how fetching goes now."""
        self.fetched |= later.fetched
        self.error = later.error
        self.events += later.events


class GitSource:
    """The checkout: fetched when due (:meth:`fetch_when_due`, under git.lock alone), moved
    to the commit to apply by the pass (:meth:`apply`, under the pass lock too).

    The fetch holds no pass: a remote that hangs holds git.lock for the fetch's limit, and
    meanwhile passes run on the commit applied (restarts, probes, other sources, `down`),
    as Flux's kustomize-controller applies the last artifact its source-controller made.
    The work tree changes only in a move, under both locks: a pass (or `down`) never reads
    it half-moved, and a fetch writes only git's objects and refs (``source``, ``history``
    and ``rollback`` read those, and the status, which is written whole)."""

    def __init__(
        self,
        state_dir: Path,
        s: GitSettings,
        *,
        always_fetch: bool = True,
        identify: gitorphan.Identify | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.settings = s
        # The first sync of a process fetches (a --once, a daemon's start); later ones when
        # due (the interval, a retry's back-off, a webhook): never every pass.
        self.always_fetch = always_fetch
        # A rollback's own pass: it moves to a commit the checkout holds, and fetches
        # nothing (a remote that hangs is no wait: the next --once or daemon fetches).
        self.moves_only = False
        self.repo = checkout_dir(state_dir)
        self.marker = StateDir(state_dir).git_moving
        self._fetch_pid: int | None = None  # the fetch's git in flight (its collection's too)
        self._giving_up = False  # the daemon is stopping: no fetch now
        self._making_way = False  # a rollback's move waits: the fetch in flight stops
        # Process identities (host.procs.live_identity): each git started under git.lock is
        # written down, and one a killed reconcile left holding it is stopped. None: neither.
        self.identify = identify
        # What the fetches since the last apply brought (the daemon fetches on a thread of
        # its own: its next pass reports them)
        self._news = SyncResult(revision=None)
        self._news_lock = threading.Lock()

    def give_up_fetch(self) -> None:
        """The daemon is stopping (its SIGTERM handler): a fetch in flight is stopped, and
        none starts. A silent remote (a firewall dropping packets) would otherwise hold the
        stop for the fetch's limit (``timeout``: 60 s by default, maybe more), past
        systemd's TimeoutStopSec, whose SIGKILL would leave the git running."""
        self._giving_up = True
        self._kill_fetch()

    def make_way(self) -> None:
        """A rollback's pin waits for its move (``pin_waits``): the fetch in flight (the
        daemon's thread's) is stopped, as no failure, and the next fetch follows the move.

        Why stop it rather than wait: `reconcile rollback` (or autoRollback) is the
        operator's "back to what worked, now", as Argo CD's rollback syncs the revision its
        history names and Flux applies the artifact it already has, neither waiting on the
        repository; a remote that hangs is often part of the outage being rolled back.
        The target is a commit the checkout holds, so the move needs no fetch, and a
        fetch lost costs only its retry: stopping it keeps one git at a time in the
        checkout (git.lock), where running the move beside it would not."""
        self._making_way = True
        self._kill_fetch()

    def _kill_fetch(self) -> None:
        if self._fetch_pid is not None:  # ours: its process group, ended once it is reaped
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._fetch_pid, signal.SIGKILL)

    def _stopped(self) -> str | None:
        """Why the fetch in flight is to stop (None: it goes on)."""
        if self._giving_up:
            return "the daemon is stopping"
        return "a rollback's move goes first" if self._making_way else None

    def _fetch_started(self, pid: int, verb: str = "fetch") -> None:
        self._fetch_pid = pid
        if self._stopped():  # the stop came between the check and the spawn
            self._kill_fetch()
        self._started(pid, verb)

    def _collection_started(self, pid: int) -> None:
        self._fetch_started(pid, gitorphan.HOUSEKEEPING)

    def _started(self, pid: int, verb: str = "") -> None:
        """A git started under git.lock: written down, to be stopped should we die (or,
        a collection, by a rollback that waits for the checkout)."""
        if self.identify is not None:
            gitorphan.note(self.state_dir, pid, self.identify, verb=verb)

    @contextlib.contextmanager
    def hold(
        self, waiting: Callable[[FileLock], None] | None = None, *, rollback: bool = False
    ) -> Iterator[FileLock]:
        """git.lock, for a fetch or a move (its own descriptor: the daemon's fetch thread
        and its passes each take theirs). Held by a git whose reconcile died (gitorphan.py),
        at once or while we wait, that git is stopped; held by a live reconcile, it is
        waited for, ``waiting`` told so first. ``rollback``: a rollback's pin, which waits
        for no housekeeping: a collection (``git gc``) under the lock, anyone's, is stopped
        too, as the daemon's ``make_way`` stops its own (the next fetch collects again)."""
        lock = self._lock()
        clear = self._make_way_for_rollback if rollback else self._stop_orphan
        if not lock.try_acquire():
            if not clear() and waiting is not None:
                waiting(lock)
            lock.acquire(self.lock_wait, meanwhile=clear)
        try:
            yield lock
        finally:
            lock.release()

    def _lock(self) -> FileLock:
        sidefiles.folder_for_write(StateDir(self.state_dir).git)
        return checkout_lock(self.state_dir)

    def _make_way_for_rollback(self) -> bool:
        if self._stop_orphan():
            return True
        found = (
            None if self.identify is None else gitorphan.housekeeping(self.state_dir, self.identify)
        )
        if found is not None:
            gitorphan.stop_housekeeping(found)
        return found is not None

    def _stop_orphan(self) -> bool:
        """Whether a git a killed reconcile left holding git.lock was found, and stopped."""
        if self.identify is None:
            return False
        found = gitorphan.orphan(self.state_dir, self.identify)
        if found is not None:
            gitorphan.stop(found)
        return found is not None

    @property
    def manifests(self) -> Path:
        return manifests_dir(self.state_dir, self.settings.path)

    @property
    def lock_wait(self) -> float:
        """How long to wait for git.lock: another reconcile's fetch (its limit), then its move."""
        return self.settings.timeout + MOVE_WAIT

    def status(self) -> SourceStatus:
        return self._current(read_status(self.state_dir))

    def _current(self, old: SourceStatus | None) -> SourceStatus:
        fresh = SourceStatus.fresh(self.settings)
        if old is None or old.owner != fresh.owner:
            return fresh  # another source: its history of fetches is not this one's
        if old.names() != fresh.names():
            # Another branch or tag of the same repository and path (the same owner, the
            # same records): what it applied runs on until this ref's commit is fetched,
            # as Flux serves the last artifact while a changed ref is fetched.
            return replace(fresh, applied=old.applied, last_applied_at=old.last_applied_at)
        return replace(
            old,
            interval=fresh.interval,
            owner=fresh.owner,
            timeout=fresh.timeout,
            webhook_secret_file=fresh.webhook_secret_file,
        )

    def change_status(self, change: Callable[[SourceStatus], object]) -> SourceStatus:
        """``source.json`` read, changed and written under its own lock (held for a read
        and a write, never across git): a fetch, a move, a pin and the pass's notes each
        change their own fields, and none loses another's."""

        def changed(old: SourceStatus) -> SourceStatus:
            st = self._current(old)  # a copy: the document writes only what changed
            change(st)
            return st

        fresh = SourceStatus.fresh(self.settings)
        return _status(self.state_dir).update(changed, fresh, "git source file lock")

    @property
    def current(self) -> bool:
        """The checkout is whole at the commit this source applied (another branch's of
        the same repository and path, until this one's is fetched): a pass may read it.
        Else nothing of it is read (a first start, another url or path than the last, a
        move cut short): the move comes first, and the fetch it may need."""
        st = self.status()
        return st.applied is not None and st.applied == self._head()

    def pin_waits(self) -> bool:
        """A rollback's pin is not yet the checkout's commit, and its move was never tried
        and failed: the emergency move goes first. One that failed (its commit in neither
        the checkout nor the branch fetched) waits for no fetch and stops none: it is
        tried again after a back-off, as a move to a fetched commit is."""
        st = self.status()
        return st.pinned is not None and st.pinned != self._head() and st.move_target != st.pinned

    def due_in(self, now: float | None = None) -> float:
        """Seconds until the next fetch is due (0: now)."""
        st = self.status()
        if self.always_fetch or StateDir(self.state_dir).git_fetch_now.exists():
            return 0.0
        return max(st.next_fetch_at - (time.time() if now is None else now), 0.0)

    # -- the fetch: under git.lock alone --------------------------------------------------

    def fetch(self) -> None:
        """The daemon's fetch thread: a fetch when one is due, under git.lock alone."""
        try:
            with self.hold() as lock:
                self.fetch_when_due(lock)
        finally:
            # Asked of this fetch (never reset at the start: a stop asked just before the
            # thread got here would be lost, and the rollback wait out the fetch's limit)
            self._making_way = False

    def fetch_when_due(self, lock: FileLock) -> None:
        """Under git.lock (``lock``, held): a fetch when one is due; the status says what
        came of it, and the next :meth:`apply` reports it."""
        by = None if self.moves_only else self._fetch_reason(self.status())
        if by is None:
            return
        news = SyncResult(revision=None)
        self._fetch(by, news, lock)
        self.always_fetch = False  # --once --wait: one fetch, then passes on that commit
        with self._news_lock:
            self._news.add(news)

    def _fetch_reason(self, st: SourceStatus) -> str | None:
        hook = StateDir(self.state_dir).git_fetch_now
        if hook.exists():
            with contextlib.suppress(FileNotFoundError):
                hook.unlink()  # taken before the fetch: a hook during it asks for another
            return "webhook"
        if self.always_fetch or st.fetched is None:  # this process's first sync
            return "start"
        return "poll" if time.time() >= st.next_fetch_at else None

    def _fetch(self, by: str, news: SyncResult, lock: FileLock) -> None:
        tried = now_iso()
        if self.status().fetched is None:  # a first fetch: `source` says it is under way
            self.change_status(lambda st: _trying(st, tried))
        try:
            self._ensure_repo()
            sha = self._fetch_ref(lock)
        except FetchGivenUp as stop:  # said now: a stopping daemon makes no further pass
            said = f"fetch stopped: {stop}"
            log.info("git source", change=said, url=shown_url(self.settings.url))
            return
        except (GitFailed, OSError) as exc:
            error = news.error = str(exc)
            self.change_status(lambda st: self._failed(st, error, tried))
            return
        self.change_status(lambda st: self._fetched(st, sha, by, tried, news))
        news.fetched = True
        self._collect_when_grown(lock)

    def _failed(self, st: SourceStatus, error: str, tried: str) -> None:
        st.last_try_at, st.fetch_error = tried, error
        st.failures += 1
        wait = min(RETRY_FIRST * 2 ** (st.failures - 1), RETRY_MAX, self.settings.interval)
        st.next_fetch_at = time.time() + wait
        log.warning("git fetch failed", url=st.url, error=error, retry_in=wait)

    def _fetched(self, st: SourceStatus, sha: str, by: str, tried: str, news: SyncResult) -> None:
        if sha != st.fetched:
            news.events.append(f"fetched {sha[:12]} from {st.url} ({by})")
            if st.auto_pinned and st.fetched is not None:
                st.pinned, st.auto_pinned = None, False  # a newer commit lifts autoRollback's pin
                news.events.append(f"a newer commit ({sha[:12]}): the auto-rollback pin lifted")
        st.fetched, st.fetch_error, st.failures, st.by = sha, None, 0, by
        st.last_try_at = st.last_fetch_at = tried
        st.next_fetch_at = time.time() + self.settings.interval

    def _ensure_repo(self) -> None:
        """A repository to fetch into: made once; one git cannot open is made again. The
        work tree is left as it is (a pass may be reading it): the next move makes it the
        commit's, whole (the marker asks for that move)."""
        if (self.repo / ".git").is_dir():
            try:
                git(self.repo, "rev-parse", "--git-dir", timeout=30)
                return
            except GitFailed as exc:
                log.warning("git checkout unusable; making it again", error=str(exc))
        self.marker.write_text("init\n")  # first: the work tree is no commit's from here on
        _remove_tree(self.repo / ".git")
        self.repo.mkdir(mode=0o700, parents=True, exist_ok=True)
        git(self.repo, "init", "--quiet")

    def _fetch_ref(self, lock: FileLock) -> str:
        s = self.settings
        self._unlock()
        if why := self._stopped():
            raise FetchGivenUp(why)
        try:
            git(
                self.repo,
                "fetch",
                "--quiet",
                "--no-tags",
                "--force",
                f"--depth={DEPTH}",
                s.url,
                f"+{s.ref}:{s.tracking}",
                timeout=s.timeout,
                hold=lock.fileno,
                started=self._fetch_started,
            )
        except GitFailed as exc:
            if why := self._stopped():
                raise FetchGivenUp(why) from None
            raise _next_move(exc, s) from None
        finally:
            self._fetch_pid = None
            _drop_partial(self.repo / ".git" / "objects")  # a fetch cut short: not kept
        sha = git(self.repo, "rev-parse", "--verify", "--quiet", f"{s.tracking}^{{commit}}")
        if not SHA.match(sha):
            raise GitFailed(f"{s.ref} does not name a commit (got {sha!r})")
        return sha

    def _collect_when_grown(self, lock: FileLock) -> None:
        """Under git.lock, after a fetch: the object store collected once it has doubled
        since the last collection (and passed ``COLLECT_MIN``), so its cost stays in
        proportion to what was fetched. The node's git runs with gc.auto=0 (a fetch must not
        start a gc of its own, unbounded, holding the checkout), so without this every
        object ever fetched (a large file committed once and deleted, each force-pushed
        history) stayed, for good, on the disk the records live on. A failed collection
        costs only space: it is logged, and tried again after the next fetch."""
        objects = self.repo / ".git" / "objects"
        size = _size_of(objects)
        mark = self.repo / ".git" / COLLECTED
        try:
            last = int(mark.read_text().strip() or 0)
        except (OSError, ValueError):
            last = 0
        if size < max(COLLECT_MIN, 2 * last) or self._stopped():
            return
        try:
            self._collect(lock)
        except GitFailed as exc:
            if why := self._stopped():  # housekeeping yields: the next fetch collects
                log.info("git checkout not collected", reason=f"stopped: {why}")
            else:
                log.warning("git checkout not collected", error=str(exc))
            return
        mark.write_text(f"{_size_of(objects)}\n")

    def _collect(self, lock: FileLock) -> None:
        """What no ref, no rollback target and no HEAD names, dropped: each commit that
        history.json, the pin and the fetch name is kept by a ref of ours first
        (``refs/reconcile/keep/<sha>``), so `reconcile rollback REV` still finds it once
        the branch has moved past it or been force-pushed away from it."""
        st = self.status()
        wanted = {str(e["revision"]) for e in read_history(self.state_dir)}
        wanted |= {sha for sha in (st.pinned, st.fetched, st.applied) if sha}
        present = git(self.repo, "cat-file", "--batch-check", stdin="\n".join(sorted(wanted)))
        held = {ln.split()[0] for ln in present.splitlines() if not ln.endswith(" missing")}
        kept = git(self.repo, "for-each-ref", "--format=%(refname)", KEEP_REFS).split()
        lines = [f"delete {ref}" for ref in kept if ref.rpartition("/")[2] not in held]
        lines += [f"update {KEEP_REFS}/{sha} {sha}" for sha in sorted(held)]
        git(self.repo, "update-ref", "--stdin", stdin="".join(f"{ln}\n" for ln in lines))
        # the reflogs would keep every commit the tracking ref was ever at for 90 days
        git(self.repo, "reflog", "expire", "--expire=now", "--expire-unreachable=now", "--all")
        # Stopped as the fetch is (``make_way``, ``give_up_fetch``): a large checkout's gc
        # takes minutes, and a rollback must not wait on housekeeping (a gc cut short
        # leaves what ``_unlock`` removes, and the next fetch collects again).
        try:
            git(
                self.repo,
                "gc",
                "--quiet",
                "--prune=now",
                timeout=600,
                hold=lock.fileno,  # a gc outliving us holds the checkout
                started=self._collection_started,
            )
        finally:
            self._fetch_pid = None

    def _unlock(self) -> None:
        """git's own lock files, and the partial download, left by a git we killed (or a
        reconcile killed mid-fetch): ours to remove under git.lock."""
        gitdir = self.repo / ".git"
        _drop_partial(gitdir / "objects")
        for name in ("index.lock", "shallow.lock", "HEAD.lock", "packed-refs.lock", "gc.pid"):
            with contextlib.suppress(FileNotFoundError):
                (gitdir / name).unlink()
        refs = gitdir / "refs"
        if refs.is_dir():
            for stale in refs.rglob("*.lock"):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()

    # -- the move: under the pass lock and git.lock -------------------------------------

    def apply(self, held: FileLock | None = None) -> SyncResult:
        """Under the pass lock: the checkout moved to the commit to apply (the pin, else
        the last fetched), with what the fetches since the last apply brought. ``held``:
        git.lock, taken before the pass lock (a `--once`'s fetch). Else it is tried: while
        a fetch holds it nothing moves, the pass runs on the commit applied, whole, and a
        pass after the fetch moves (the daemon's, at the fetch's end)."""
        with self._news_lock:
            news, self._news = self._news, SyncResult(revision=None)
        if held is not None:
            self._apply(news, held)
        else:
            lock = self._lock()
            if lock.try_acquire():
                try:
                    self._apply(news, lock)
                finally:
                    lock.release()
        news.revision = self._head() if self.current else None  # another source's: none
        return news

    def _apply(self, news: SyncResult, lock: FileLock) -> None:
        st = self.status()
        target = st.target
        if target is not None and st.move_waits(target):
            news.error = news.error or st.move_error  # said when it failed; --once exits 1
            return  # the checkout stays as it is until the back-off ends
        failed = None if target is None else self._move_to(st, target, news, lock)
        # Nothing of this source fetched yet: the checkout is another source's (or none),
        # never this one's applied commit (a pass would read it as this source's).
        head = self._head() if target is not None else st.applied

        def note(now: SourceStatus) -> None:
            now.applied, now.last_applied_at = head, st.last_applied_at
            now.unverified = st.unverified
            _note_move(now, target, failed)

        self.change_status(note)

    def _head(self) -> str | None:
        from controller.store.sources.gitrev import revision

        if not (self.repo / ".git").is_dir() or self.marker.exists():
            return None
        return revision(self.repo)

    def _verified(self, st: SourceStatus, target: str, result: SyncResult) -> bool:
        """``git verify-commit`` with git's ssh signatures against verify.allowedSigners:
        an unsigned commit, or one signed by a key not listed, is never applied."""
        signers = self.settings.allowed_signers
        if signers is None:
            st.unverified = None
            return True
        try:
            git(
                self.repo,
                "-c",
                "gpg.format=ssh",
                "-c",
                f"gpg.ssh.allowedSignersFile={signers}",
                "verify-commit",
                target,
                timeout=60,
            )
        except GitFailed as exc:
            # verify-commit says nothing of a commit with no signature at all
            why = "it carries no signature" if exc.silent else str(exc)
            st.unverified = f"commit {target[:12]} is not signed by a key in {signers}: {why}"
            result.error = st.unverified
            log.warning("git commit not verified; not applied", commit=target, error=why)
            return False
        st.unverified = None
        return True

    def _move_to(
        self, st: SourceStatus, target: str, result: SyncResult, lock: FileLock
    ) -> str | None:
        """The checkout at ``target`` (``st``'s move fields set); why not, when it failed."""
        if self._head() == target:
            if not self.marker.exists():
                st.unverified = None
            return None
        if not self._verified(st, target, result):
            return None
        try:
            self.marker.write_text(target + "\n")  # a kill from here on: the next sync redoes it
            self._unlock()
            hold, started = lock.fileno, self._started
            git(
                self.repo,
                "checkout",
                "-q",
                "--force",
                "--detach",
                target,
                timeout=600,
                hold=hold,
                started=started,
            )
            failpoints.hit("git.move.after_checkout")
            git(self.repo, "clean", "-ffdxq", timeout=600, hold=hold, started=started)
            self.marker.unlink()
        except (GitFailed, OSError) as exc:
            result.error = _move_failed(st, target, exc)
            if st.move_target != target:  # its first failure: said once, retries quietly
                result.move_failed = result.error
                log.warning("git checkout failed", commit=target, error=result.error)
            else:
                log.debug("git checkout failed again", commit=target, error=str(exc))
            return result.error
        st.last_applied_at = now_iso()
        result.moved = True
        result.events.append(f"checked out {target[:12]}")
        by = st.by
        if st.pinned == target:
            by = "auto-rollback" if st.auto_pinned else "rollback"
        add_history(self.state_dir, self._entry(target, by))
        return None

    def _entry(self, sha: str, by: str) -> dict[str, Any]:
        try:
            author, _, subject = git(self.repo, "log", "-1", "--format=%an%x00%s", sha).partition(
                "\0"
            )
        except GitFailed:
            author, subject = "", ""
        return {
            "revision": sha,
            "author": author,
            # a start or a --once fetches as the interval's poll does
            **({"by": "poll"} if by == "start" else {"by": by}),
            "subject": subject,
            "applied_at": now_iso(),
            "outcome": "Progressing",
        }

    def note_invalid(self, errors: list[ManifestError], *, folder: str | None = None) -> bool:
        """The pass's manifest errors at the commit it applied, and what is wrong with the
        manifests' folder there (``folder``: missing, or no manifest in it, which prunes
        nothing): while there are any the source is Degraded (``state_of``), whatever its
        engines do (those of a broken file keep their last good spec: a typo tears nothing
        down, and says so here too). Whether there are any."""
        said = [f"{self.settings.path}: {folder}; nothing pruned"] if folder else []
        said += [str(e) for e in errors]  # named as the repository does (``load``'s repo)
        said = said[:INVALID_KEPT]
        st = read_status(self.state_dir)
        if st is None or (st.invalid, st.invalid_at) == (said, st.applied if said else None):
            return bool(said)  # most passes: nothing new to write

        def note(now: SourceStatus) -> None:
            now.invalid, now.invalid_at = said, now.applied if said else None

        self.change_status(note)
        return bool(said)

    def note_outcome(
        self,
        phases: list[tuple[str, str]],
        specs: dict[str, str],
        *,
        invalid: bool = False,
        drained: bool = False,
    ) -> str | None:
        """The newest history entry follows its deployments as they converge (``phases``:
        deployment, phase per instance); past autoRollback's progressDeadline with the
        deployments the commit changed not all Ready, the source is pinned to the last good
        commit (what happened, in words, for the events; None when nothing did).

        The entry keeps its commit's spec hashes (``specs``, from its first pass): what it
        changed is what differs from the entry before, so a deployment the commit did not
        touch, failing since an older one, rolls nothing back. A commit whose manifests
        cannot all be applied (``invalid``: one does not load, or the folder is missing or
        empty) is Degraded however its engines run, never a good commit to roll back to,
        and rolled back past the deadline. ``drained``: the node's drain is active, and the
        deadline waits (``_paused``)."""
        entries = read_history(self.state_dir)
        if not entries or entries[-1]["outcome"] in ("Ready", "RolledBack"):
            return None
        newest = entries[-1]
        outcome = outcome_of([phase for _, phase in phases])
        if invalid and outcome != "Failed":
            outcome = "Degraded"
        news = "specs" not in newest or outcome != newest["outcome"]  # else nothing to write
        news |= _paused(newest, drained, datetime.now(UTC))
        newest.setdefault("specs", specs)
        newest["outcome"] = outcome
        if news:
            write_history(self.state_dir, entries)
        if outcome == "Ready":
            return None
        touched = _changed_by(entries, newest)
        if not invalid and outcome_of([p for name, p in phases if name in touched]) == "Ready":
            return None
        return self._auto_rollback(newest)

    def _auto_rollback(self, newest: dict[str, Any]) -> str | None:
        deadline = self.settings.progress_deadline
        if deadline is None or newest.get("by") in ("rollback", "auto-rollback"):
            return None
        if "paused_at" in newest:  # drained: nothing new can start, nothing is late
            return None
        try:  # from the drain's end, if one came after the commit (as Kubernetes' resume)
            since = datetime.fromisoformat(str(newest.get("resumed_at", newest["applied_at"])))
        except ValueError:
            return None
        if (datetime.now(UTC) - since).total_seconds() < deadline:
            return None
        good = last_good(self.state_dir, but=newest["revision"])
        if good is None:
            return None
        pinned: list[str] = []

        def pin(st: SourceStatus) -> None:
            if st.pinned is None:  # a rollback's pin stands
                st.pinned, st.auto_pinned = good, True
                pinned.append(good)

        self.change_status(pin)
        if not pinned:
            return None
        return (
            f"commit {newest['revision'][:12]} not Ready within {deadline:g}s"
            f" (progressDeadline): rolled back to {good[:12]}, pinned until a newer commit"
            " or reconcile rollback --resume"
        )


def _move_failed(st: SourceStatus, target: str, exc: Exception) -> str:
    """A failed move in git's words, and the next move where it is the pin's."""
    said = f"cannot check out {target[:12]}: {exc}"
    if st.pinned != target:
        return said
    return (
        f"{said}; the pin stands (tried again with back-off): roll back to another commit"
        " (reconcile history lists them), or follow the branch again (reconcile rollback"
        " --resume)"
    )


def _note_move(st: SourceStatus, target: str | None, failed: str | None) -> None:
    """The move's outcome: a failure backs off, doubling from RETRY_FIRST to RETRY_MAX,
    as Flux requeues a failed GitRepository and Argo CD retries a failed sync; a move
    done (or nothing to move to) forgets it."""
    if failed is None or target is None:
        st.move_error, st.move_target, st.move_failures, st.next_move_at = None, None, 0, 0.0
        return
    st.move_failures = st.move_failures + 1 if st.move_target == target else 1
    st.move_error, st.move_target = failed, target
    st.next_move_at = time.time() + min(RETRY_FIRST * 2 ** (st.move_failures - 1), RETRY_MAX)


def _paused(entry: dict[str, Any], drained: bool, now: datetime) -> bool:
    """The history entry's progress deadline paused while the node is drained, and
    started again from the drain's end: nothing new starts on a drained node (a spec
    change waits, its engine on the old spec), so a drain must not make a good commit
    late. Kubernetes does the same for a paused Deployment: no progress check while
    paused, and ``progressDeadlineSeconds`` counts again from the resume. Whether the
    entry changed (then it is written)."""
    if drained and "paused_at" not in entry:
        entry["paused_at"] = now.isoformat()
        return True
    if not drained and "paused_at" in entry:
        del entry["paused_at"]
        entry["resumed_at"] = now.isoformat()
        return True
    return False


# What a git cut short mid-fetch leaves in the object store: index-pack's pack and index as
# they came, unpack-objects' half-written object. git's gc removes them after two weeks,
# but the node's git runs none (gc.auto=0): each stalled retry left one more, each up to
# the repository's size, on the disk the records live on.
# A gc cut short leaves repack's packs not yet renamed (``pack/.tmp-<pid>-pack-*``).
PARTIAL = ("pack/tmp_*", "pack/.tmp-*", "??/tmp_obj_*", "tmp_obj_*")


# The object store's collection (GitSource._collect_when_grown): never below this size,
# then each time it has doubled since the last (the size then kept in COLLECTED).
COLLECT_MIN = 8 << 20
COLLECTED = "reconcile-collected"
KEEP_REFS = "refs/reconcile/keep"  # one ref per commit a rollback may name


def _size_of(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size if path.is_file() else 0
    return total


def _drop_partial(objects: Path) -> None:
    for pattern in PARTIAL:
        for stale in objects.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def _remove_tree(path: Path) -> None:
    """``path`` gone, whether a folder or a file (a ``.git`` file: a worktree's link)."""
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


# -- history: one entry per application of a commit --------------------------------------

HISTORY_KEEP = 200  # entries kept (the oldest go first)


def _decode_history(data: Any) -> list[dict[str, Any]]:
    if not isinstance(data, list):
        raise ValueError(f"a {type(data).__name__}, not a list")
    return [e for e in data if isinstance(e, dict) and "revision" in e]


def _history(state_dir: Path) -> Document[list[dict[str, Any]]]:
    state = StateDir(state_dir)
    keep = lambda entries: entries[-HISTORY_KEEP:]  # noqa: E731
    return Document(state, state.git_history, _decode_history, keep, indent=1)


def read_history(state_dir: Path) -> list[dict[str, Any]]:
    """The applied commits, oldest first (a torn file: quarantined, a new history)."""
    return _history(state_dir).read() or []


def peek_history(state_dir: Path) -> list[dict[str, Any]]:
    """``read_history`` for `reconcile history`: a torn file is named, read as none, and
    left for the next pass to set aside."""
    return _history(state_dir).peek() or []


def write_history(state_dir: Path, entries: list[dict[str, Any]]) -> None:
    _history(state_dir).write(entries)


def add_history(state_dir: Path, entry: dict[str, Any]) -> None:
    entries = read_history(state_dir)
    if (
        entries
        and entries[-1]["outcome"] not in ("Ready",)
        and entry["by"] in ("rollback", "auto-rollback")
    ):
        entries[-1]["outcome"] = "RolledBack"  # the commit that was left for an older one
    write_history(state_dir, [*entries, entry])


def _changed_by(entries: list[dict[str, Any]], newest: dict[str, Any]) -> set[str]:
    """The deployments whose spec ``newest``'s commit changed: added, or another hash than
    the last earlier entry that knew its specs had (every one when none did)."""
    specs: dict[str, str] = newest.get("specs") or {}
    before = next(
        (e["specs"] for e in reversed(entries[:-1]) if isinstance(e.get("specs"), dict)), None
    )
    if before is None:
        return set(specs)
    return {name for name, digest in specs.items() if before.get(name) != digest}


def outcome_of(phases: list[str]) -> str:
    if any(p == "Failed" for p in phases):
        return "Failed"
    if any(p in ("BackOff", "Pending") for p in phases):
        return "Degraded"
    if all(p in ("Ready", "Idle") for p in phases):
        return "Ready"
    return "Progressing"


def last_good(state_dir: Path, but: str | None) -> str | None:
    """The newest commit whose deployments were all Ready, other than ``but``."""
    for entry in reversed(read_history(state_dir)):
        if entry["outcome"] == "Ready" and entry["revision"] != but:
            return str(entry["revision"])
    return None


# -- the state `reconcile source` shows -------------------------------------------------


Phases = Sequence[tuple[str, str]]  # each record of the source: (its name, its phase)
DEGRADING = ("Failed", "BackOff", "Pending")  # a record in one of these makes it Degraded


def degraded(phases: Phases) -> list[str]:
    """The records that make the source Degraded, by name (a notification names them)."""
    return [name for name, phase in phases if phase in DEGRADING]


def phases_of(records: Iterable[Record], owner: str | None = None) -> list[tuple[str, str]]:
    """``state_of``'s phases: each record's (name, phase), of ``owner``'s alone if given."""
    return [(r.name, str(r.phase)) for r in records if owner is None or r.owner == owner]


def _trying(st: SourceStatus, tried: str) -> None:
    """A first fetch begun: written at once, so the source is known while it runs (a
    daemon's first fetch from a remote that hangs took its whole limit to say anything)."""
    st.last_try_at = tried


def state_of(st: SourceStatus, phases: Phases) -> tuple[str, str]:
    """(state, message) from the status and the phases of the source's records."""
    if st.fetch_error:
        since = st.last_fetch_at or "never"
        return PULL_FAILED, f"{st.fetch_error} (last successful fetch: {since})"
    if st.stuck_move:
        running = st.applied[:12] if st.applied else "nothing of the source"
        return PULL_FAILED, f"{st.stuck_move} (still running {running}; nothing pruned)"
    if st.unverified:
        running = st.applied[:12] if st.applied else "nothing"
        return UNVERIFIED, f"{st.unverified} (still running {running})"
    if st.pinned:
        moved = st.fetched and st.fetched != st.pinned
        by = "auto-rollback" if st.auto_pinned else "rollback"
        behind = f"; the branch is at {st.fetched[:12]}" if moved and st.fetched else ""
        return PINNED, f"pinned at {st.pinned[:12]} by {by} (reconcile rollback --resume){behind}"
    if st.fetched is None:
        began = f" (the first fetch began {st.last_try_at})" if st.last_try_at else ""
        return PROGRESSING, f"not fetched yet{began}"
    if st.applied != st.fetched:
        return PROGRESSING, f"applying {st.fetched[:12]}"
    if st.invalid and st.invalid_at == st.applied:
        more = len(st.invalid) - 1
        full = len(st.invalid) >= INVALID_KEPT  # kept no more: there may be others
        rest = f" (and {more}{'+' if full else ''} more)" if more else ""
        return DEGRADED, (
            f"the manifests at {st.applied[:12]} cannot all be applied: {st.invalid[0]}{rest}; "
            "what they declared before runs on unchanged: fix it and push (`reconcile "
            "validate` lists every error)"
        )
    bad = [f"{name} {phase}" for name, phase in phases if phase in DEGRADING]
    if bad:
        return DEGRADED, f"{len(bad)} of {len(phases)} deployment(s) not Ready ({', '.join(bad)})"
    waiting = [p for _, p in phases if p not in ("Ready", "Idle")]
    if waiting:
        return PROGRESSING, f"{len(phases) - len(waiting)}/{len(phases)} deployment(s) Ready"
    return SYNCED, f"{len(phases)} deployment(s) Ready at {st.applied[:12]}"


def as_json(st: SourceStatus, state: str, message: str) -> dict[str, Any]:
    return {
        "url": st.url,
        **({"tag": st.tag} if st.tag else {"branch": st.branch}),
        "path": st.path,
        "fetched": st.fetched,
        "applied": st.applied,
        "state": state,
        "message": message,
        "last_fetch_at": st.last_fetch_at,
        "last_applied_at": st.last_applied_at,
        "pinned": st.pinned,
    }
