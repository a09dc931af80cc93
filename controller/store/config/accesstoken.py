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

import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from controller.errors import ConfigError
from controller.store.config.privatefile import PrivateFile
from controller.store.statedir import StateDir

QUERY = "token"  # the query parameter that carries it (the page's URL, Prometheus' params)
REMEDY = "the daemon makes a new one at start"


def path(state_dir: Path) -> Path:
    return StateDir(state_dir).access_token


def _file(state_dir: Path) -> PrivateFile:
    return PrivateFile(path(state_dir), "access token", REMEDY)


def read(state_dir: Path) -> str:
    """The token; FileNotFoundError when there is none yet, PrivateFileError when it is
    unsafe or unreadable (the message names the file and the next move)."""
    return _file(state_dir).read()


def ensure(state_dir: Path) -> str:
    """The token, made first when there is none."""
    return _file(state_dir).ensure(lambda: secrets.token_urlsafe(32))


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
