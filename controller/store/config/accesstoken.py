"""The state dir's access token: ``<state>/access-token`` (0600).

Loopback is not "only me" on a shared GPU box: another local user reaches a gateway or a
``/metrics`` bound to 127.0.0.1 as easily as its owner does. So, as Jupyter does, what
only the state dir's owner may see or do over HTTP wants a token that only the owner
can read: the web page's data and actions (``/ui/api/...``) on a gateway without API
keys, and the daemon's ``/metrics`` always. ``reconcile ui`` prints the page's URL with
it (``?token=T``).

The daemon and the gateway make it at start when it is missing (a secrets-grade random
value), never replacing one another process made meanwhile (tmp + fsync + link). A token
file that others could read, or that another user owns, is refused (remove it: the next
start makes a new one). The token itself is never logged, shown in an event or a status.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from controller.errors import ConfigError
from controller.store.documents import fsync_dir
from controller.store.statedir import StateDir

QUERY = "token"  # the query parameter that carries it (the page's URL, Prometheus' params)


class TokenError(ConfigError):
    """The token file cannot be trusted or read: the message says which and what to do."""


def path(state_dir: Path) -> Path:
    return StateDir(state_dir).access_token


def read(state_dir: Path) -> str:
    """The token; FileNotFoundError when there is none yet, TokenError when it is unsafe
    or unreadable (the message names the file and the next move)."""
    where = path(state_dir)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise TokenError(_unreadable(where, exc)) from None
    try:
        info = os.fstat(fd)
        _check(where, info)
        text = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not text:
        raise TokenError(f"access token {where} is empty: remove it (the daemon makes a new one)")
    return text


def ensure(state_dir: Path) -> str:
    """The token, made first when there is none."""
    with contextlib.suppress(FileNotFoundError):
        return read(state_dir)
    where = path(state_dir)
    tmp = where.with_name(f".{where.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a writer of this pid that died before its link
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (secrets.token_urlsafe(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, where)  # never replaces a token another process made meanwhile
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    fsync_dir(state_dir)
    return read(state_dir)


def matches(presented: str | None, token: str) -> bool:
    """Constant-time comparison (a token is a secret as a key is)."""
    return bool(presented) and hmac.compare_digest((presented or "").encode(), token.encode())


@dataclass
class Token:
    """The token as a server checks it: re-read only when the file changed (a removed
    file is made again, so a server outliving its daemon keeps a token to ask for)."""

    state_dir: Path
    _stamp: tuple[int, int, int] | None = None
    _value: str = field(default="", repr=False)

    def current(self) -> str:
        try:
            info = os.stat(path(self.state_dir))
        except FileNotFoundError:
            self._stamp = None
            return self._remember(ensure(self.state_dir))
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp != self._stamp:
            self._value = read(self.state_dir)
            self._stamp = stamp
        return self._value

    def _remember(self, value: str) -> str:
        self._value = value
        return value

    def accepts(self, presented: str | None) -> bool:
        """Whether ``presented`` is the token; an unreadable token file accepts nothing."""
        try:
            return matches(presented, self.current())
        except (OSError, ConfigError):
            return False


def _check(where: Path, info: os.stat_result) -> None:
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid():
        raise TokenError(
            f"access token {where} is owned by uid {info.st_uid}, not this user "
            f"({os.geteuid()}): remove it (the daemon makes a new one at start)"
        )
    if mode & 0o077:
        raise TokenError(
            f"access token {where} has mode {mode:04o}: others could read it. Remove it "
            "(the daemon makes a new one at start; the old one is then refused)"
        )


def _unreadable(where: Path, exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return (
            f"cannot read the access token {where}: only the state dir's owner may "
            "(run this as that user)"
        )
    return f"cannot read the access token {where}: {exc.strerror or exc}"
