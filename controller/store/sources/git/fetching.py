"""The checkout's fetches, when due, under git.lock alone, and the collection of its object
store after a fetch that grew it (housekeeping, which a rollback or a stop ends)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from controller.logsetup import get_logger
from controller.store.lock import FileLock
from controller.store.sources.git import orphan as gitorphan
from controller.store.sources.git.checkout import RETRY_FIRST, RETRY_MAX, Checkout, SyncResult
from controller.store.sources.git.history import read_history
from controller.store.sources.git.keep import (
    COLLECT_MIN,
    COLLECTED,
    KEEP_REFS,
    drop_partial,
    remove_tree,
    size_of,
)
from controller.store.sources.git.run import FetchGivenUp, GitFailed, git
from controller.store.sources.git.settings import (
    GitSettings,
    shown_url,
)
from controller.store.sources.git.status import (
    SourceStatus,
    now_iso,
)
from controller.store.statedir import StateDir

log = get_logger("reconcile")

DEPTH = 50  # commits fetched: enough history for `history` and rollbacks, not the whole past
SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def fetch(
    repo: Path,
    url: str,
    refspec: str,
    *,
    timeout: float,
    hold: int | None,
    started: Callable[[int], None],
) -> None:
    """``refspec`` from ``url``, ``DEPTH`` commits deep, no tags; a fetch cut short
    (stopped, timed out, killed) leaves no partial pack behind."""
    try:
        git(
            repo,
            "fetch",
            "--quiet",
            "--no-tags",
            "--force",
            f"--depth={DEPTH}",
            url,
            refspec,
            timeout=timeout,
            hold=hold,
            started=started,
        )
    finally:
        drop_partial(repo / ".git" / "objects")


class Fetching(Checkout):
    """Fetches (the daemon's thread, or a `--once` before its pass)."""

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

    def named_on_remote(self, name: str) -> str | None:
        """The commit a tag or branch ``name`` is at on the remote (an annotated tag's
        commit), or None: the checkout fetches no tags (``--no-tags``), so `rollback v1`
        asks the remote, as Argo CD and Flux resolve a revision that is a tag. GitFailed
        when the remote does not answer."""
        tag, head = f"refs/tags/{name}", f"refs/heads/{name}"
        said = git(
            self.repo, "ls-remote", self.settings.url, tag, f"{tag}^{{}}", head,
            timeout=self.settings.timeout,
        )  # fmt: skip
        refs = {ref: sha for sha, _, ref in (line.partition("\t") for line in said.splitlines())}
        for ref in (f"{tag}^{{}}", tag, head):  # the peeled tag first: its commit
            if SHA.match(refs.get(ref, "")):
                return refs[ref]
        return None

    def due_in(self, now: float | None = None) -> float:
        """Seconds until the next fetch is due (0: now)."""
        st = self.status()
        if self.always_fetch or StateDir(self.state_dir).git_fetch_now.exists():
            return 0.0
        return max(st.next_fetch_at - (time.time() if now is None else now), 0.0)

    def fetch(self) -> None:
        """The daemon's fetch thread: a fetch when one is due, under git.lock alone."""
        try:
            with self.hold() as lock:
                self.fetch_when_due(lock)
        finally:
            # Asked of this fetch (never reset at the start: a stop asked just before the
            # thread got here would be lost, and the rollback wait out the fetch's limit)
            self._making_way = False

    def standing(self, news: SyncResult) -> None:
        """A `--once`'s pass (each of its `--wait`'s): the fetch failure that stands said,
        as `source` says it, though this pass fetched nothing (a wait's later passes said
        none, and it exited 0 once all was Ready): this run's own (beside the daemon, kept
        in its memory alone), else the source's PullFailed (the daemon's, beside it)."""
        if news.error:
            return
        st = self.status()
        if self.beside_daemon is None:
            news.error = st.fetch_error
        elif self._failed_aside:
            news.error = self._failed_aside
        else:
            news.daemon_failing = _daemon_failing(st, self.beside_daemon)

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

    def fetch_now(self, lock: FileLock) -> str | None:
        """Under git.lock (``lock``, held): a fetch now, due or not (`rollback --resume`:
        the branch's newest commit, not the one fetched up to an interval ago); its error,
        or None."""
        news = SyncResult(revision=None)
        self._fetch("poll", news, lock)
        with self._news_lock:
            self._news.add(news)
        return news.error

    def _fetch_reason(self, st: SourceStatus) -> str | None:
        hook = StateDir(self.state_dir).git_fetch_now
        if hook.exists() and self.beside_daemon is None:  # a webhook asks the daemon
            with contextlib.suppress(FileNotFoundError):
                hook.unlink()  # taken before the fetch: a hook during it asks for another
            return "webhook"
        if self.always_fetch or st.fetched is None:  # this process's first sync
            return "start"
        return "poll" if time.time() >= st.next_fetch_at else None

    def _fetch(self, by: str, news: SyncResult, lock: FileLock) -> None:
        tried = now_iso()
        first = self.status().fetched is None and self.beside_daemon is None
        if first:  # a first fetch: `source` says it is under way
            self.change_status(lambda st: _trying(st, tried))
        try:
            self._ensure_repo()
            sha = self._fetch_ref(lock)
        except FetchGivenUp as stop:  # said now: a stopping daemon makes no further pass
            said = f"fetch stopped: {stop}"
            log.info("git source", change=said, url=shown_url(self.settings.url))
            return
        except (GitFailed, OSError) as exc:
            said = _on_disk(exc, self.repo)
            if self.beside_daemon is not None:  # this run's alone: the daemon's stands
                news.error = self._failed_aside = _not_kept(said, self.beside_daemon)
                log.warning("git fetch failed", url=shown_url(self.settings.url),
                            error=said, kept=False)  # fmt: skip
                return
            error = news.error = said
            self.change_status(lambda st: self._failed(st, error, tried))
            return
        self.change_status(lambda st: self._fetched(st, sha, by, tried, news))
        news.fetched, self._failed_aside = True, None
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
        st.fetched, st.by, st.last_fetch_at = sha, by, tried
        if self.beside_daemon is None:  # beside it, the daemon's failure is its to lift
            st.fetch_error, st.failures, st.last_try_at = None, 0, tried
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
        remove_tree(self.repo / ".git")
        self.repo.mkdir(mode=0o700, parents=True, exist_ok=True)
        git(self.repo, "init", "--quiet")

    def _fetch_ref(self, lock: FileLock) -> str:
        s = self.settings
        self._unlock()
        if why := self._stopped():
            raise FetchGivenUp(why)
        try:
            fetch(
                self.repo,
                s.url,
                f"+{s.ref}:{s.tracking}",
                timeout=s.timeout,
                hold=lock.fileno,
                started=self._fetch_started,
            )
        except GitFailed as exc:
            if why := self._stopped():
                raise FetchGivenUp(why) from None
            raise _next_move(exc, s, other=self._other_kind(exc, lock)) from None
        finally:
            self._fetch_pid = None
        sha = git(self.repo, "rev-parse", "--verify", "--quiet", f"{s.tracking}^{{commit}}")
        if not SHA.match(sha):
            raise GitFailed(f"{s.ref} does not name a commit (got {sha!r})")
        return sha

    def _other_kind(self, exc: GitFailed, lock: FileLock) -> bool:
        """The branch followed is not on the remote: whether a tag of that name is (or
        the other way round), as Argo CD's targetRevision takes either; asked only then,
        stopped by a stop as the fetch is."""
        s = self.settings
        if "couldn't find remote ref" not in str(exc) or self._stopped():
            return False
        other = f"refs/heads/{s.tag}" if s.tag else f"refs/tags/{s.branch}"
        try:
            said = git(
                self.repo, "ls-remote", s.url, other,
                timeout=s.timeout, hold=lock.fileno, started=self._fetch_started,
            )  # fmt: skip
        except GitFailed:
            return False
        finally:
            self._fetch_pid = None
        return bool(said.strip())

    def _collect_when_grown(self, lock: FileLock) -> None:
        """Under git.lock, after a fetch: the object store collected once it has doubled
        since the last collection (and passed ``COLLECT_MIN``), so its cost stays in
        proportion to what was fetched. The node's git runs with gc.auto=0 (a fetch must not
        start a gc of its own, unbounded, holding the checkout), so without this every
        object ever fetched (a large file committed once and deleted, each force-pushed
        history) stayed, for good, on the disk the records live on. A failed collection
        costs only space: it is logged, and tried again after the next fetch."""
        objects = self.repo / ".git" / "objects"
        size = size_of(objects)
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
        mark.write_text(f"{size_of(objects)}\n")

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


def _trying(st: SourceStatus, tried: str) -> None:
    """A first fetch begun: written at once, so the source is known while it runs (a
    daemon's first fetch from a remote that hangs took its whole limit to say anything)."""
    st.last_try_at = tried


def _not_kept(error: str, daemon: int) -> str:
    """A `--once`'s failed fetch beside the daemon that follows the same source."""
    return (
        f"{error} (this run's fetch alone, not kept: the daemon (pid {daemon}) on this state"
        " dir follows this repository and fetches it with the --git URL it was started with,"
        " whose token, if any, lives in its memory and never on disk; `reconcile source`"
        " says how its fetches go, and this pass ran on the commit it fetched)"
    )


def _daemon_failing(st: SourceStatus, daemon: int) -> str | None:
    """Beside the daemon that follows the source, its failed fetch (the source's
    PullFailed, which this run's fetch does not lift): why, and the next move; else None."""
    if not st.fetch_error:
        return None
    return (
        f"the daemon (pid {daemon}) on this state dir cannot fetch this repository:"
        f" {st.fetch_error} (the source is PullFailed until a fetch of the daemon's goes"
        " through: it fetches with the --git URL it was started with, which this run's"
        " cannot stand in for; fix that URL or its credentials and restart the daemon;"
        " `reconcile source` says how its fetches go)"
    )


# What a fetch that failed on the checkout's own disk says, by the words git (or the OS)
# gave: the remote is fine, and no retry mends it until the node's disk is.
_DISK_FULL = ("No space left on device", "Disk quota exceeded")
_READ_ONLY = "Read-only file system"


def _on_disk(exc: GitFailed | OSError, repo: Path) -> str:
    """``exc`` in words (an OSError's without Python's ``[Errno N]``), and, where it failed
    on the disk of the node's checkout (full, or mounted read-only), that disk and the
    next move: git's words alone sent operators to the remote."""
    said = str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        said = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    if any(words in said for words in _DISK_FULL):
        return (
            f"{said}: the disk of this node's checkout ({repo}) is full: free space on it"
            " (`df -h`, `df -i`); the next fetch tries again"
        )
    if _READ_ONLY in said:
        return (
            f"{said}: this node's checkout ({repo}) is on a disk mounted read-only (after a"
            " disk error, the kernel remounts it so: see dmesg): mend it and mount it"
            " read-write again; the next fetch tries again"
        )
    return said


def _next_move(exc: GitFailed, s: GitSettings, *, other: bool = False) -> GitFailed:
    """A failed fetch in git's words, and what to do where they do not say it; ``other``:
    the remote has a tag of the branch's name (a branch of the tag's)."""
    if exc.timed_out:  # a slow remote needs a longer limit
        return GitFailed(
            f"{exc}: the remote did not answer in time; if it is slow, not down,"
            " raise the limit (--git-timeout, or git.timeout in node.yaml)"
        )
    if "could not read Username" in str(exc):  # a URL's token is used, never stored
        return GitFailed(
            f"{exc}: the remote asks for credentials and git has none here; reconcile keeps"
            " no password given in a URL: give the same --git URL again (or git.url in"
            " node.yaml), or set up a git credential helper for reconcile's user"
        )
    if "Authentication failed" in str(exc):  # git sent credentials; the remote said no
        return GitFailed(
            f"{exc}: the remote refused the credentials git sent (a wrong, expired or"
            " revoked token or password): give the new one in the --git URL (restart"
            " reconcile with it), in git.url in node.yaml (then SIGHUP the daemon), or to"
            " the git credential helper of reconcile's user"
        )
    if "couldn't find remote ref" in str(exc):
        kind, name = ("tag", s.tag) if s.tag else ("branch", s.branch)
        if _COMMIT_ID.fullmatch(name or ""):  # Argo CD's targetRevision may be a commit
            return GitFailed(
                f"{exc}: {name} looks like a commit, and a node follows a branch or a tag:"
                f" follow the branch that holds it (--branch) and pin the node to it with"
                f" `reconcile rollback {name}`"
            )
        if other:  # the name is right, the flag is not: "deleted, renamed" misleads
            flip = "branch" if s.tag else "tag"
            return GitFailed(
                f"{exc}: {name} is a {flip} of the remote, not a {kind}: follow it with"
                f" --{flip} {name} (git.{flip} in node.yaml, in place of git.{kind})"
            )
        return GitFailed(
            f"{exc}: the {kind} {name} is not on the remote (deleted, renamed, or a typo):"
            f" push it again, or follow another (--{kind}, git.{kind} in node.yaml)"
        )
    return exc


_COMMIT_ID = re.compile(r"[0-9a-f]{7,64}")  # a commit's id, whole or abbreviated
