"""The git source's files under the state dir: where the checkout and its lock are, and
``<state>/git/source.json`` (``SourceStatus``): the source followed and what became of it."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.store.documents import Document
from controller.store.lock import FileLock
from controller.store.sources.git.settings import (
    DEFAULT_TIMEOUT,
    GitSettings,
    same_repository,
    shown_url,
)
from controller.store.statedir import StateDir

INVALID_KEPT = 20  # manifest errors the source file keeps (`reconcile validate` lists all)
NOTHING_READ = "; nothing pruned"  # how ``invalid`` ends what it says of the folder, first


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
    invalid_on_node: bool = False  # the first one's fix is on this node (ManifestError's)
    # The applied commit whose pass ran to its end (``note_invalid``): before that its
    # records may not be written yet, and no deployment read as all of them Ready.
    passed_at: str | None = None
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
    fields = SourceStatus.__dataclass_fields__
    kept = {k: v for k, v in data.items() if k in fields}
    missing = [k for k, f in fields.items() if k not in kept and f.default is f.default_factory]
    if missing:  # both MISSING: a field with no default
        raise ValueError(f"no {', '.join(missing)}")
    for key, value in kept.items():  # a hand edit's `"pinned": 5` broke a verb later
        if not _typed(str(fields[key].type), value):
            raise ValueError(f"{key}: {value!r}, not {fields[key].type}")
    return SourceStatus(**kept)


def _typed(kind: str, value: Any) -> bool:
    """``value`` is of the field's annotation (the few kinds SourceStatus uses)."""
    if value is None:
        return kind.endswith("| None")
    if isinstance(value, bool):
        return kind == "bool"
    base = kind.removesuffix(" | None")
    if base == "float":
        return isinstance(value, int | float)
    if base == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return type(value).__name__ == base


# What a damaged source.json's reader is told. The file holds choices no other file
# does (a rollback's pin, the owner a spelling kept), so it is never set aside and read
# as none: a pass that did so forgot the pin and applied the newest commit in silence.
REFUSED = (
    "it holds the node's git source, its rollback pin and its fetch state, so nothing of"
    " the source is fetched or applied until it is mended (the engines keep running)."
    " Restore it from a backup, or move it aside to follow the source afresh (a pin it"
    " held is then forgotten: `reconcile history` lists the commits applied,"
    " `reconcile rollback REV` pins one again)"
)


def status_document(state_dir: Path) -> Document[SourceStatus]:
    state = StateDir(state_dir)
    return Document(state, state.git_source, _decode_status, asdict, indent=1, refused=REFUSED)


def read_status(state_dir: Path) -> SourceStatus | None:
    """The remembered source, or None when this state dir follows no git source; a file
    that does not decode (or cannot be read) raises RecordError, named, left in place."""
    return status_document(state_dir).read()


def peek_status(state_dir: Path) -> SourceStatus | None:
    """The remembered source, never refused (the page, `status`: a damaged file is named,
    once, with the way out, and reads as none here)."""
    return status_document(state_dir).peek()


def write_status(state_dir: Path, status: SourceStatus) -> None:
    status_document(state_dir).write(status)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
