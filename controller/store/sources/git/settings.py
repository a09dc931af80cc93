"""The git source's settings (``--git URL``, ``--branch``/``--tag``, ``--git-path``,
``--interval``, ``--git-timeout``, node.yaml's ``git:``), checked, and the spellings of
its URL: the one shown (no password) and the one that tells two repositories apart."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from controller.errors import ConfigError

DEFAULT_INTERVAL = 60.0  # seconds between fetches (Flux's GitRepository default is 1m)
# Seconds one fetch may take before it counts as failed (--git-timeout, git.timeout): Flux's
# GitRepository spec.timeout default. The fetch holds git.lock this long, not the pass
# lock: passes go on meanwhile on the commit applied (a --once waits for it, to fetch).
DEFAULT_TIMEOUT = 60.0


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
    # a whole ref, as Flux's ref.name and Argo CD's targetRevision take it: its name
    branch = branch.removeprefix("refs/heads/") if branch else branch
    tag = tag.removeprefix("refs/tags/") if tag else tag
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
