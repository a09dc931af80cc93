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
(git/orphan.py). A failed fetch changes nothing on disk but the status: the
last applied commit keeps running and nothing is pruned.

The source's rooms, by role (this module re-exports their names, so its importers need
no other): ``GitSource`` is the checkout (``checkout``) with its fetches and their
collection (``fetching``), its moves (``moving``) and a pass's notes and
autoRollback's pin (``pins``); ``settings`` (the settings, the URL's spellings),
``owner`` (whose records they are), ``status`` (``source.json`` and the state dir's
git files), ``run`` (running git), ``keep`` (the checkout's housekeeping),
``history`` (the commits applied: rollbacks' memory), ``state`` (the state
`reconcile source` shows).
"""

from __future__ import annotations

from controller.store.sources.git.checkout import SyncResult
from controller.store.sources.git.fetching import SHA, Fetching
from controller.store.sources.git.history import (
    add_history,
    last_good,
    outcome_of,
    peek_history,
    read_history,
    write_history,
)
from controller.store.sources.git.keep import (
    COLLECT_MIN,
    COLLECTED,
    KEEP_REFS,
    PARTIAL,
)
from controller.store.sources.git.moving import Moving
from controller.store.sources.git.owner import followed_instead, spelled_as_before
from controller.store.sources.git.pins import Pins
from controller.store.sources.git.run import FetchGivenUp, GitFailed, git
from controller.store.sources.git.settings import (
    DEFAULT_INTERVAL,
    DEFAULT_TIMEOUT,
    GitSettings,
    local_repo,
    normal_path,
    same_repository,
    settings,
    shown_url,
)
from controller.store.sources.git.state import (
    DEGRADED,
    DEGRADING,
    FAILING,
    PINNED,
    PROGRESSING,
    PULL_FAILED,
    STATES,
    SYNCED,
    UNVERIFIED,
    as_json,
    degraded,
    folder_unread,
    phases_of,
    state_of,
)
from controller.store.sources.git.status import (
    SourceStatus,
    checkout_dir,
    checkout_lock,
    manifests_dir,
    now_iso,
    peek_status,
    read_status,
    write_status,
)

__all__ = [
    "COLLECTED",
    "COLLECT_MIN",
    "DEFAULT_INTERVAL",
    "DEFAULT_TIMEOUT",
    "DEGRADED",
    "DEGRADING",
    "FAILING",
    "KEEP_REFS",
    "PARTIAL",
    "PINNED",
    "PROGRESSING",
    "PULL_FAILED",
    "SHA",
    "STATES",
    "SYNCED",
    "UNVERIFIED",
    "FetchGivenUp",
    "GitFailed",
    "GitSettings",
    "GitSource",
    "SourceStatus",
    "SyncResult",
    "add_history",
    "as_json",
    "checkout_dir",
    "checkout_lock",
    "degraded",
    "folder_unread",
    "followed_instead",
    "git",
    "last_good",
    "local_repo",
    "manifests_dir",
    "normal_path",
    "now_iso",
    "outcome_of",
    "peek_history",
    "peek_status",
    "phases_of",
    "read_history",
    "read_status",
    "same_repository",
    "settings",
    "shown_url",
    "spelled_as_before",
    "state_of",
    "write_history",
    "write_status",
]


class GitSource(Fetching, Moving, Pins):
    """The checkout: fetched when due (:meth:`fetch_when_due`, under git.lock alone), moved
    to the commit to apply by the pass (:meth:`apply`, under the pass lock too).

    The fetch holds no pass: a remote that hangs holds git.lock for the fetch's limit, and
    meanwhile passes run on the commit applied (restarts, probes, other sources, `down`),
    as Flux's kustomize-controller applies the last artifact its source-controller made.
    The work tree changes only in a move, under both locks: a pass (or `down`) never reads
    it half-moved, and a fetch writes only git's objects and refs (``source``, ``history``
    and ``rollback`` read those, and the status, which is written whole)."""
