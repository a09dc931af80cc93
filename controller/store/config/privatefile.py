"""A state dir's private file: a random secret only its owner reads (0600).

The access token and the secrets key (``accesstoken.py``, ``secretkey.py``) are both one
line of random text that the daemon, a pass or a gateway makes when it is missing, never
replacing one another process made meanwhile (tmp + fsync + link), and that is refused
when others could read it or another user owns it: what it guards is then no longer
guarded. :class:`PrivateFile` is that rule, once; each file says what it is and what
removing it costs (the next move its errors name).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controller.errors import ConfigError
from controller.store.documents import fsync_dir


class PrivateFileError(ConfigError):
    """The file cannot be trusted or read: the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class PrivateFile:
    path: Path
    what: str  # "access token": how its errors name it
    remedy: str  # what removing it does: "the daemon makes a new one at start"
    # False for a file others may read but never change nor replace (the state dir's id,
    # which every engine's environment carries): its errors say to chmod or chown it,
    # since removing it loses what it holds.
    secret: bool = True

    def read(self) -> str:
        """Its text; FileNotFoundError when there is none yet, PrivateFileError when it is
        unsafe or unreadable (the message names the file and the next move)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise PrivateFileError(self._unreadable(exc)) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):  # a folder by hand: os.read named no file
                raise PrivateFileError(
                    f"{self.what} {self.path} is not a file: remove it ({self.remedy})"
                )
            self._check(info)
            text = os.read(fd, 4096).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        if not text:
            raise PrivateFileError(f"{self.what} {self.path} is empty: remove it ({self.remedy})")
        return text

    def peek(self) -> str | None:
        """Its text, or None when there is none yet (a reader that must make nothing)."""
        with contextlib.suppress(FileNotFoundError):
            return self.read()
        return None

    def ensure(self, make: Callable[[], str]) -> str:
        """Its text, made first with ``make()`` when there is none."""
        with contextlib.suppress(FileNotFoundError):
            return self.read()
        where = self.path
        tmp = where.with_name(f".{where.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a writer of this pid that died before its link
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (make() + "\n").encode())
            os.fsync(fd)
        except OSError as exc:  # a full disk: the file named (a write's error names none)
            tmp.unlink()
            raise OSError(exc.errno, exc.strerror, str(where)) from exc
        finally:
            os.close(fd)
        try:
            os.link(tmp, where)  # never replaces one another process made meanwhile
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        fsync_dir(where.parent)
        return self.read()

    def _check(self, info: os.stat_result) -> None:
        mode = stat.S_IMODE(info.st_mode)
        if not self.secret:
            self._check_kept(info.st_uid, mode)
            return
        if info.st_uid != os.geteuid():
            raise PrivateFileError(
                f"{self.what} {self.path} is owned by uid {info.st_uid}, not this user "
                f"({os.geteuid()}): remove it ({self.remedy})"
            )
        if mode & 0o077:
            raise PrivateFileError(
                f"{self.what} {self.path} has mode {mode:04o}: others could read it. Remove "
                f"it ({self.remedy}; the old one is then refused)"
            )

    def _check_kept(self, uid: int, mode: int) -> None:
        """A file that is no secret: refused only when another user may change it."""
        keep = f"do not remove it: {self.remedy}"
        if uid != os.geteuid():
            raise PrivateFileError(
                f"{self.what} {self.path} is owned by uid {uid}, not this user "
                f"({os.geteuid()}): run `chown {os.geteuid()} {self.path}` as root ({keep})"
            )
        if mode & 0o022:
            raise PrivateFileError(
                f"{self.what} {self.path} has mode {mode:04o}: others could change it. Run "
                f"`chmod 600 {self.path}` ({keep})"
            )

    def _unreadable(self, exc: OSError) -> str:
        if isinstance(exc, PermissionError):
            return (
                f"cannot read the {self.what} {self.path}: only the state dir's owner may "
                "(run this as that user)"
            )
        return f"cannot read the {self.what} {self.path}: {exc.strerror or exc}"
