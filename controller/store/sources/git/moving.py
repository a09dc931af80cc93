"""The checkout's moves to the commit to apply (the pin, else the last fetched), under
the pass lock and git.lock (a commit the checkout lacks fetched by its id first), verified
when asked; a failed one backs off."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from controller import failpoints
from controller.logsetup import get_logger
from controller.store.lock import FileLock
from controller.store.sources.git.checkout import RETRY_FIRST, RETRY_MAX, Checkout, SyncResult
from controller.store.sources.git.fetching import fetch
from controller.store.sources.git.history import add_history
from controller.store.sources.git.run import FetchGivenUp, GitFailed, git
from controller.store.sources.git.status import (
    SourceStatus,
    now_iso,
)

log = get_logger("reconcile")


class Moving(Checkout):
    """Moves (a pass's)."""

    def pin_waits(self) -> bool:
        """A rollback's pin is not yet the checkout's commit, and its move was never tried
        and failed: the emergency move goes first. One that failed (its commit in neither
        the checkout nor the branch fetched) waits for no fetch and stops none: it is
        tried again after a back-off, as a move to a fetched commit is."""
        st = self.status()
        return st.pinned is not None and st.pinned != self._head() and st.move_target != st.pinned

    def move_due_in(self, now: float | None = None) -> float | None:
        """Seconds until a failed move to the commit to apply is tried again (0: now);
        None when no move to it failed."""
        st = self.status()
        if st.target is None or st.move_target != st.target:
            return None
        return max(st.next_move_at - (time.time() if now is None else now), 0.0)

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

    def _verified(self, st: SourceStatus, target: str, result: SyncResult) -> bool:
        """``git verify-commit`` with git's ssh signatures against verify.allowedSigners:
        an unsigned commit, or one signed by a key not listed, is never applied."""
        signers = self.settings.allowed_signers
        if signers is None:
            st.unverified = None
            return True
        try:  # git says only that no key matched ("no signature", for an unsigned commit)
            with open(signers, "rb"):
                pass
        except OSError as exc:
            st.unverified = result.error = (
                f"commit {target[:12]} cannot be verified: the allowed signers file {signers}"
                f" cannot be read ({exc.strerror}): fix git.verify.allowedSigners in node.yaml"
            )
            log.warning("git commit not verified; not applied", commit=target, error=st.unverified)
            return False
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
        try:
            self._fetch_missing(target, hold=lock.fileno)
        except FetchGivenUp as stop:  # the next start moves
            log.info("git checkout not moved", commit=target, reason=f"fetch stopped: {stop}")
            return None
        except GitFailed as exc:
            return self._say_failed(st, target, result, exc)
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
            return self._say_failed(st, target, result, exc)
        st.last_applied_at = now_iso()
        result.moved = True
        result.events.append(f"checked out {target[:12]}")
        by = st.by
        if st.pinned == target:
            by = "auto-rollback" if st.auto_pinned else "rollback"
        add_history(self.state_dir, self._entry(target, by))
        return None

    def _say_failed(self, st: SourceStatus, target: str, result: SyncResult, exc: Exception) -> str:
        result.error = _move_failed(st, target, exc)
        if st.move_target != target:  # its first failure: said once, retries quietly
            result.move_failed = result.error
            log.warning("git checkout failed", commit=target, error=result.error)
        else:
            log.debug("git checkout failed again", commit=target, error=str(exc))
        return result.error

    def _fetch_missing(self, target: str, *, hold: int | None) -> None:
        """A commit the checkout lacks (a pin on a commit older than the fetch's depth,
        from before the checkout was made again, or named by its id), fetched by its id
        from the remote, as Flux fetches a GitRepository's ``ref.commit``: a branch that
        moved on no longer brings it. git serves a commit by id over protocol v2 (git's
        default), and over v0 where ``uploadpack.allowReachableSHA1InWant`` (or
        ``allowAnySHA1InWant``) lets it; a remote that refuses, or no longer has it, says
        so in git's words, with the way out (``_move_failed``)."""
        try:
            git(self.repo, "cat-file", "-e", f"{target}^{{commit}}", timeout=30)
            return  # held: most moves
        except GitFailed:
            pass
        self._unlock()
        s = self.settings
        if self._giving_up:
            raise FetchGivenUp("the daemon is stopping")
        try:
            fetch(
                self.repo,
                s.url,
                target,
                timeout=s.timeout,
                hold=hold,
                started=self._fetch_by_id_started,
            )
        except GitFailed as exc:
            if self._giving_up:  # ended by the stop: no failure of the move
                raise FetchGivenUp("the daemon is stopping") from None
            if exc.timed_out:  # no answer is not a refusal
                raise GitFailed(
                    f"the checkout lacks it, and its fetch by id from the remote timed out"
                    f" ({exc}); the remote did not answer within git.timeout"
                ) from None
            raise GitFailed(
                f"the checkout lacks it and the remote would not give it by its id ({exc}):"
                " the remote no longer has it, or serves no commit by id"
                " (uploadpack.allowReachableSHA1InWant)"
            ) from None
        finally:
            self._fetch_pid = None

    def _fetch_by_id_started(self, pid: int) -> None:
        """The daemon's stop (``give_up_fetch``) ends this fetch as it ends its thread's
        (git.lock keeps the two apart): a remote that hangs holds no stop for its limit."""
        self._fetch_pid = pid
        if self._giving_up:  # the stop came between the check and the spawn
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self._started(pid, "fetch")

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
