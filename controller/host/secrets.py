"""spec.envFrom's values, read on this node (DESIGN.md "Secrets"): never on disk in the
clear, never in any output.

``file``: KEY=VALUE lines (dotenv quoting), refused unless only its owner can read it.
``sopsFile``: decrypted by the real ``sops -d`` with the node's ``SOPS_AGE_KEY_FILE``
(inherited from reconcile's environment), its output read from a pipe, in memory
(``sops.py``); the key file is held to a secret file's rule. As root, every file must be
root's (the manifests' rule, handed in by the pass).

A key reconcile sets itself (``PORT``, ``CUDA_VISIBLE_DEVICES``: engineenv.py) is
refused as ``spec.env`` refuses it: the placement would replace its value without a word.
A :class:`SecretError` names the file and the ``envFrom`` item, never a value: not even
sops' own words, which may quote a line of the file. :func:`digest` is what the spec hash
takes in, so a changed value restarts the engine while the value stays here; keyed with
the state dir's secrets key (``store/config/secretkey.py``), so a record's hash lets no
one who reads it check a guess at a value.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from controller.core.digest import sha256_hex
from controller.core.manifest.engineenv import refusal
from controller.core.manifest.specs import DeploymentSpec, EnvFrom
from controller.host import sops

MAX_BYTES = 1 << 20  # a secrets file is small; a huge one is a mistake, not a secret
# A dotenv line: [export ]KEY=VALUE, the value bare, 'single' (literal) or "double"
# (with \n \" \\ escapes), a bare value ending at ' #' (a comment).
LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")
DOUBLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


class SecretError(ValueError):
    """An envFrom item that cannot be read: which item, the file, why, and what to do;
    ``on_node``: the fix is on this node (a ``file`` item's file, the age key, sops), not
    in the manifests (a sopsFile's content, its place beside the manifest)."""

    def __init__(
        self, index: int, message: str, *, on_node: bool = False, no_key: str = ""
    ) -> None:
        super().__init__(message)
        self.index = index
        self.on_node = on_node
        self.no_key = no_key  # a sopsFile no key here opens: why (sops.SopsError's)


@dataclass(frozen=True, slots=True)
class Unread:
    """A sopsFile `plan` did not decrypt, for want of the node's age key (a CI job, a
    laptop): its values are unknown here. ``path``: the file (one note per file);
    ``shown``: as the manifest wrote it; ``why``: which key is missing."""

    path: Path
    shown: str
    why: str


@dataclass(frozen=True, slots=True)
class _Stamp:
    """What identifies a file's content without reading it: a changed file is re-read."""

    path: str
    inode: int
    size: int
    mtime_ns: int
    key_file: str


# Decrypting costs a sops process; a daemon passes every few seconds: by path, the stamp
# the values were read at (one entry per file, replaced when the file changes).
_CACHE: dict[str, tuple[_Stamp, dict[str, str]]] = {}


# Why root must not trust a file (its owner, its mode), or None: the manifests' rule
# (store/sources/security.py), handed in by the pass, or None where it does not apply.
Untrusted = Callable[[Path], str | None]


def resolve(
    spec: DeploymentSpec,
    folder: Path,
    untrusted: Untrusted | None = None,
    unread: list[Unread] | None = None,
) -> dict[str, str]:
    """Every envFrom item's variables, later items winning (``folder``: the manifest's).

    ``untrusted``: as root, a file another user can write is refused as a manifest is:
    its variables reach a root engine (LD_PRELOAD alone runs that user's code as root),
    and anyone can encrypt a sopsFile for the node's public key.

    ``unread`` (`plan`'s, never a pass's): a sopsFile that passes every other check
    (validate's among them) but that no age key here opens is listed there and skipped,
    not an error: a CI job plans without the node's key."""
    env: dict[str, str] = {}
    for index, item in enumerate(spec.env_from):
        try:
            found = _read_item(item, folder, untrusted)
            _not_reconciles(found, item)
            env.update(found)
        except SecretError as exc:  # a ``file`` item's file is the node's, whatever failed
            if unread is not None and exc.no_key and item.sops_file is not None:
                path = (folder / item.sops_file).resolve()
                unread.append(Unread(path, item.sops_file, exc.no_key))
                continue
            on_node = exc.on_node or item.file is not None
            raise SecretError(index, str(exc), on_node=on_node) from None
    return env


def unread_notes(unread: Mapping[str, list[Unread]]) -> list[str]:
    """`plan`'s word on each sopsFile it did not decrypt, once per file, naming the
    deployments that read it: what was planned, and why (never a value: none was read)."""
    files: dict[Path, tuple[Unread, list[str]]] = {}
    for name, items in sorted(unread.items()):
        for item in items:
            files.setdefault(item.path, (item, []))[1].append(name)
    return [
        f"sopsFile {item.shown} ({', '.join(names)}): its values were not read here "
        f"({item.why}); planned as if unchanged: a pass on the node, with its key, reads them"
        for item, names in files.values()
    ]


def in_repository(spec: DeploymentSpec, folder: Path) -> None:
    """What `validate` checks of each sopsFile without the node's age key (a CI job has
    none): it is there, beside the manifest (``folder``), and stays in that folder. A
    SecretError names the item, as :func:`resolve`'s do."""
    for index, item in enumerate(spec.env_from):
        if item.sops_file is None:
            continue
        path, shown = folder / item.sops_file, f"sopsFile {item.sops_file}"
        try:
            _stays_inside(path, folder, shown)
            _stat(path, shown, where="beside the manifest")
        except SecretError as exc:
            raise SecretError(index, str(exc)) from None


def digest(env: Mapping[str, str], key: bytes) -> str:
    """HMAC-SHA256 under ``key`` over the sorted items: changes with any value, and
    without the key a guess at one (a short password) cannot be checked against it."""
    return hmac.new(key, _items(env), hashlib.sha256).hexdigest()


def unkeyed_digest(env: Mapping[str, str]) -> str:
    """What releases before the key recorded (sha256 over the sorted items): a record
    still holding it for today's values is given the keyed one, its engine kept."""
    return sha256_hex(_items(env))


def _items(env: Mapping[str, str]) -> bytes:
    return json.dumps(sorted(env.items())).encode()


def _read_item(item: EnvFrom, folder: Path, untrusted: Untrusted | None) -> dict[str, str]:
    if item.file is not None:
        path = Path(item.file)
        _private(path)
        _trusted(path, f"file {path}", untrusted)
        return _cached(path, lambda: parse_dotenv(_read(path), str(path)))
    assert item.sops_file is not None
    # Named as the manifest wrote it, from the manifest's folder (the error names the
    # manifest): a git source's checkout is no place its user knows.
    path, shown = folder / item.sops_file, f"sopsFile {item.sops_file}"
    _stays_inside(path, folder, shown)
    _stat(path, shown, where="beside the manifest")
    _trusted(path, shown, untrusted)
    _age_key_private(shown, untrusted)
    return _cached(path, lambda: parse_dotenv(_decrypt(path, shown), item.sops_file or ""))


def _stays_inside(path: Path, folder: Path, what: str) -> None:
    """A symlink (or a symlinked folder on the way) may not take a sopsFile out of its
    manifest's folder, as ``..`` may not (specs.py): a repository's link to ``/etc`` or to
    the node's home would have the node decrypt, or fail on, a file the repository does not
    hold. A link that stays inside (``current.env -> v2.env``, a ConfigMap's ``..data``) is
    followed."""
    real, top = path.resolve(), folder.resolve()
    if not real.is_relative_to(top):
        raise SecretError(
            0,
            f"{what} leaves the manifests folder (a symlink to a file outside it): keep the "
            "encrypted file itself beside the manifest",
        )


def _not_reconciles(found: Mapping[str, str], item: EnvFrom) -> None:
    """A file's keys are known only now: one reconcile sets itself (PORT, the device
    fence) is refused as in spec.env, since the placement would replace its value."""
    what = f"file {item.file}" if item.file is not None else f"sopsFile {item.sops_file}"
    for key, value in found.items():  # the value only compared, never said
        why = refusal(key, "that file", value)
        if why is not None:
            raise SecretError(0, f"{what} sets {key}: {why}")


def _age_key_private(what: str, untrusted: Untrusted | None) -> None:
    """The node's age key opens every sopsFile: held to a secret file's rule (only its
    owner reads it; as root, root's), as the API keys file and the TLS key are."""
    key = os.environ.get("SOPS_AGE_KEY_FILE")
    if not key or not os.path.isfile(key):
        return  # none, or missing: sops' failure says which (_why)
    mode = stat.S_IMODE(os.stat(key).st_mode)
    if mode & 0o077:
        raise SecretError(
            0,
            f"{what}: the age key file SOPS_AGE_KEY_FILE={key} can be read by others "
            f"(mode {mode:04o}), and it opens every secret: `chmod 600 {key}` (and if others "
            "could read it, make a new key and encrypt the secrets for it)",
            on_node=True,
        )
    reason = untrusted(Path(key)) if untrusted is not None else None
    if reason is not None:
        raise SecretError(
            0,
            f"{what}: the age key file SOPS_AGE_KEY_FILE={key} is {reason}, and its owner "
            f"reads every secret: `chown root {key}`",
            on_node=True,
        )


def _cached(path: Path, read: Callable[[], dict[str, str]]) -> dict[str, str]:
    st = path.stat()
    key = os.environ.get("SOPS_AGE_KEY_FILE", "")
    stamp = _Stamp(str(path), st.st_ino, st.st_size, st.st_mtime_ns, key)
    kept = _CACHE.get(stamp.path)
    if kept is not None and kept[0] == stamp:
        return dict(kept[1])
    found = read()
    _CACHE[stamp.path] = (stamp, found)
    return dict(found)


def _stat(path: Path, what: str, where: str = "on this node") -> os.stat_result:
    """``what``: the file in words (``file /etc/x``, ``sopsFile x.enc.env``)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SecretError(0, f"{what} does not exist {where}") from None
    except OSError as exc:
        raise SecretError(0, f"{what} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecretError(0, f"{what} is not a regular file")
    return st


def _trusted(path: Path, what: str, untrusted: Untrusted | None) -> None:
    reason = untrusted(path) if untrusted is not None else None
    if reason is not None:
        raise SecretError(
            0,
            f"{what} is {reason}: as root, whoever can write it sets the engine's environment "
            f"(LD_PRELOAD runs their code as root): `chown root {path}` and `chmod go-w {path}`",
            on_node=True,  # the file's owner and mode on this node
        )


def _private(path: Path) -> None:
    """0600 or refused: a secret others can read is no longer one (ssh refuses keys alike)."""
    mode = stat.S_IMODE(_stat(path, f"file {path}").st_mode)
    if mode & 0o077:
        raise SecretError(
            0,
            f"file {path} can be read by others (mode {mode:04o}): `chmod 600 {path}` "
            "(and rotate what it holds if others could read it)",
        )


def _read(path: Path) -> str:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SecretError(0, f"file {path} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise SecretError(0, f"file {path} is over {MAX_BYTES} bytes: not a secrets file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(0, f"file {path} is not UTF-8 text") from None


def _decrypt(path: Path, what: str) -> str:
    try:
        return sops.decrypt(path, what)
    except sops.SopsError as exc:
        raise SecretError(0, str(exc), on_node=exc.on_node, no_key=exc.no_key) from None


def parse_dotenv(text: str, where: str) -> dict[str, str]:
    """KEY=VALUE lines: comments, blank lines, ``export``, 'single' and "double" quotes.

    An error names the line number, never its text (the text is the secret).
    """
    env: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        number = i + 1
        row = lines[i]
        i += 1
        if not row.strip() or row.lstrip().startswith("#"):
            continue
        match = LINE.match(row)
        if match is None:
            raise SecretError(0, f"{where}:{number}: not a KEY=VALUE line")
        key, raw = match.group(1), match.group(2)
        while _open_quote(raw) and i < len(lines):  # a quoted value across lines
            raw += "\n" + lines[i]
            i += 1
        env[key] = _value(raw, f"{where}:{number}")
    return env


def _open_quote(raw: str) -> bool:
    if not raw or raw[0] not in "'\"":
        return False
    body = raw[1:]
    if raw[0] == "'":
        return "'" not in body
    return re.search(r'(?<!\\)(?:\\\\)*"', body) is None


def _value(raw: str, where: str) -> str:
    if raw[:1] == "'":
        end = raw.find("'", 1)
        return _after(raw, end, where, raw[1:end])
    if raw[:1] == '"':
        match = re.match(r'"((?:[^"\\]|\\.)*)"', raw, re.DOTALL)
        if match is None:
            raise SecretError(0, f"{where}: a double quote is not closed")
        body = re.sub(r"\\(.)", lambda m: DOUBLE_ESCAPES.get(m[1], "\\" + m[1]), match[1])
        return _after(raw, match.end() - 1, where, body)
    return re.split(r"\s+#", raw, maxsplit=1)[0].rstrip()


def _after(raw: str, end: int, where: str, value: str) -> str:
    """A quoted value: only a comment may follow its closing quote."""
    if end < 0:
        raise SecretError(0, f"{where}: a single quote is not closed")
    rest = raw[end + 1 :].strip()
    if rest and not rest.startswith("#"):
        raise SecretError(0, f"{where}: text after the closing quote")
    return value
